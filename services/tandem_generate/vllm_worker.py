"""vLLM's CPU worker, with seeded sampling that survives a prefill split across steps.

When a prefill is split, the worker still samples a token for the unfinished request in each
step but the first-to-last, throws it away, and rewinds the request's seeded generator by its
Philox offset so the seed's stream goes on as if that draw never happened
(``GPUModelRunner._bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``). A CPU
``torch.Generator`` has no offset: the rewind raises "CPU Generator does not use offset" and the
engine core dies, taking every request with it (``vllm serve`` on the CPU build does the same).

Generate keeps prefills whole on CPU where the model allows it, but a hybrid model (conv or
Mamba state beside attention) with prefix caching needs chunked prefill: its state is cached
block by block, which only split prefills feed. For those engines this worker's model runner
rewinds a CPU generator the way a CPU generator can be rewound: its state is kept before the
step's draw and put back after it, and vLLM's offset rewind skips it. The seed's tokens are
those of an unsplit prefill, and the engine lives.

The engine core's workers import this module by name (``worker_cls``), in their own processes.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

__all__ = [
    "SeedSafeCPUModelRunner",
    "SeedSafeCPUWorker",
    "discarded_generators",
    "seed_safe_worker",
]


class SeedSafeCPUModelRunner(CPUModelRunner):
    """vLLM's CPU model runner; a seeded request's discarded draw is undone by restoring its
    generator's state instead of rewinding an offset a CPU generator does not have."""

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> Any:
        held = discarded_generators(self)
        states = {i: g.get_state() for i, g in held.items()}
        try:
            return super()._sample(logits, spec_decode_metadata)
        finally:
            for i, state in states.items():
                held[i].set_state(state)  # as if this step had not drawn

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        held = discarded_generators(self)  # their draws are undone already (``_sample``)
        for i in held:
            del generators[i]
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            generators.update(held)


class SeedSafeCPUWorker(CPUWorker):
    """vLLM's CPU worker running ``SeedSafeCPUModelRunner`` (vLLM's model runner V2, which
    has its own sampler, is left as it is)."""

    def init_device(self) -> None:
        super().init_device()  # type: ignore[no-untyped-call]  # unannotated upstream
        if type(self.model_runner) is CPUModelRunner:
            # Built by vLLM's own init_device (with the distributed state it sets up first);
            # the subclass adds methods only, so the instance is the same object, retyped.
            self.model_runner.__class__ = SeedSafeCPUModelRunner


def discarded_generators(runner: CPUModelRunner) -> dict[int, torch.Generator]:
    """The seeded rows of the runner's step whose sampled token is thrown away (a prefill
    that goes on in the next step). A function, not a method: the runner's own names are
    vLLM's."""
    n = runner.input_batch.num_reqs
    discard = runner.discard_request_mask.np[:n]
    return {i: g for i, g in runner.input_batch.generators.items() if i < n and discard[i]}


def seed_safe_worker() -> str:
    """The qualified name the engine's workers resolve (a name: the config crosses processes)."""
    return f"{SeedSafeCPUWorker.__module__}.{SeedSafeCPUWorker.__qualname__}"

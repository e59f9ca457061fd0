"""What ``EngineControl`` asks vLLM's engine, in order, for the weight-update steps, up to the
engine's calls (the GPU backends, NCCL and IPC, cannot run here): a spy stands where vLLM's
``AsyncLLM`` is, and the node's own record (``/weight_info``) is read back.

- A finish freezes the engine (``keep``) around load, cache resets and relabel, and resumes it
  only if no caller had paused it.
- An abort after a start, on a backend that loads in place, finishes with no chunk (vLLM's
  finalize is what puts the kernel tensors back after ``initialize_layerwise_reload``); with
  chunks it finishes too and the node is unclean until every tensor is written again.
- A prefix cache that will not reset leaves the node unclean until a reset succeeds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tandem_generate.control import EngineControl
from tandem_generate.errors import PrefixCacheNotReset
from tandem_generate.weight_files import checkpoint_spec

pytestmark = pytest.mark.anyio


class SpyLLM:
    """Records every engine call; ``reset_ok`` is what ``reset_prefix_cache`` answers."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.paused = False
        self.reset_ok = True
        self.version = "default"

    async def is_paused(self) -> bool:
        return self.paused

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.calls.append(("pause", mode))
        self.paused = True

    async def resume_generation(self) -> None:
        self.calls.append(("resume",))
        self.paused = False

    async def start_weight_update(self) -> None:
        self.calls.append(("start",))

    async def update_weights(self, request) -> None:
        self.calls.append(("chunk", tuple(request.update_info.get("names", ()))))
        if request.update_info.get("fail"):
            raise RuntimeError("the broadcast failed")

    async def finish_weight_update(self, weight_version=None) -> None:
        self.calls.append(("finish", weight_version))
        if weight_version is not None:
            self.version = weight_version

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset_prefix", reset_running_requests))
        return self.reset_ok

    async def reset_encoder_cache(self) -> None:
        self.calls.append(("reset_encoder",))

    async def get_weight_version(self) -> str:
        return self.version


def control(model_dir: str, backend: str) -> tuple[EngineControl, SpyLLM]:
    llm = SpyLLM()
    engine = SimpleNamespace(
        llm=llm,
        vllm_config=SimpleNamespace(weight_transfer_config=SimpleNamespace(backend=backend)),
        model_config=SimpleNamespace(
            model=model_dir, revision=None, served_model_name=model_dir, dtype="bfloat16"
        ),
    )
    return EngineControl(engine, None), llm  # type: ignore[arg-type]


def chunk(names: list[str], fail: bool = False) -> dict:
    # vLLM's NCCL chunk names its tensors; the rest of its fields do not matter to the spy.
    return {"names": names, "dtype_names": ["bfloat16"] * len(names), "fail": fail}


async def test_a_finish_freezes_the_engine_around_load_reset_and_relabel(qwen2_dir):
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update()
    await ctl.update(chunk(["lm_head.weight"]))
    before = (await ctl.weight_info()).weights_id
    llm.calls.clear()
    await ctl.finish_update("step-1")
    assert llm.calls == [
        ("pause", "keep"),
        ("finish", "step-1"),
        ("reset_prefix", False),
        ("reset_encoder",),
        ("resume",),
    ]
    info = await ctl.weight_info()
    assert (info.weight_version, info.update_seq, info.unclean) == ("step-1", 1, None)
    assert info.weights_id != before


async def test_a_finish_leaves_a_callers_pause_alone(qwen2_dir):
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.pause("keep", clear_cache=False)
    await ctl.start_update()
    llm.calls.clear()
    await ctl.finish_update(None)
    assert ("resume",) not in llm.calls and ("pause", "keep") not in llm.calls
    assert llm.paused


async def test_an_abort_with_no_chunk_on_nccl_finishes_so_the_kernel_tensors_come_back(qwen2_dir):
    ctl, llm = control(qwen2_dir, "nccl")
    held = (await ctl.weight_info()).weights_id
    await ctl.start_update()
    llm.calls.clear()
    assert await ctl.abort_update() is True
    assert llm.calls == [("pause", "keep"), ("finish", None), ("resume",)]
    info = await ctl.weight_info()
    assert (info.weights_id, info.unclean, info.updating, info.update_seq) == (held, None, False, 0)


async def test_an_abort_after_chunks_on_nccl_leaves_the_node_unclean_until_all_is_written(
    qwen2_dir,
):
    names = sorted(checkpoint_spec(qwen2_dir))
    ctl, llm = control(qwen2_dir, "ipc")
    await ctl.start_update()
    await ctl.update(chunk(["lm_head.weight"]))
    llm.calls.clear()
    await ctl.abort_update()
    assert [c[0] for c in llm.calls] == [
        "pause",
        "finish",
        "reset_prefix",
        "reset_encoder",
        "resume",
    ]
    info = await ctl.weight_info()
    assert (info.unclean, info.unwritten) == ("partial_load", len(names))
    # Half of the tensors written again: still unclean; the rest too: clean.
    for part in (names[: len(names) // 2], names[len(names) // 2 :]):
        await ctl.start_update()
        await ctl.update(chunk(part))
        await ctl.finish_update(None)
    assert (await ctl.weight_info()).unclean is None


async def test_a_chunk_that_fails_on_nccl_leaves_the_node_unclean(qwen2_dir):
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update()
    with pytest.raises(RuntimeError):
        await ctl.update(chunk(["lm_head.weight"], fail=True))
    info = await ctl.weight_info()
    assert (info.unclean, info.updating) == ("partial_load", False)


async def test_a_prefix_cache_that_does_not_reset_leaves_the_node_unclean_until_one_does(
    qwen2_dir, monkeypatch
):
    monkeypatch.setattr("tandem_generate.control.RESET_BACKOFF_S", 0.0)
    ctl, llm = control(qwen2_dir, "nccl")
    llm.reset_ok = False
    await ctl.start_update()
    with pytest.raises(PrefixCacheNotReset):
        await ctl.finish_update("step-1")
    assert (await ctl.weight_info()).unclean == "prefix_cache_not_reset"
    assert llm.calls[-1] == ("resume",)  # the engine is not left frozen
    assert await ctl.reset_prefix_cache() is False
    assert (await ctl.weight_info()).unclean == "prefix_cache_not_reset"
    llm.reset_ok = True
    assert await ctl.reset_prefix_cache() is True
    assert (await ctl.weight_info()).unclean is None


async def test_the_update_id_a_router_sends_is_the_one_recorded(qwen2_dir):
    from tandem_wire.control import UpdateId

    ctl, llm = control(qwen2_dir, "nccl")
    uid = await ctl.start_update(UpdateId(41, "9f3c1a2b"))
    await ctl.finish_update(None)
    info = await ctl.weight_info()
    assert (str(uid), info.update_seq, info.seen_seq, info.applied_seqs) == (
        "41-9f3c1a2b",
        41,
        41,
        [41],
    )
    # Without one, the node mints the next.
    assert (await ctl.start_update()).seq == 42

"""What ``EngineControl`` asks vLLM's engine, in order, for the weight-update steps, up to the
engine's calls (the GPU backends, NCCL and IPC, cannot run here): a spy stands where vLLM's
``AsyncLLM`` is, and the node's own record (``/weight_info``) is read back.

- A finish freezes the engine (``keep``) around load, cache resets and relabel, and resumes it
  only if no caller had paused it.
- An abort after a start, on a backend that loads in place, finishes with no chunk (vLLM's
  finalize is what puts the kernel tensors back after ``initialize_layerwise_reload``); with
  chunks it finishes too and the node is unclean until every tensor is written again.
- A prefix cache that will not reset leaves the node unclean until a reset succeeds; a partial
  load stays unclean through any reset, until every tensor is written again.
- A failed finalize leaves the node unclean, whatever it was finishing or aborting.
- A ``/resume`` while a finish holds the engine frozen waits until the caches are reset.
- ``/weight_info`` answers while a finish loads (the engine's own answers wait for the load).
- A finish is refused (and the update ended) when the node took other chunks than the caller
  sent; an update its trainer left is ended by a newer one's start, or once idle too long."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tandem_generate.control import EngineControl
from tandem_generate.errors import (
    PrefixCacheNotReset,
    WeightUpdateConflict,
    WeightUpdateIncomplete,
    WeightUpdateSeqSeen,
)
from tandem_generate.weight_files import checkpoint_spec

pytestmark = pytest.mark.anyio


class SpyLLM:
    """Records every engine call; ``reset_ok`` is what ``reset_prefix_cache`` answers."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.paused = False
        self.reset_ok = True
        self.version = "default"
        self.finish_fails = False
        self.finishing = asyncio.Event()
        """Set once a finish is under way (the load); it ends when ``let_finish`` is set."""
        self.let_finish: asyncio.Event | None = None
        self.paused_at_reset: list[bool] = []
        self.between_loads = asyncio.Event()
        """Clear while a load runs: vLLM's engine core answers its other calls (the pause
        state, the label) between its collective calls, so those wait for it."""
        self.between_loads.set()

    async def is_paused(self) -> bool:
        await self.between_loads.wait()
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
        self.finishing.set()
        self.between_loads.clear()
        try:
            if self.let_finish is not None:
                await self.let_finish.wait()
        finally:
            self.between_loads.set()
        if self.finish_fails:
            raise RuntimeError("finalize failed")
        if weight_version is not None:
            self.version = weight_version

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset_prefix", reset_running_requests))
        self.paused_at_reset.append(self.paused)
        return self.reset_ok

    async def reset_encoder_cache(self) -> None:
        self.calls.append(("reset_encoder",))

    async def get_weight_version(self) -> str:
        await self.between_loads.wait()
        return self.version

    async def update_weight_version(self, new_version: str) -> None:
        self.calls.append(("relabel", new_version))
        self.version = new_version


def control(
    model_dir: str, backend: str, update_idle_timeout_s: float = 300.0
) -> tuple[EngineControl, SpyLLM]:
    llm = SpyLLM()
    engine = SimpleNamespace(
        llm=llm,
        vllm_config=SimpleNamespace(weight_transfer_config=SimpleNamespace(backend=backend)),
        model_config=SimpleNamespace(
            model=model_dir, revision=None, served_model_name=model_dir, dtype="bfloat16"
        ),
    )
    return EngineControl(engine, None, update_idle_timeout_s), llm  # type: ignore[arg-type]


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


async def test_a_partial_load_stays_unclean_through_a_cache_reset(qwen2_dir, monkeypatch):
    # A chunk fails mid-broadcast (partial load); the next update writes one tensor and its
    # prefix cache will not reset; then a reset succeeds: the other tensors are still unwritten.
    monkeypatch.setattr("tandem_generate.control.RESET_BACKOFF_S", 0.0)
    names = sorted(checkpoint_spec(qwen2_dir))
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update()
    with pytest.raises(RuntimeError):
        await ctl.update(chunk(["lm_head.weight"], fail=True))
    llm.reset_ok = False
    await ctl.start_update()
    await ctl.update(chunk(["lm_head.weight"]))
    with pytest.raises(PrefixCacheNotReset):
        await ctl.finish_update(None)
    assert (await ctl.weight_info()).unclean == "partial_load"
    llm.reset_ok = True
    assert await ctl.reset_prefix_cache() is True
    info = await ctl.weight_info()
    assert (info.unclean, info.unwritten) == ("partial_load", len(names) - 1)
    # Every other tensor written again: whole, and the cache was reset by that finish.
    await ctl.start_update()
    await ctl.update(chunk([n for n in names if n != "lm_head.weight"]))
    await ctl.finish_update(None)
    assert (await ctl.weight_info()).unclean is None


async def test_an_abort_whose_finalize_fails_on_nccl_leaves_the_node_unclean(qwen2_dir):
    # No chunk arrived, but vLLM's finalize (which puts the kernel tensors back) failed: what
    # the model holds is not known.
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update()
    llm.finish_fails = True
    with pytest.raises(RuntimeError):
        await ctl.abort_update()
    info = await ctl.weight_info()
    assert (info.unclean, info.updating) == ("partial_load", False)
    assert not llm.paused  # not left frozen


async def test_a_resume_during_a_finish_waits_until_the_caches_are_reset(qwen2_dir):
    # TRL's sequence with the door's fan-out: pause(keep), start, chunk, finish, resume; the
    # resume reaches this node while its finish is still loading.
    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.pause("keep", clear_cache=False)
    await ctl.start_update()
    await ctl.update(chunk(["lm_head.weight"]))
    llm.let_finish = asyncio.Event()
    finishing = asyncio.ensure_future(ctl.finish_update("step-1"))
    await llm.finishing.wait()
    resuming = asyncio.ensure_future(ctl.resume())
    for _ in range(50):  # event-loop turns, not time: the resume runs as far as it may
        await asyncio.sleep(0)
    llm.let_finish.set()
    await asyncio.gather(finishing, resuming)
    # No request ran between the load and the cache reset: the engine was frozen at the reset.
    assert llm.paused_at_reset == [True]
    assert llm.calls[-1] == ("resume",) and not llm.paused  # the caller's resume holds after


async def test_weight_info_answers_while_a_finish_loads(qwen2_dir):
    # The door's poll reaches the node mid-load: the engine would answer its calls only once
    # the load ends, and a load longer than the poll's timeout would cool the node down.
    ctl, llm = control(qwen2_dir, "nccl")
    assert (await ctl.weight_info()).weight_version == "default"
    await ctl.start_update()
    await ctl.update(chunk(["lm_head.weight"]))
    llm.let_finish = asyncio.Event()
    finishing = asyncio.ensure_future(ctl.finish_update("step-1"))
    await llm.finishing.wait()
    try:
        during = await asyncio.wait_for(ctl.weight_info(), 10)
    finally:
        llm.let_finish.set()
        await finishing
    assert (during.weight_version, during.paused, during.updating) == ("default", True, True)
    after = await ctl.weight_info()
    assert (after.weight_version, after.paused, after.updating) == ("step-1", False, False)
    await ctl.set_version("step-1b")
    assert (await ctl.weight_info()).weight_version == llm.version == "step-1b"


async def test_a_finish_is_refused_when_the_node_took_other_chunks_than_the_caller_sent(
    qwen2_dir,
):
    from tandem_wire.control import UpdateId, UpdateReceipt

    ctl, llm = control(qwen2_dir, "nccl")
    uid = await ctl.start_update(UpdateId(1, "9f3c1a2b"))
    first, second = chunk(["model.embed_tokens.weight"]), chunk(["lm_head.weight"])
    sent = UpdateReceipt.begin(uid).took(first).took(second)
    await ctl.update(second)  # the first chunk (and its abort) never reached this node
    with pytest.raises(WeightUpdateIncomplete):
        await ctl.finish_update(None, sent.header())
    info = await ctl.weight_info()
    # The update is ended, not loaded: what NCCL wrote in place leaves the node unclean.
    assert (info.updating, info.update_seq, info.unclean) == (False, 0, "partial_load")
    # The caller's own receipt, when it matches, finishes.
    uid = await ctl.start_update(UpdateId(2, "9f3c1a2c"))
    await ctl.update(first)
    await ctl.finish_update(None, UpdateReceipt.begin(uid).took(first).header())
    assert (await ctl.weight_info()).update_seq == 2


async def test_an_update_its_trainer_left_is_ended_by_a_newer_ones_start(qwen2_dir):
    from tandem_wire.control import UpdateId

    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update(UpdateId(3, "aaaaaaaa"))
    await ctl.update(chunk(["lm_head.weight"]))
    # The trainer crashed here. A start with no id, or one not newer, is still refused (one
    # with the same SEQ as another router's: the router mints again above it).
    with pytest.raises(WeightUpdateConflict):
        await ctl.start_update()
    with pytest.raises(WeightUpdateSeqSeen):
        await ctl.start_update(UpdateId(3, "bbbbbbbb"))
    llm.calls.clear()
    assert (await ctl.start_update(UpdateId(4, "cccccccc"))).seq == 4
    # The left update was ended as an abort ends it, then the new one started.
    assert [c[0] for c in llm.calls] == [
        "pause",
        "finish",
        "reset_prefix",
        "reset_encoder",
        "resume",
        "start",
    ]
    info = await ctl.weight_info()
    assert (info.updating, info.seen_seq, info.unclean) == (True, 4, "partial_load")


async def test_an_update_left_idle_past_the_timeout_ends_by_itself(qwen2_dir):
    ctl, llm = control(qwen2_dir, "nccl", update_idle_timeout_s=0.05)
    await ctl.start_update()
    for _ in range(600):  # the timer's doing, not this loop's: it only waits for it
        if not (await ctl.weight_info()).updating:
            break
        await asyncio.sleep(0.05)
    assert not (await ctl.weight_info()).updating
    assert ("finish", None) in llm.calls  # ended as an abort ends it
    await ctl.start_update()  # and a new trainer's start is taken


async def test_a_start_with_a_seq_the_node_has_seen_is_refused_and_starts_nothing(qwen2_dir):
    from tandem_wire.control import UpdateId

    ctl, llm = control(qwen2_dir, "nccl")
    await ctl.start_update(UpdateId(5, "9f3c1a2b"))
    await ctl.abort_update()
    calls = len(llm.calls)
    # Another router minted SEQ 5 from a stale count, or an older one.
    for seq in (5, 4):
        with pytest.raises(WeightUpdateSeqSeen) as refused:
            await ctl.start_update(UpdateId(seq, "0a0b0c0d"))
        assert refused.value.status_code == 409 and refused.value.details == {"seen_seq": 5}
    info = await ctl.weight_info()
    assert (info.updating, info.seen_seq, len(llm.calls)) == (False, 5, calls)
    assert (await ctl.start_update(UpdateId(6, "0a0b0c0d"))).seq == 6

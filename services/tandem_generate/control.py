"""The engine's control surface for RL trainers: pause/resume and weight updates.

The vLLM adapter behind the control routes: each call is the ``AsyncLLM`` method vLLM 0.32's
own RL router (``vllm/entrypoints/rl/online/api_router.py``) calls, with the refusals a caller
should see as typed 4xx made here, before anything reaches the engine: calls out of order,
no weight-transfer backend, and for the ``tandem_file`` backend a path outside the folder or a
file whose tensors the model does not take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pydantic
from vllm.config import VllmConfig
from vllm.distributed.weight_transfer.base import (
    WeightTransferInitRequest,
    WeightTransferUpdateRequest,
)

from tandem_http import BadRequest
from tandem_wire.control import UpdateId, WeightInfo, WeightTransferState

from .engine import Engine
from .errors import (
    InvalidWeightUpdate,
    PrefixCacheNotReset,
    WeightCheckpointUnavailable,
    WeightPathNotAllowed,
    WeightTransferNotConfigured,
    WeightUpdateConflict,
    WeightUpdateIncomplete,
    WeightUpdateSeqSeen,
)
from .weight_files import (
    ABORT_UPDATE,
    BACKEND,
    TensorSpec,
    WeightFileRefused,
    check_update,
    checkpoint_spec,
    confine,
    model_folder,
    read_header,
)
from .weight_ledger import WeightLedger

__all__ = ["EngineControl", "PAUSE_MODES"]

PAUSE_MODES = ("abort", "wait", "keep")
"""vLLM 0.32's ``PauseMode`` values."""

log = logging.getLogger("tandem.generate")

_CONFIG_JSON = pydantic.TypeAdapter(VllmConfig)

_SECRET_NAME = re.compile(
    r"(^|_)(token|secret|password|passwd|api_key|apikey|credentials?|access_key|private_key)$",
    re.IGNORECASE,
)
"""Config fields that hold a secret (``ModelConfig.hf_token``, a key in a connector's config)."""
_OPAQUE_NAME = re.compile(r"_extra_config$")
"""Free-form settings (``model_loader_extra_config``, ``kv_connector_extra_config``...):
whatever they hold may be a credential (an object store's keys), in whatever shape (a loader's
config object is dumped as its ``repr``)."""
_LOADER_OR_CONNECTOR = frozenset({"load_config", "kv_transfer_config", "ec_transfer_config"})
"""Sections configuring a loader or connector: every dict-valued field in them is opaque too."""
REDACTED = "<redacted>"


def scrubbed(value: Any, opaque_dicts: bool = False) -> Any:
    """A JSON config dump with every secret replaced by ``REDACTED`` (a field named like one,
    free-form settings whole, and any dict-valued field of a loader's or connector's section):
    ``/server_info`` answers any inference key, and vLLM itself serves its config only in dev
    mode."""
    if isinstance(value, dict):
        return {k: _scrubbed_field(str(k), v, opaque_dicts) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


def _scrubbed_field(name: str, value: Any, opaque_dicts: bool) -> Any:
    if value in (None, {}, ""):
        return value
    if (
        _OPAQUE_NAME.search(name)
        or _SECRET_NAME.search(name)
        or (opaque_dicts and isinstance(value, dict))
    ):
        return REDACTED
    return scrubbed(value, name in _LOADER_OR_CONNECTOR)


RESET_ATTEMPTS = 5
"""Tries at resetting the prefix cache after an update before answering that it did not."""
RESET_BACKOFF_S = 0.2


class EngineControl:
    """Pause, resume and weight updates on one engine; one per process (it tracks whether an
    update is under way, as vLLM's worker does, to refuse calls out of order up front)."""

    def __init__(
        self, engine: Engine, weight_dir: str | None, update_idle_timeout_s: float = 300.0
    ) -> None:
        self.engine = engine
        self.llm = engine.llm
        self.weight_dir = weight_dir
        wt = engine.vllm_config.weight_transfer_config
        self.backend: str | None = None if wt is None else str(wt.backend)
        self._lock = asyncio.Lock()  # one weight call at a time: they change shared state
        self._freeze = asyncio.Lock()
        """Held while a step keeps the engine frozen, and by /pause and /resume: a resume
        during a finish would let requests run between the load and the cache reset."""
        self.update_idle_timeout_s = update_idle_timeout_s
        """An update with no step for this long is ended (its trainer is gone); 0: never."""
        self._last_step = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._expiring: asyncio.Task[None] | None = None
        self._spec: dict[str, TensorSpec] | None = None
        self._transfer_ready = False
        """A collective backend joined the trainer's group (``/init_weight_transfer_engine``)."""
        self._caller_paused = False
        """A caller paused the engine (``/pause``): a finish leaves it paused."""
        self._paused = False
        """Whether the engine is paused, as this process left it (every pause and resume of
        the engine goes through here): ``/weight_info`` answers from it and from ``_label``
        without asking the engine, whose answers wait behind a chunk's or a finish's load."""
        self._label: str | None = None
        """vLLM's ``weight_version`` as this process last set or read it (None: not known)."""
        mc = engine.model_config
        # Nodes of one fleet serve one checkpoint under one name (their weights start equal).
        served = mc.served_model_name
        name = served[0] if isinstance(served, list) else served or mc.model
        self.ledger = WeightLedger(f"{name}@{mc.revision or ''}", self._names)

    # -- pause -------------------------------------------------------------------------------

    async def pause(self, mode: str, clear_cache: bool) -> None:
        if mode not in PAUSE_MODES:
            raise BadRequest(f"mode must be one of {', '.join(PAUSE_MODES)}", param="mode")
        async with self._freeze:
            await self.llm.pause_generation(mode=mode, clear_cache=clear_cache)  # type: ignore[arg-type]
            self._caller_paused = self._paused = True

    async def resume(self) -> None:
        async with self._freeze:  # after a finish under way has reset the caches
            self._caller_paused = False
            await self.llm.resume_generation()
            self._paused = False

    async def is_paused(self) -> bool:
        return bool(await self.llm.is_paused())

    async def abort_requests(self, request_ids: list[str] | None) -> int:
        """Abort requests in flight: all of them, or those with the given ids (a caller's id
        matches every engine request made for it; the engine adds a suffix to each)."""
        states = self.llm.output_processor.request_states
        running = {s.external_req_id for s in states.values() if s.external_req_id is not None}
        if request_ids:
            asked = set(request_ids)
            ids = [r for r in running if r in asked or r.rpartition("-")[0] in asked]
        else:
            ids = list(running)
        if ids:
            await self.llm.abort(ids)
        return len(ids)

    # -- weights -----------------------------------------------------------------------------

    def _require_backend(self) -> None:
        if self.backend is None:
            raise WeightTransferNotConfigured(
                "this server has no weight-transfer engine; start it with "
                '--weight-transfer-config \'{"backend": "tandem_file"}\' (or nccl/ipc on GPUs)'
            )

    async def init_transfer(self, init_info: dict[str, Any]) -> None:
        self._require_backend()
        if self.backend == BACKEND and init_info:
            raise BadRequest("the tandem_file backend takes no init_info", param="init_info")
        async with self._lock:
            await self.llm.init_weight_transfer_engine(
                WeightTransferInitRequest(init_info=init_info)
            )
            self._transfer_ready = True

    async def start_update(self, update_id: UpdateId | None = None) -> UpdateId:
        """Start an update (``update_id``: the fleet's id for it, or None to mint one here)."""
        self._require_backend()
        async with self._lock:
            if self.ledger.already_seen(update_id):
                raise WeightUpdateSeqSeen(
                    f"update {update_id}: this node has already seen an update start at SEQ "
                    f"{self.ledger.seen_seq}; mint the id above it",
                    details={"seen_seq": self.ledger.seen_seq},
                )
            if self.ledger.current is not None:
                if not self.ledger.outdated_by(update_id):
                    raise WeightUpdateConflict(
                        "a weight update is already under way; finish it first"
                    )
                log.warning(
                    "weight update %s ended unfinished: update %s starts",
                    self.ledger.current,
                    update_id,
                )
                await self._end_update()
            await self.llm.start_weight_update()
            uid = self.ledger.start(update_id)
            self._stepped()
            return uid

    async def update(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._require_backend()
        async with self._lock:
            if self.ledger.current is None:
                raise WeightUpdateConflict("start_weight_update must come before update_weights")
            sent = update_info  # the receipt counts what the caller sent, before it is resolved
            self._stepped()  # a refused chunk is a step too: the trainer is there
            names: set[str] | None
            if self.backend == BACKEND:
                update_info, names = await asyncio.to_thread(self._checked_files, update_info)
            else:
                names = _named_tensors(update_info)
            try:
                await self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))
            except Exception:
                # vLLM's worker ends the update when a chunk fails; so do we. What a backend
                # applies in place (NCCL, IPC) may be partly in the model now.
                self.ledger.chunk(names, sent)
                self.ledger.ended(loaded_in_place=self.backend != BACKEND)
                self._unarm()
                raise
            self.ledger.chunk(names, sent)
            self._stepped()

    async def finish_update(self, weight_version: str | None, received: str | None = None) -> None:
        """Load the update, reset the caches and relabel, with the engine frozen throughout
        (vLLM's ``keep`` pause): no request sees new weights with old KV or encoder cache, or
        the old label on new weights. A reset that does not hold leaves the node unclean.

        ``received``: the receipt the caller expects this node to hold
        (``UPDATE_RECEIVED_HEADER``); when the node took other chunks, the update is ended
        without loading it and the finish refused (``WeightUpdateIncomplete``)."""
        self._require_backend()
        async with self._lock:
            if self.ledger.current is None:
                raise WeightUpdateConflict(
                    "finish_weight_update called without a matching start_weight_update"
                )
            wrong = None if received is None else self.ledger.receipt_differs(received)
            if wrong is not None:
                await self._end_update()
                raise WeightUpdateIncomplete(wrong)
            self._unarm()
            async with self._frozen():
                try:
                    await self.llm.finish_weight_update(weight_version)
                except Exception:
                    self.ledger.finish_failed()
                    self._label = None  # relabelled or not: asked again
                    raise
                if weight_version is not None:
                    self._label = weight_version
                self.ledger.finished()
                try:
                    await self._reset_caches()
                except PrefixCacheNotReset:
                    self.ledger.cache_not_reset()
                    raise

    async def abort_update(self) -> bool:
        """End the update under way without loading what it received (False: none was under
        way). ``tandem_file`` drops what it staged; on the backends that load in place (NCCL,
        IPC) the update is finished with what arrived, since vLLM's finalize is what puts the
        model's kernel tensors back after a start: with no chunk that is the old weights, with
        chunks it is partly new, and the node is unclean until every tensor is written again."""
        self._require_backend()
        async with self._lock:
            if self.ledger.current is None:
                return False
            await self._end_update()
            return True

    async def _end_update(self) -> None:
        """End the update under way without loading it (see ``abort_update``); the caller
        holds the weight lock."""
        self._unarm()
        if self.backend == BACKEND:
            try:
                await self.llm.update_weights(WeightTransferUpdateRequest(update_info=ABORT_UPDATE))
            except Exception:  # the refused chunk is how the worker's update ends
                pass
            self.ledger.ended(loaded_in_place=False)
            return
        try:
            async with self._frozen():
                await self.llm.finish_weight_update(None)
                if self.ledger.chunks:
                    await self._reset_caches()
        except PrefixCacheNotReset:
            self.ledger.ended(loaded_in_place=True)
            self.ledger.cache_not_reset()
            raise
        except BaseException:
            self.ledger.finish_failed()  # a failed finalize: what the model holds is not known
            raise
        self.ledger.ended(loaded_in_place=True)

    # -- an update whose trainer is gone ------------------------------------------------------

    def _stepped(self) -> None:
        """A step of the update under way was taken: it is idle from now (see
        ``update_idle_timeout_s``)."""
        self._last_step = time.monotonic()
        if self.update_idle_timeout_s > 0 and self._idle_timer is None:
            loop = asyncio.get_running_loop()
            self._idle_timer = loop.call_later(self.update_idle_timeout_s, self._idle_check)

    def _unarm(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_check(self) -> None:
        self._idle_timer = None
        self._expiring = asyncio.ensure_future(self._expire_if_idle())

    async def _expire_if_idle(self) -> None:
        async with self._lock:  # after a step under way, which counts as one
            if self.ledger.current is None:
                return
            idle = time.monotonic() - self._last_step
            if idle < self.update_idle_timeout_s:
                if self._idle_timer is not None:  # a new update armed its own
                    return
                loop = asyncio.get_running_loop()
                left = self.update_idle_timeout_s - idle
                self._idle_timer = loop.call_later(left, self._idle_check)
                return
            log.warning(
                "weight update %s ended unfinished: no step for %.0f s (--update-idle-timeout-s)",
                self.ledger.current,
                idle,
            )
            try:
                await self._end_update()
            except Exception:  # the node reports itself unclean; nothing waits for this
                log.exception("ending the idle weight update failed")

    @contextlib.asynccontextmanager
    async def _frozen(self) -> AsyncIterator[None]:
        """The engine paused in vLLM's ``keep`` mode (requests in flight wait, new ones
        queue), resumed after, unless a caller had paused it: then it stays paused. A
        ``/pause`` or ``/resume`` meanwhile waits until it is over."""
        async with self._freeze:
            paused_before = self._paused
            if not paused_before:
                await self.llm.pause_generation(mode="keep", clear_cache=False)
                self._paused = True
            try:
                yield
            finally:
                if not paused_before and not self._caller_paused:
                    await self.llm.resume_generation()
                    self._paused = False

    async def _reset_caches(self) -> None:
        """KV blocks and vision embeddings computed by the old weights must not be reused."""
        await self._reset_prefix_cache()
        await self.llm.reset_encoder_cache()

    async def reset_prefix_cache(self) -> bool:
        """``/reset_prefix_cache`` as upstream answers it (false while requests hold blocks);
        one that succeeds makes a node whose finish could not reset it whole again."""
        done = bool(await self.llm.reset_prefix_cache())
        if done:
            self.ledger.cache_reset()
        return done

    async def _reset_prefix_cache(self) -> None:
        """Reset the prefix cache until it holds. A plain reset refuses (False) while requests
        hold KV blocks; then running requests are preempted first, as vLLM's own pause with
        ``clear_cache`` does, so they recompute their KV under the new weights."""
        for attempt in range(RESET_ATTEMPTS):
            try:
                if await self.llm.reset_prefix_cache() or await self.llm.reset_prefix_cache(
                    reset_running_requests=True
                ):
                    return
            except RuntimeError as exc:  # vLLM: blocks held for a remote KV transfer
                log.warning("prefix cache reset failed (attempt %d): %s", attempt + 1, exc)
            await asyncio.sleep(RESET_BACKOFF_S * (attempt + 1))
        raise PrefixCacheNotReset(
            "the new weights are loaded and labelled, but the engine did not reset its prefix "
            "cache: KV computed with the old weights may be reused, so this node serves nothing "
            "behind a router until a /reset_prefix_cache succeeds"
        )

    async def set_version(self, version: str) -> None:
        await self.llm.update_weight_version(version)
        self._label = version

    async def weight_info(self) -> WeightInfo:
        """``/weight_info``: vLLM's ``weight_version`` and what the node loaded
        (``tandem_wire.control.WeightInfo``), from this process's own record: it answers
        while a chunk or a finish loads (an engine call would wait for the load, and a router
        would take the node for gone). The label is asked of the engine only when not known
        (at the first ask, and after a finish that failed)."""
        if self._label is None:
            self._label = str(await self.llm.get_weight_version())
        ready = self.backend == BACKEND or (self.backend is not None and self._transfer_ready)
        info = self.ledger.info(self._label, WeightTransferState(self.backend, ready))
        # A node that missed a /resume must get no requests: they would wait for one.
        return msgspec.structs.replace(info, paused=self._paused)

    def world_size(self, include_dp: bool) -> int:
        pc = self.engine.vllm_config.parallel_config
        return int(pc.world_size_across_dp if include_dp else pc.world_size)

    def server_info(self) -> dict[str, Any]:
        """``/server_info?config_format=json`` as upstream answers it, without its environment
        sections (TRL reads ``vllm_config.weight_transfer_config``)."""
        cfg = _CONFIG_JSON.dump_python(self.engine.vllm_config, mode="json", fallback=str)
        return {"vllm_config": scrubbed(cfg)}

    # -- the tandem_file backend's checks ------------------------------------------------------

    def _checkpoint(self) -> dict[str, TensorSpec]:
        """The served model's own checkpoint (names, dtypes, shapes), read once."""
        if self._spec is None:
            mc = self.engine.model_config
            self._spec = checkpoint_spec(model_folder(mc.model, mc.revision))
        return self._spec

    def _names(self) -> frozenset[str] | None:
        """The checkpoint's tensor names, None when it cannot be read (the ledger's)."""
        try:
            return frozenset(self._checkpoint())
        except WeightFileRefused:
            return None

    def _checked_files(
        self, update_info: dict[str, Any] | list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | list[dict[str, Any]], set[str]]:
        """The update with each path resolved inside the folder and its file checked against
        the model, and the tensor names it writes: a refusal here is a 4xx, and the engine
        was never asked for anything."""
        try:
            spec = self._checkpoint()
        except WeightFileRefused as exc:
            raise WeightCheckpointUnavailable(exc.message) from None
        serving = (str(self.engine.model_config.dtype).removeprefix("torch."),)
        infos = update_info if isinstance(update_info, list) else [update_info]
        out, names = [], set[str]()
        for info in infos:
            if set(info) != {"path"}:
                raise BadRequest(
                    'update_info for the tandem_file backend is {"path": FILE}',
                    param="update_info",
                )
            try:
                path = confine(info["path"], self.weight_dir)
                header = read_header(path)
                check_update(header, spec, serving)
            except WeightFileRefused as exc:
                if exc.kind == "path":
                    raise WeightPathNotAllowed(exc.message, param="update_info.path") from None
                raise InvalidWeightUpdate(exc.message, param="update_info.path") from None
            out.append({"path": str(Path(path))})
            names.update(header)
        return (out if isinstance(update_info, list) else out[0]), names


def _named_tensors(update_info: dict[str, Any] | list[dict[str, Any]]) -> set[str] | None:
    """The tensor names a chunk of another backend writes (vLLM's NCCL and IPC chunks list
    them in ``names``; a list holds one entry per worker), None when it does not say."""
    names: set[str] = set()
    for info in update_info if isinstance(update_info, list) else [update_info]:
        told = info.get("names") if isinstance(info, dict) else None
        if not isinstance(told, list) or not all(isinstance(n, str) for n in told):
            return None
        names.update(told)
    return names

"""The engine's control surface for RL trainers: pause/resume and weight updates.

The vLLM adapter behind the control routes: each call is the ``AsyncLLM`` method vLLM 0.32's
own RL router (``vllm/entrypoints/rl/online/api_router.py``) calls, with the refusals a caller
should see as typed 4xx made here, before anything reaches the engine: calls out of order,
no weight-transfer backend, and for the ``tandem_file`` backend a path outside the folder or a
file whose tensors the model does not take.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import pydantic
from vllm.config import VllmConfig
from vllm.distributed.weight_transfer.base import (
    WeightTransferInitRequest,
    WeightTransferUpdateRequest,
)

from tandem_http import BadRequest

from .engine import Engine
from .errors import (
    InvalidWeightUpdate,
    PrefixCacheNotReset,
    WeightCheckpointUnavailable,
    WeightPathNotAllowed,
    WeightTransferNotConfigured,
    WeightUpdateConflict,
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
_OPAQUE_CONFIGS = frozenset({"kv_connector_extra_config", "ec_connector_extra_config"})
"""Free-form connector settings: whatever they hold may be a credential."""
REDACTED = "<redacted>"


def scrubbed(value: Any) -> Any:
    """A JSON config dump with every secret replaced by ``REDACTED`` (a field named like one,
    and the free-form connector settings whole): ``/server_info`` answers any inference key,
    and vLLM itself serves its config only in dev mode."""
    if isinstance(value, dict):
        return {
            k: REDACTED
            if v not in (None, {}, "") and (k in _OPAQUE_CONFIGS or _SECRET_NAME.search(str(k)))
            else scrubbed(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


RESET_ATTEMPTS = 5
"""Tries at resetting the prefix cache after an update before answering that it did not."""
RESET_BACKOFF_S = 0.2


class EngineControl:
    """Pause, resume and weight updates on one engine; one per process (it tracks whether an
    update is under way, as vLLM's worker does, to refuse calls out of order up front)."""

    def __init__(self, engine: Engine, weight_dir: str | None) -> None:
        self.engine = engine
        self.llm = engine.llm
        self.weight_dir = weight_dir
        wt = engine.vllm_config.weight_transfer_config
        self.backend: str | None = None if wt is None else str(wt.backend)
        self._updating = False
        self._updated_at: float | None = None
        """Wall clock of the last finished update or relabel (None: none since start-up)."""
        self._lock = asyncio.Lock()  # one weight call at a time: they change shared state
        self._spec: dict[str, TensorSpec] | None = None

    # -- pause -------------------------------------------------------------------------------

    async def pause(self, mode: str, clear_cache: bool) -> None:
        if mode not in PAUSE_MODES:
            raise BadRequest(f"mode must be one of {', '.join(PAUSE_MODES)}", param="mode")
        await self.llm.pause_generation(mode=mode, clear_cache=clear_cache)  # type: ignore[arg-type]

    async def resume(self) -> None:
        await self.llm.resume_generation()

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

    async def start_update(self) -> None:
        self._require_backend()
        async with self._lock:
            if self._updating:
                raise WeightUpdateConflict("a weight update is already under way; finish it first")
            await self.llm.start_weight_update()
            self._updating = True

    async def update(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        self._require_backend()
        async with self._lock:
            if not self._updating:
                raise WeightUpdateConflict("start_weight_update must come before update_weights")
            if self.backend == BACKEND:
                update_info = await asyncio.to_thread(self._checked_files, update_info)
            try:
                await self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))
            except Exception:
                # vLLM's worker ends the update when a chunk fails; so do we.
                self._updating = False
                raise

    async def finish_update(self, weight_version: str | None) -> None:
        self._require_backend()
        async with self._lock:
            if not self._updating:
                raise WeightUpdateConflict(
                    "finish_weight_update called without a matching start_weight_update"
                )
            self._updating = False
            await self.llm.finish_weight_update(weight_version)
            self._updated_at = time.time()
        # KV blocks and vision embeddings computed by the old weights must not be reused.
        await self._reset_prefix_cache()
        await self.llm.reset_encoder_cache()

    async def abort_update(self) -> bool:
        """End the update under way without loading what it received (False: none was under
        way). What a backend applies in place as it arrives (NCCL, IPC) stays applied: an
        abort undoes a start, and with ``tandem_file`` any chunks too (they are only staged)."""
        self._require_backend()
        async with self._lock:
            if not self._updating:
                return False
            self._updating = False
            try:
                await self.llm.update_weights(WeightTransferUpdateRequest(update_info=ABORT_UPDATE))
            except Exception:  # the refused chunk is how the worker's update ends
                pass
            return True

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
            "cache: KV computed with the old weights may be reused; retry /reset_prefix_cache"
        )

    async def set_version(self, version: str) -> None:
        await self.llm.update_weight_version(version)
        self._updated_at = time.time()

    async def weight_info(self) -> dict[str, Any]:
        """``/weight_info``: vLLM's ``weight_version``, and Tandem's ``updated_at`` (wall
        clock of the last finished update or relabel, null since start-up) and ``updating``,
        from which a router tells the fleet's version (``tandem_client.fleet``)."""
        return {
            "weight_version": str(await self.llm.get_weight_version()),
            "updated_at": self._updated_at,
            "updating": self._updating,
        }

    def world_size(self, include_dp: bool) -> int:
        pc = self.engine.vllm_config.parallel_config
        return int(pc.world_size_across_dp if include_dp else pc.world_size)

    def server_info(self) -> dict[str, Any]:
        """``/server_info?config_format=json`` as upstream answers it, without its environment
        sections (TRL reads ``vllm_config.weight_transfer_config``)."""
        cfg = _CONFIG_JSON.dump_python(self.engine.vllm_config, mode="json", fallback=str)
        return {"vllm_config": scrubbed(cfg)}

    # -- the tandem_file backend's checks ------------------------------------------------------

    def _checked_files(
        self, update_info: dict[str, Any] | list[dict[str, Any]]
    ) -> dict[str, Any] | list[dict[str, Any]]:
        """The update with each path resolved inside the folder and its file checked against
        the model: a refusal here is a 4xx, and the engine was never asked for anything."""
        if self._spec is None:
            mc = self.engine.model_config
            try:
                self._spec = checkpoint_spec(model_folder(mc.model, mc.revision))
            except WeightFileRefused as exc:
                raise WeightCheckpointUnavailable(exc.message) from None
        serving = (str(self.engine.model_config.dtype).removeprefix("torch."),)
        infos = update_info if isinstance(update_info, list) else [update_info]
        out = []
        for info in infos:
            if set(info) != {"path"}:
                raise BadRequest(
                    'update_info for the tandem_file backend is {"path": FILE}',
                    param="update_info",
                )
            try:
                path = confine(info["path"], self.weight_dir)
                check_update(read_header(path), self._spec, serving)
            except WeightFileRefused as exc:
                if exc.kind == "path":
                    raise WeightPathNotAllowed(exc.message, param="update_info.path") from None
                raise InvalidWeightUpdate(exc.message, param="update_info.path") from None
            out.append({"path": str(Path(path))})
        return out if isinstance(update_info, list) else out[0]

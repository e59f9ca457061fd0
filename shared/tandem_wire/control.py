"""Request bodies of the generate service's control routes (data only), as vLLM 0.32's RL
router (``vllm/entrypoints/rl/online/api_router.py``) takes them, so that its clients (TRL's
``VLLMClient``) work unchanged. Answers are small JSON objects, also as upstream's."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

__all__ = [
    "PauseMode",
    "InitWeightTransferRequest",
    "UpdateWeightsRequest",
    "FinishWeightUpdateRequest",
    "UpdateWeightVersionRequest",
    "AbortRequestsRequest",
]

PauseMode = Literal["abort", "wait", "keep"]
"""``/pause?mode=``: ``abort`` ends requests in flight (they answer ``finish_reason: abort``),
``wait`` lets them finish first, ``keep`` freezes them until ``/resume``."""


class InitWeightTransferRequest(Struct, forbid_unknown_fields=True):
    """``POST /init_weight_transfer_engine``."""

    init_info: dict[str, Any]
    """The backend's init fields (NCCL: master address, port, ranks; ``tandem_file``: none)."""


class UpdateWeightsRequest(Struct, forbid_unknown_fields=True):
    """``POST /update_weights``: one chunk of an update, between start and finish."""

    update_info: dict[str, Any] | list[dict[str, Any]]
    """The backend's fields; for ``tandem_file`` ``{"path": FILE}``, FILE a safetensors file
    inside the server's ``--weight-transfer-dir`` (relative to it, or absolute). A list holds
    one entry per engine worker."""


class FinishWeightUpdateRequest(Struct, forbid_unknown_fields=True):
    """``POST /finish_weight_update``."""

    weight_version: str | None = None
    """The label of the new weights (null keeps the current label)."""


class UpdateWeightVersionRequest(Struct, forbid_unknown_fields=True):
    """``POST /update_weight_version``: relabel the weights without changing them."""

    new_version: str


class AbortRequestsRequest(Struct, forbid_unknown_fields=True):
    """``POST /abort_requests`` (the request body may also be empty)."""

    request_ids: list[str] | None = None
    """Engine request ids to abort; null or empty aborts every request in flight."""

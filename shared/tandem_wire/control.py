"""Request bodies of the generate service's control routes (data only), as vLLM 0.32's RL
router (``vllm/entrypoints/rl/online/api_router.py``) takes them, so that its clients (TRL's
``VLLMClient``) work unchanged. Answers are small JSON objects, also as upstream's."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from msgspec import Struct

__all__ = [
    "CONTROL_ROUTES",
    "ControlRoute",
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


class ControlRoute(NamedTuple):
    """One control route of a generate node, as a router in front of several treats it."""

    path: str
    method: str
    changes_state: bool
    """Needs an admin key (or ``--enable-control-routes`` without admin keys) and fails when a
    node fails it."""
    combine: str
    """How the nodes' answers become one (``tandem_client.fleet.COMBINE``)."""
    every_node: bool = False
    """Read-only, but its answer is wrong without every node's: a node that fails is an error."""
    body: type[Struct] | None = None
    """The JSON body it takes (None: none, or query parameters only)."""


CONTROL_ROUTES: tuple[ControlRoute, ...] = (
    ControlRoute("/reset_prefix_cache", "POST", True, "each"),
    ControlRoute("/pause", "POST", True, "each"),
    ControlRoute("/resume", "POST", True, "each"),
    ControlRoute(
        "/init_weight_transfer_engine", "POST", True, "each", body=InitWeightTransferRequest
    ),
    ControlRoute("/start_weight_update", "POST", True, "each"),
    ControlRoute("/update_weights", "POST", True, "each", body=UpdateWeightsRequest),
    ControlRoute("/finish_weight_update", "POST", True, "each", body=FinishWeightUpdateRequest),
    ControlRoute("/abort_weight_update", "POST", True, "each"),
    ControlRoute("/update_weight_version", "POST", True, "each", body=UpdateWeightVersionRequest),
    ControlRoute("/abort_requests", "POST", True, "each", body=AbortRequestsRequest),
    ControlRoute("/is_paused", "GET", False, "any_paused"),
    ControlRoute("/weight_info", "GET", False, "weight_versions"),
    ControlRoute("/get_world_size", "GET", False, "world_size", every_node=True),
    ControlRoute("/server_info", "GET", False, "first"),
)
"""Every control route generate serves and the front door fans out to every generate node."""

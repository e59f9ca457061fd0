"""Request bodies of the generate service's control routes (data only), as vLLM 0.32's RL
router (``vllm/entrypoints/rl/online/api_router.py``) takes them, so that its clients (TRL's
``VLLMClient``) work unchanged. Answers are small JSON objects, also as upstream's."""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any, Literal, NamedTuple

import msgspec
from msgspec import Struct

__all__ = [
    "APPLIED_REPORTED",
    "CONTROL_ROUTES",
    "UPDATE_ID_HEADER",
    "UPDATE_RECEIVED_HEADER",
    "ControlRoute",
    "PauseMode",
    "UpdateId",
    "UpdateReceipt",
    "WeightInfo",
    "WeightTransferState",
    "InitWeightTransferRequest",
    "UpdateWeightsRequest",
    "FinishWeightUpdateRequest",
    "UpdateWeightVersionRequest",
    "AbortRequestsRequest",
]

PauseMode = Literal["abort", "wait", "keep"]
"""``/pause?mode=``: ``abort`` ends requests in flight (they answer ``finish_reason: abort``),
``wait`` lets them finish first, ``keep`` freezes them until ``/resume``."""


UPDATE_ID_HEADER = "x-tandem-update-id"
"""Sent with ``/start_weight_update`` by whoever runs an update over several nodes (the front
door, ``tandem_client``): the update's id (``UpdateId``), the same on every node, so that the
nodes can tell a router which updates they applied. A node started without it mints its own."""

APPLIED_REPORTED = 64
"""How many of a node's newest applied updates ``/weight_info`` lists (``applied_seqs``)."""

_UPDATE_ID = re.compile(r"([0-9]{1,15})-([0-9a-f]{8,64})")


class UpdateId(NamedTuple):
    """A weight update's id, ``SEQ-TOKEN``: ``seq`` is one more than the highest sequence
    number any node of the fleet had seen start (so a fleet's updates are ordered without a
    clock), ``token`` random hex (so two updates minted from the same view differ)."""

    seq: int
    token: str

    def __str__(self) -> str:
        return f"{self.seq}-{self.token}"

    @classmethod
    def parse(cls, text: str) -> UpdateId:
        """The id written as ``SEQ-TOKEN``; ``ValueError`` when it is not one."""
        found = _UPDATE_ID.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"an update id is SEQ-HEX (e.g. 7-9f3c1a2b), not {text[:80]!r}")
        return cls(int(found.group(1)), found.group(2))

    @classmethod
    def mint(cls, seen_seq: int) -> UpdateId:
        """A new id after ``seen_seq``, the highest sequence number seen so far."""
        return cls(seen_seq + 1, secrets.token_hex(8))


UPDATE_RECEIVED_HEADER = "x-tandem-update-received"
"""Sent with ``/finish_weight_update`` by whoever runs an update over several nodes: what the
node must have taken of the update under way (``UpdateReceipt.header``: its chunk count and
digest). A node whose own receipt differs took other chunks than the caller sent (one was lost
on the way, with its abort): it refuses the finish (409 ``weight_update_incomplete``) and ends
the update without loading it. Without the header a node finishes as vLLM's does."""

_RECEIVED = re.compile(r"([0-9]{1,9}):([0-9a-f]{32})")


def _chained(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


class UpdateReceipt(Struct, frozen=True):
    """What a node took of the update under way: its id, how many ``/update_weights`` chunks,
    and a digest chained over the update's id and each chunk's ``update_info`` (as JSON), so
    two receipts are equal exactly when the same chunks arrived in the same order."""

    update_id: str
    """The update's id (``UpdateId``)."""
    chunks: int
    """Chunks taken since its start."""
    digest: str
    """32 hex digits."""

    @classmethod
    def begin(cls, update_id: UpdateId) -> UpdateReceipt:
        """An update's receipt at its start (no chunk yet)."""
        return cls(str(update_id), 0, _chained(b"update", str(update_id).encode()))

    def took(self, update_info: Any) -> UpdateReceipt:
        """The receipt after one more chunk (``update_info`` as ``/update_weights`` carried
        it: the same JSON value on every node, whatever each does with it)."""
        chunk = msgspec.json.encode(update_info)
        return UpdateReceipt(self.update_id, self.chunks + 1, _chained(self.digest.encode(), chunk))

    def header(self) -> str:
        """The ``UPDATE_RECEIVED_HEADER`` value: ``CHUNKS:DIGEST``."""
        return f"{self.chunks}:{self.digest}"

    @staticmethod
    def check_header(text: str) -> str:
        """The header value as sent (stripped); ``ValueError`` when it is not one."""
        if _RECEIVED.fullmatch(text.strip()) is None:
            raise ValueError(f"a receipt is CHUNKS:DIGEST (32 hex digits), not {text[:80]!r}")
        return text.strip()


class WeightTransferState(Struct):
    """How a node receives weights."""

    backend: str | None
    """``nccl``, ``ipc``, ``tandem_file``...; null: the node takes no weight updates."""
    ready: bool
    """Whether it can take an update now: ``tandem_file`` always; a collective backend once
    ``/init_weight_transfer_engine`` joined it to the trainer's group."""


class WeightInfo(Struct):
    """``GET /weight_info`` of a generate node: vLLM's ``weight_version`` plus what a router
    needs to tell which nodes hold the same weights (``tandem_client.fleet``)."""

    weight_version: str
    """vLLM's label of the weights (``default`` until one is given); for people, never for
    routing: a finish without a label keeps the old one, as vLLM does."""
    updating: bool
    """An update is under way (started, not yet finished or aborted)."""
    weights_id: str
    """A digest of what the engine computes with: the checkpoint (served name and revision),
    and for every tensor name the id of the update that last wrote it. Two nodes started from
    the same checkpoint hold the same weights exactly when their ``weights_id`` are equal."""
    update_seq: int
    """The sequence number of the last update this node applied (0: none since start-up)."""
    applied_seqs: list[int]
    """The sequence numbers of the updates it applied since start-up, newest first (at most
    the last ``APPLIED_REPORTED``): routers rank nodes by them, newest update first."""
    seen_seq: int
    """The highest sequence number of an update it was asked to start (a new id is minted
    above it)."""
    unclean: str | None
    """Why the weights or caches may not be what ``weights_id`` says (null: they are):
    ``partial_load`` (a chunk was applied in place, then the update failed or was aborted,
    or a finish or finalize failed; clean again once every tensor has been written since,
    whatever resets happen), else ``prefix_cache_not_reset`` (clean again after a
    ``/reset_prefix_cache`` that succeeds).
    Such a node serves nothing behind a router."""
    unwritten: int | None
    """With ``partial_load``: how many checkpoint tensors are still to be written before the
    node is clean again (null: unknown, the checkpoint's names cannot be read)."""
    weight_transfer: WeightTransferState
    paused: bool | None = None
    """The engine is paused (``/pause``, or a finish's own freeze): new requests wait until it
    resumes, so a router sends it none while another node may serve (null: not told)."""
    receiving: UpdateReceipt | None = None
    """The update under way as this node took it (null: none is): a router finishing it asks
    the nodes to hold what the node that took the most chunks holds."""


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

"""Stand-in generate nodes for fleet tests: the weight-update state machine of
``tandem_generate.control`` (start -> update -> finish, abort) with its own record of what it
loaded (``tandem_generate.weight_ledger``, the real one: ``/weight_info`` is what a node says),
faults injected per step, and every request recorded. Behind one transport that routes by host
(``http://g1`` ...), so the door and tandem_client run in-process.

An update's ``update_info`` is ``{"path": NAME}`` or ``{"path": NAME, "names": [...]}``: it
writes the tensors ``names`` (default: every tensor, ``FULL``), each of them now NAME's."""

from __future__ import annotations

import json

import anyio
import httpx
import msgspec

from tandem_generate.weight_ledger import WeightLedger
from tandem_wire.control import (
    UPDATE_ID_HEADER,
    UPDATE_RECEIVED_HEADER,
    UpdateId,
    WeightTransferState,
)

HOLD_HEADER = "x-test-hold"
"""A header the door passes on with a control call: the node it names holds its answer back."""

TENSORS = ("model.embed_tokens.weight", "model.layers.0.mlp.weight", "lm_head.weight")
"""The stand-in checkpoint's tensors."""


def _error(status: int, type_: str, message: str, details: dict | None = None) -> httpx.Response:
    error = {"type": type_, "message": message, **({"details": details} if details else {})}
    return httpx.Response(status, json={"error": error})


class GenNode:
    """One generate node: ``weights`` are what its engine would compute with (what an update
    loaded), ``version`` its label; ``fail[step]`` makes a step fail: ``"refuse"`` (500
    ``internal_error``), ``"timeout"`` (the call times out), ``"late"`` (the step is done but
    the answer times out), ``"down"`` (connection refused, from then on: the process is
    gone), ``"raced"`` (at a start: another router's start with the same SEQ, and its abort,
    got here first), ``"pool"`` (the caller's connection pool is full: the call never leaves
    it). A call whose ``HOLD_HEADER`` names the node is answered as the node is now, and the
    answer held back until its ``release`` is set: it arrives after later ones."""

    def __init__(self, name: str, version: str = "v0") -> None:
        self.name = name
        self.restart(version)
        self.down = False
        self.release = anyio.Event()
        self.holding = 0
        """Answers it holds back (``HOLD_HEADER``), made."""
        self.paths: list[str] = []
        self.generated: list[str] = []
        """The weights each completion it served was computed with, with its label."""

    def restart(self, checkpoint: str = "v0") -> None:
        self.down = False
        self.fail: dict[str, str] = {}
        self.version = checkpoint
        self.tensors = dict.fromkeys(TENSORS, checkpoint)
        """What each tensor holds: the name of the update that last wrote it."""
        self.ledger = WeightLedger("stand-in@", lambda: frozenset(TENSORS))
        self.staged: dict[str, str] = {}
        self.paused = False
        """Paused by ``/pause`` until ``/resume`` (it still answers generate calls here: a
        test counts the requests that reach a paused node)."""

    @property
    def updating(self) -> bool:
        return self.ledger.current is not None

    @property
    def weights(self) -> str:
        """What it computes with: one update's name when every tensor is that update's."""
        held = set(self.tensors.values())
        return held.pop() if len(held) == 1 else "+".join(sorted(held))

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        self.paths.append(path)
        step = path.strip("/")
        how = self.fail.get(step)
        if how == "down":
            self.down = True
            raise httpx.ConnectError("connection refused", request=request)
        if how == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if how == "pool":  # the caller's own connections were all in use: never sent
            self.paths.pop()
            raise httpx.PoolTimeout("no connection free", request=request)
        if how == "defer":  # a slow node: the step is done later (``catch_up``), unanswered
            self.deferred = request
            raise httpx.ReadTimeout("timed out", request=request)
        if how == "raced":  # another router's start with the same SEQ got here first
            self.fail.pop(step)
            told = UpdateId.parse(request.headers[UPDATE_ID_HEADER])
            self.ledger.start(UpdateId(told.seq, "0" * 16))
            self.ledger.ended(loaded_in_place=False)
        if how == "refuse":
            if step == "update_weights":
                self.ledger.ended(loaded_in_place=False)  # vLLM's worker ends the update
            if step == "finish_weight_update":  # as generate's control: the load may be partial
                self.ledger.finish_failed()
            return _error(500, "internal_error", f"{self.name} failed {step}")
        control = request.content and path != "/inference/v1/generate"
        self._update_id = request.headers.get(UPDATE_ID_HEADER)
        self._received = request.headers.get(UPDATE_RECEIVED_HEADER)
        answer = self._answer(path, json.loads(request.content) if control else {})
        if how == "late":
            raise httpx.ReadTimeout("timed out after doing it", request=request)
        return answer

    def _answer(self, path: str, body: dict) -> httpx.Response:
        conflict = _error(409, "weight_update_conflict", "out of order")
        if path == "/weight_info":
            transfer = WeightTransferState("tandem_file", True)
            info = self.ledger.info(self.version, transfer)
            info = msgspec.structs.replace(info, paused=self.paused)
            return httpx.Response(200, content=msgspec.json.encode(info))
        if path in ("/pause", "/resume"):
            self.paused = path == "/pause"
            return httpx.Response(200, json={"status": f"{path[1:]}d"})
        if path == "/start_weight_update":
            told = UpdateId.parse(self._update_id) if self._update_id else None
            if self.ledger.already_seen(told):  # as generate's control
                return _error(
                    409, "weight_update_seq_seen", "seen", {"seen_seq": self.ledger.seen_seq}
                )
            if self.updating and not self.ledger.outdated_by(told):
                return conflict
            self.ledger.ended(loaded_in_place=False)  # a newer update ends one left behind
            uid = self.ledger.start(told)
            self.staged = {}
            return httpx.Response(200, json={"message": "started", "update_id": str(uid)})
        if path == "/update_weights":
            if not self.updating:
                return conflict
            info = body["update_info"]
            names = info.get("names", TENSORS)
            self.staged.update(dict.fromkeys(names, info["path"]))
            self.ledger.chunk(names, info)
            return httpx.Response(200, json={"message": "Weights updated"})
        if path == "/finish_weight_update":
            if not self.updating:
                return conflict
            wrong = self._received and self.ledger.receipt_differs(self._received)
            if wrong:  # as generate's control: the update is ended, nothing of it loaded
                self.ledger.ended(loaded_in_place=False)
                self.staged = {}
                return _error(409, "weight_update_incomplete", wrong)
            self.tensors.update(self.staged)
            self.ledger.finished()
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return httpx.Response(200, json={"message": "Weight update finished"})
        if path == "/abort_weight_update":
            aborted = self.updating
            self.ledger.ended(loaded_in_place=False)
            self.staged = {}
            return httpx.Response(200, json={"message": "aborted", "aborted": aborted})
        if path == "/inference/v1/generate":
            self.generated.append(f"{self.version}:{self.weights}")
            return httpx.Response(
                200,
                json={
                    "request_id": "r",
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": [1],
                            "weight_versions": [{"version": self.version, "start": 0, "end": 1}],
                        }
                    ],
                },
            )
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return _error(404, "not_found", path)

    def catch_up(self) -> None:
        """The step the node was slow to do (fault ``defer``) is done now."""
        request, self.deferred = self.deferred, None
        self.fail.clear()
        self._update_id = request.headers.get(UPDATE_ID_HEADER)
        self._received = request.headers.get(UPDATE_RECEIVED_HEADER)
        self._answer(request.url.path, json.loads(request.content) if request.content else {})

    def lying(self) -> list[str]:
        """Completions labelled with a version other than the weights that computed them
        (weights are named after the version they were pushed as)."""
        return [g for g in self.generated if g.split(":")[0] != g.split(":")[1]]

    def computed_with(self) -> set[str]:
        """The weights its completions were computed with."""
        return {g.split(":")[1] for g in self.generated}


class GenFleet(httpx.AsyncBaseTransport):
    """Routes by host to the stand-in nodes."""

    def __init__(self, *nodes: GenNode) -> None:
        self.nodes = {n.name: n for n in nodes}

    def __getitem__(self, name: str) -> GenNode:
        return self.nodes[name]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        node = self.nodes[request.url.host]
        if node.fail.get(request.url.path.strip("/")) == "hang":
            # A node that never answers: the caller's read timeout ends the wait, as a real
            # connection's would (this transport is where httpx leaves the timeout to).
            await anyio.sleep(request.extensions.get("timeout", {}).get("read") or 3600)
            raise httpx.ReadTimeout("no answer", request=request)
        r = node.handle(request)
        if request.headers.get(HOLD_HEADER) == node.name:
            node.holding += 1
            await node.release.wait()
        # As a network answer: its bytes not read yet (the door streams them on).
        return httpx.Response(r.status_code, headers=r.headers, stream=httpx.ByteStream(r.content))

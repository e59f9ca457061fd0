"""Stand-in generate nodes for fleet tests: the weight-update state machine of
``tandem_generate.control`` (start -> update -> finish, abort, ``/weight_info`` with
``updated_at``), faults injected per step, and every request recorded. Behind one transport
that routes by host (``http://g1`` ...), so the door and tandem_client run in-process."""

from __future__ import annotations

import itertools
import json

import httpx

_clock = itertools.count(1_000)


def _error(status: int, type_: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"type": type_, "message": message}})


class GenNode:
    """One generate node: ``weights`` are what its engine would compute with (what an update
    loaded), ``version`` its label; ``fail[step]`` makes a step fail: ``"refuse"`` (500
    ``internal_error``), ``"timeout"`` (the call times out), ``"late"`` (the step is done but
    the answer times out), ``"down"`` (connection refused, from then on: the process is
    gone)."""

    def __init__(self, name: str, version: str = "v0") -> None:
        self.name = name
        self.version = version
        self.weights = version
        self.updated_at: float | None = None
        self.updating = False
        self.staged: str | None = None
        self.down = False
        self.fail: dict[str, str] = {}
        self.paths: list[str] = []
        self.generated: list[str] = []
        """The weights each completion it served was computed with, with its label."""

    def restart(self, checkpoint: str = "v0") -> None:
        self.down = False
        self.fail.clear()
        self.version = self.weights = checkpoint
        self.updated_at, self.updating, self.staged = None, False, None

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
        if how == "refuse":
            if step == "update_weights":
                self.updating = False  # vLLM's worker ends an update whose chunk failed
            return _error(500, "internal_error", f"{self.name} failed {step}")
        control = request.content and path != "/inference/v1/generate"
        answer = self._answer(path, json.loads(request.content) if control else {})
        if how == "late":
            raise httpx.ReadTimeout("timed out after doing it", request=request)
        return answer

    def _answer(self, path: str, body: dict) -> httpx.Response:
        conflict = _error(409, "weight_update_conflict", "out of order")
        if path == "/weight_info":
            info = {"weight_version": self.version, "updated_at": self.updated_at}
            return httpx.Response(200, json={**info, "updating": self.updating})
        if path == "/start_weight_update":
            if self.updating:
                return conflict
            self.updating, self.staged = True, None
            return httpx.Response(200, json={"message": "Weight update started"})
        if path == "/update_weights":
            if not self.updating:
                return conflict
            self.staged = body["update_info"]["path"]
            return httpx.Response(200, json={"message": "Weights updated"})
        if path == "/finish_weight_update":
            if not self.updating:
                return conflict
            self.updating = False
            if self.staged is not None:
                self.weights = self.staged
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            self.updated_at = float(next(_clock))
            return httpx.Response(200, json={"message": "Weight update finished"})
        if path == "/abort_weight_update":
            aborted, self.updating, self.staged = self.updating, False, None
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

    def lying(self) -> list[str]:
        """Completions labelled with a version other than the weights that computed them
        (weights are named after the version they were pushed as)."""
        return [g for g in self.generated if g.split(":")[0] != g.split(":")[1]]


class GenFleet(httpx.AsyncBaseTransport):
    """Routes by host to the stand-in nodes."""

    def __init__(self, *nodes: GenNode) -> None:
        self.nodes = {n.name: n for n in nodes}

    def __getitem__(self, name: str) -> GenNode:
        return self.nodes[name]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        r = self.nodes[request.url.host].handle(request)
        # As a network answer: its bytes not read yet (the door streams them on).
        return httpx.Response(r.status_code, headers=r.headers, stream=httpx.ByteStream(r.content))

"""make soak: render, generate and the front door under saturating mixed load for minutes, driven
through the door as users drive it; checks that nothing is lost, answered twice, wrong, refused
without cause, or leaking memory.

The load, all through the front door, mixes:
- OpenAI chat completions (``/v1/chat/completions``), streamed and not;
- TRL's ``VLLMClient`` shape: the door's ``/v1/chat/completions/render``, then its
  ``/inference/v1/generate`` with a ``trl-`` request id and JSON bodies (logprobs in TRL's shape);
- tandem_client rollouts (binary bodies, items the door's node holds sent as null): two token-id
  prompts of 1-3 images each, n=4 with a fixed seed (vLLM refuses n > 1 under greedy);
- background Responses (``/v1/responses`` with ``background: true``, the door's Responses store
  on): read to their end from their own stream, or by asking for them until they end; one that
  ends ``failed`` because generate was full (``overloaded``) is sent again, as a caller would;
- a weight update every ``--weight-every`` seconds (tandem_client.update_weights through the
  door's control routes, the tandem_file backend): the served weights reloaded under a new
  version label, so every answer's tokens stay checkable against a replay;
- images repeated from a small pool or never seen before (``--fresh-share`` of them).
Chat and TRL requests are n=1 (greedy) or n=4 (seeded). Pass:
- no 5xx; every request answered exactly once: generate's, render's and the door's access logs
  count exactly one 200 per request the load made of them;
- each answer's tokens equal those of the same request replayed alone, direct (a sample; a
  Response's text equals the replay's tokens decoded);
- RSS of every process flat after warm-up (within max(64 MiB, 5%)), at the caches' default
  byte budgets (generate's item store, the door's Responses store and oneDNN's kernel cache at
  smaller ones, so that they fill during the run);
- every 429 came from a process full by its own count (the pending requests or held bytes the
  429 reports against its limits);
- hostile clients mixed in: bodies that trickle (each answered 408 ``body_timeout``),
  compressed bodies that inflate to megabytes (answered, or refused 429 by the count), and
  callers that never read a render answer of megabytes (refused 429 by the count, or answered
  and their connection cut at the send deadline);
- every weight update succeeded and the last label is the one served at the end.
Prints latency percentiles and req/s per time window and RSS per process, and writes a PNG plot
and the raw numbers (JSON) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from tandem_client import AsyncTandemClient
from tests.support.images import chat_body, data_url, photo_jpeg, png_bytes
from tools.hostile import NonReaders, SlowBodies, inflating_body
from tools.servers import ServerProcess, tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

RSS_SLACK_BYTES = 64 * 2**20
RSS_SLACK_RATIO = 0.05
IMAGE_POOL = 8
"""Distinct images the "repeated" ones are drawn from."""
MAX_429_RETRIES = 60
HOSTILE_EVERY_S = 10.0
"""A round of hostile clients this often (see ``Load.hostile_clients``)."""
BODY_TIMEOUT_S = 30.0
"""The services' default ``--body-timeout-s``: a trickling body is answered 408 after it."""
SEND_TIMEOUT_S = 30.0
"""The services' default ``--send-timeout-s``: an answer nobody reads is cut after it."""
UNREAD_IMAGES = 3
"""720p images in each render request nobody reads (an answer of megabytes)."""
INFLATED_BYTES = 8 * 2**20
"""What each compressed hostile body inflates to (from ~1 KB)."""
ROLLOUT_PROMPTS = 2
GENERATE_ITEM_CACHE_BYTES = 256 * 2**20
DOOR_RESPONSES_STORE_BYTES = 16 * 2**20
KINDS = ("chat", "chat", "trl", "trl", "rollout", "responses")
RESPONSE_ENDS = frozenset({"completed", "failed", "cancelled", "incomplete"})
"""A stored response's statuses once its run has ended."""
GENERATING_PATHS = ("/inference/v1/generate", "/v1/chat/completions")
"""The door's routes whose requests take a slot on generate."""


@dataclass
class SoakConfig:
    seconds: float = 600.0
    concurrency: int = 12
    generate_max_pending: int = 8
    """Below the load's concurrency, so that generate's queue fills and 429s happen."""
    replay: int = 60
    """Answers replayed alone to check their tokens (a seeded sample)."""
    max_tokens: int = 12
    seed: int = 0
    fresh_share: float = 1 / 3
    """Share of images never seen before."""
    weight_every_s: float = 60.0
    """A weight update this often, the first half a period in."""
    out: Path = Path(".cache/soak")
    window_s: float = 30.0
    rss_every_s: float = 2.0
    warm_share: float = 0.3
    """RSS after warm-up is taken this far into the run."""


@dataclass
class Op:
    index: int
    kind: str
    """``chat`` (the door's OpenAI chat completions), ``trl`` (TRL's render-then-generate shape
    through the door), ``rollout`` (tandem_client through the door) or ``responses`` (a
    background Response through the door)."""
    stream: bool
    n: int
    images: list[list[int]]
    """Image seeds, per prompt (one prompt but for rollouts)."""

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        if self.n == 1:
            return {"max_tokens": max_tokens, "temperature": 0.0}
        # vLLM refuses n > 1 under greedy sampling: a fixed seed makes the samples repeatable.
        return {
            "n": self.n,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": 1000 + self.index,
        }

    def request_id(self) -> str:
        return f"trl-soak{self.index:08x}"

    @property
    def generate_requests(self) -> int:
        """Requests the op makes of generate once answered (a rollout: one per prompt)."""
        return len(self.images)


@dataclass
class Outcome:
    op: Op
    started: float
    latency: float
    status: int
    tokens: list[list[int]] | None = None
    """Per sample (a rollout's prompt-major), the token ids (a Response: None)."""
    text: str | None = None
    """A Response's output text."""
    error: str | None = None
    versions: list[str | None] = field(default_factory=list)


@dataclass
class Hostile:
    kind: str
    """``slow`` (a body that trickles a byte a second), ``compressed`` (a zstd generate body
    that inflates to ``INFLATED_BYTES``) or ``unread`` (a render through the door whose answer
    is never read; its status once refused, or once its connection was cut: None while the
    answer still held its connection past the send deadline)."""
    status: int | None
    expected: tuple[int, ...]


@dataclass
class Overload:
    at: float
    path: str
    details: dict[str, Any] | None
    """The refusal's own count (``tandem_http.AdmissionGate``): pending and held bytes of the
    process that refused, against its limits, and the bytes the request wanted (the door's
    Responses store: the bytes the key's running stored responses hold, against its budget)."""

    @property
    def justified(self) -> bool:
        """Whether the refusing process was full by its own count when it refused."""
        d = self.details or {}
        pending, limit = d.get("pending"), d.get("max_pending")
        if isinstance(pending, int) and isinstance(limit, int) and pending >= limit:
            return True
        held, wanted, budget = d.get("held_bytes"), d.get("wanted_bytes"), d.get("max_held_bytes")
        if isinstance(held, int) and isinstance(wanted, int) and isinstance(budget, int):
            return held + wanted > budget
        # The door's Responses store: the key's running stored responses hold its budget.
        running, store = d.get("running_stored_bytes"), d.get("responses_store_bytes")
        if isinstance(running, int) and isinstance(store, int):
            return running >= store
        return False


class Stack:
    """The three services as processes (generate taking weight updates from a temporary folder,
    the door keeping Responses), every cache at its default budget but generate's item store
    (``GENERATE_ITEM_CACHE_BYTES``) and the door's Responses store
    (``DOOR_RESPONSES_STORE_BYTES``)."""

    def __init__(self, model: str, generate_max_pending: int) -> None:
        self._weights = tempfile.TemporaryDirectory(prefix="tandem-soak-weights-")
        self.weight_dir = self._weights.name
        self.render = tandem_render(model, workers=2)
        self.generate = tandem_generate(
            model,
            self.weight_dir,
            "--max-pending",
            str(generate_max_pending),
            # Small enough to fill and evict within the long run (at ~1.3 MiB/s of fresh
            # images): RSS must plateau with the store full, not merely while it fills.
            "--item-cache-bytes",
            str(GENERATE_ITEM_CACHE_BYTES),
        )
        self.servers = [self.render, self.generate]
        try:
            for server in self.servers:
                server.wait_healthy(timeout=300)
            self.front = tandem_front(
                model,
                self.render.url,
                self.generate.url,
                "--enable-control-routes",
                # Small enough to fill and evict within a minute, as the item store above: a
                # minute on an AVX-512 machine stored ~100 MiB of its 256 MiB default while
                # RSS was measured, growth that was the store filling, not a leak.
                "--responses-store-bytes",
                str(DOOR_RESPONSES_STORE_BYTES),
                workers=1,
                # The Responses store, as vllm serve turns it on: background Responses need it.
                env={"VLLM_ENABLE_RESPONSES_API_STORE": "1"},
            )
            self.servers.append(self.front)
            self.front.wait_healthy(timeout=120)
        except BaseException:
            self.stop()  # one that never came up must not leave the others running
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self._weights.cleanup()


def processes(servers: list[ServerProcess]) -> dict[str, psutil.Process]:
    """Every process of the given servers (workers and engine cores too), by a readable name."""
    out: dict[str, psutil.Process] = {}
    for server in servers:
        main = psutil.Process(server.proc.pid)
        out[f"{server.name} main"] = main
        for child in main.children(recursive=True):
            if "resource_tracker" in " ".join(child.cmdline()):
                continue
            out[f"{server.name} {child.name()} ({child.pid})"] = child
    return out


def access_count(server: ServerProcess, paths: tuple[str, ...], status: int = 200) -> int:
    log = server.log_text(tail=10**9)
    return sum(log.count(f'"POST {path} HTTP/1.1" {status}') for path in paths)


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """A server-sent event stream's lines, split on CR, LF or CRLF only, as the SSE spec says.
    httpx's ``aiter_lines`` also splits on U+2028, U+0085 and the like, which JSON leaves
    unescaped: random-weight models do sample them, and a chat chunk was cut in two."""
    rest = ""
    async for text in response.aiter_text():
        rest += text
        *lines, rest = rest.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            yield line
    if rest:
        yield rest


class SlotWatch(httpx.AsyncBaseTransport):
    """Every HTTP request of the load goes through here: those that take a slot on generate are
    counted while outstanding (until their answer is closed), and each 429 is kept with the
    count it was refused on (for the check that 429s came only from a full process)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.outstanding = 0
        self.finished_at: list[float] = []
        self.overloads: list[Overload] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(GENERATING_PATHS):
            self.outstanding += 1
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException:
            self._release(request)
            raise
        if response.status_code == 429:
            body = await response.aread()
            details = _details(body, response.headers.get("content-type", ""))
            self.overloads.append(Overload(time.monotonic(), request.url.path, details))
            self._release(request)
            return httpx.Response(429, headers=response.headers, content=body, request=request)
        if not request.url.path.endswith(GENERATING_PATHS):
            return response
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Released(stream, lambda: self._release(request)),
            extensions=response.extensions,
            request=request,
        )

    def _release(self, request: httpx.Request) -> None:
        if request.url.path.endswith(GENERATING_PATHS):
            self.outstanding -= 1
            self.finished_at.append(time.monotonic())


def _details(body: bytes, content_type: str) -> dict[str, Any] | None:
    """A 429's ``error.details``, JSON or msgpack (None when it has none, or is not an error
    body)."""
    try:
        doc = msgspec.msgpack.decode(body) if "msgpack" in content_type else json.loads(body)
        details = doc["error"]["details"]
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        return None
    return details if isinstance(details, dict) else None

    async def aclose(self) -> None:
        pass  # shared by several clients: closed once, by its owner (Load.run)


class _Released(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, release: Any) -> None:
        self._inner, self._release = inner, release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._release is not None:
                self._release, release = None, self._release
                release()


class Load:
    """The load generator: ``concurrency`` loops sending ops through the door until the
    deadline, and weight updates on a timer."""

    def __init__(self, cfg: SoakConfig, model: str, front: str, weight_dir: str) -> None:
        self.cfg = cfg
        self.model = model
        self.front = front
        self.weight_dir = weight_dir
        self.rng = random.Random(cfg.seed)
        self.next_index = 0
        self.fresh_seed = 10_000
        self.outcomes: list[Outcome] = []
        self.updates: list[dict[str, Any]] = []
        self.hostile: list[Hostile] = []
        self.refused_responses = 0
        """Background Responses that ended failed (overloaded) and were sent again."""
        self._images: dict[int, bytes] = {}
        self._tokenizer: Any = None
        limits = httpx.Limits(max_connections=8 * cfg.concurrency)
        self.watch = SlotWatch(httpx.AsyncHTTPTransport(limits=limits))

    def image(self, seed: int) -> bytes:
        if seed not in self._images:
            self._images[seed] = png_bytes(seed=seed)
        return self._images[seed]

    def next_op(self) -> Op:
        rng = self.rng
        kind = rng.choice(KINDS)
        prompts = ROLLOUT_PROMPTS if kind == "rollout" else 1
        images = []
        for _ in range(prompts):
            seeds = []
            for _ in range(rng.randint(1, 3)):
                if rng.random() < self.cfg.fresh_share:
                    self.fresh_seed += 1
                    seeds.append(self.fresh_seed)
                else:
                    seeds.append(rng.randrange(IMAGE_POOL))
            images.append(seeds)
        # A Response has one sample (the Responses API has no n).
        sampled = 4 if kind == "rollout" or rng.random() < 0.25 else 1
        op = Op(
            index=self.next_index,
            kind=kind,
            stream=kind in ("chat", "responses") and rng.random() < 0.5,
            n=1 if kind == "responses" else sampled,
            images=images,
        )
        self.next_index += 1
        return op

    def chat(self, op: Op) -> dict[str, Any]:
        return chat_body(
            self.model,
            [data_url(self.image(s)) for s in op.images[0]],
            text=f"Describe image set {op.index % 5}.",
            **op.sampling(self.cfg.max_tokens),
        )

    def response(self, op: Op) -> dict[str, Any]:
        """The chat of ``self.chat(op)`` as a background Response (greedy, one sample)."""
        content: list[dict[str, Any]] = [
            {"type": "input_image", "image_url": data_url(self.image(s))} for s in op.images[0]
        ]
        content.append({"type": "input_text", "text": f"Describe image set {op.index % 5}."})
        return {
            "model": self.model,
            "input": [{"role": "user", "content": content}],
            "background": True,
            "stream": op.stream,
            "temperature": 0.0,
            "max_output_tokens": self.cfg.max_tokens,
        }

    def prompt_ids(self, n_images: int, index: int) -> list[int]:
        """A token-id prompt as a trainer holds it: the chat template with one image
        placeholder per image (render expands each to the image's tokens)."""
        content = [{"type": "image"}] * n_images + [
            {"type": "text", "text": f"Compare these, take {index % 7}."}
        ]
        text = self.tokenizer().apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer().encode(text, add_special_tokens=False))

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model)
        return self._tokenizer

    def client(self, render: str, generate: str, transport: Any = None) -> AsyncTandemClient:
        return AsyncTandemClient(
            render,
            generate,
            model=self.model,
            max_retries=MAX_429_RETRIES,
            weight_dir=self.weight_dir,
            transport=transport,
        )

    async def rollout(self, client: AsyncTandemClient, op: Op) -> Any:
        return await client.rollout(
            [self.prompt_ids(len(imgs), op.index) for imgs in op.images],
            [[self.image(s) for s in imgs] for imgs in op.images],
            n=op.n,
            temperature=1.0,
            max_tokens=self.cfg.max_tokens,
            logprobs=0,
            seed=1000 + op.index,
            progress=False,
        )

    async def run(self, t0: float, deadline: float) -> None:
        async with (
            httpx.AsyncClient(timeout=300, transport=self.watch) as http,
            self.client(self.front, self.front, self.watch) as client,
        ):

            async def loop() -> None:
                while time.monotonic() < deadline:
                    self.outcomes.append(await self.one(http, client, self.next_op()))

            await asyncio.gather(
                self.update_weights(client, t0, deadline),
                self.hostile_clients(deadline),
                *(loop() for _ in range(self.cfg.concurrency)),
            )
        await self.watch.inner.aclose()

    async def hostile_clients(self, deadline: float) -> None:
        """Every ``HOSTILE_EVERY_S``: a compressed generate body through the door that inflates
        to ``INFLATED_BYTES`` (answered, or refused 429 by the count), and while time is left
        for their deadline, two chat bodies that trickle a byte a second into the door (each
        answered 408 ``body_timeout``, their slots freed) and two renders whose answers are never
        read (refused 429, or cut at the send deadline)."""
        frame, _ = inflating_body(
            {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 1}}, INFLATED_BYTES
        )
        headers = {"content-type": "application/json", "content-encoding": "zstd"}
        slow: list[asyncio.Future[list[int | None]]] = []
        unread: list[asyncio.Future[list[int | None]]] = []
        async with httpx.AsyncClient(timeout=300) as http:
            while time.monotonic() + HOSTILE_EVERY_S < deadline:
                if time.monotonic() + BODY_TIMEOUT_S + HOSTILE_EVERY_S < deadline:
                    slow.append(asyncio.ensure_future(asyncio.to_thread(self._trickle)))
                if time.monotonic() + SEND_TIMEOUT_S + HOSTILE_EVERY_S < deadline:
                    unread.append(asyncio.ensure_future(asyncio.to_thread(self._unread)))
                r = await http.post(
                    f"{self.front}/inference/v1/generate", content=frame, headers=headers
                )
                self.hostile.append(Hostile("compressed", r.status_code, (200, 429)))
                await asyncio.sleep(HOSTILE_EVERY_S)
        for statuses in await asyncio.gather(*slow):
            self.hostile += [Hostile("slow", st, (408,)) for st in statuses]
        for statuses in await asyncio.gather(*unread):
            self.hostile += [Hostile("unread", st, (200, 429)) for st in statuses]

    def _trickle(self) -> list[int | None]:
        with SlowBodies(self.front, "/v1/chat/completions", 2, every_s=1.0) as bodies:
            limit = time.monotonic() + BODY_TIMEOUT_S + HOSTILE_EVERY_S
            while bodies.holding and time.monotonic() < limit:
                time.sleep(0.5)
        return bodies.statuses

    def _unread(self) -> list[int | None]:
        images = [data_url(photo_jpeg(seed), "image/jpeg") for seed in range(UNREAD_IMAGES)]
        body = json.dumps(chat_body(self.model, images)).encode()
        path = "/v1/chat/completions/render"
        with NonReaders(self.front, path, 2, body) as readers:
            limit = time.monotonic() + SEND_TIMEOUT_S + HOSTILE_EVERY_S
            statuses: list[int | None] = [None] * readers.count
            while time.monotonic() < limit:
                # The status line is peeked at (left unread) before the cut resets it away.
                seen = readers.statuses()
                statuses = [old or new for old, new in zip(statuses, seen, strict=True)]
                if all(s is not None for s in statuses) and readers.cut() == statuses.count(200):
                    return statuses
                time.sleep(0.5)
        return [s if s == 429 else None for s in statuses]

    async def update_weights(self, client: AsyncTandemClient, t0: float, deadline: float) -> None:
        """The served weights reloaded under a new label every period (the same numbers, so
        tokens stay replayable; the engine still drops its prefix and encoder caches)."""
        name, tensor = served_tensor(self.model)
        k = 0
        while True:
            due = t0 + (k + 0.5) * self.cfg.weight_every_s
            if due >= deadline:
                return
            await asyncio.sleep(due - time.monotonic())
            began = time.monotonic()
            record: dict[str, Any] = {"t": began - t0, "version": f"soak-{k}"}
            try:
                await client.update_weights({name: tensor}, version=f"soak-{k}")
            except Exception as exc:  # reported as a failure, the load goes on
                record["error"] = f"{type(exc).__name__}: {exc}"[:300]
            record["seconds"] = time.monotonic() - began
            self.updates.append(record)
            k += 1

    async def one(self, http: httpx.AsyncClient, client: AsyncTandemClient, op: Op) -> Outcome:
        started = time.monotonic()
        outcome = Outcome(op, started, 0.0, 0)
        try:
            if op.kind == "chat":
                await self._chat(http, op, outcome)
            elif op.kind == "trl":
                await self._trl(http, op, outcome)
            elif op.kind == "responses":
                await self._responses(http, op, outcome)
            else:
                result = await self.rollout(client, op)
                outcome.status = 200
                outcome.tokens = result.completion_ids
                outcome.versions = result.versions()
        except Exception as exc:  # the client's typed errors and httpx's alike
            outcome.status = int(getattr(exc, "status_code", 0) or 0)
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]
        outcome.latency = time.monotonic() - started
        return outcome

    async def _send(self, http: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
        """POST through the door (the answer's stream left open), 429s retried after their
        Retry-After; the last answer is returned whatever it is."""
        for _ in range(MAX_429_RETRIES):
            request = http.build_request("POST", f"{self.front}{path}", json=body)
            response = await http.send(request, stream=True)
            if response.status_code != 429:
                break
            await response.aclose()
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
        return response

    async def _trl(self, http: httpx.AsyncClient, op: Op, outcome: Outcome) -> None:
        # As TRL's VLLMClient: render, then generate from the token ids and features with
        # its own sampling fields, a trl- request id and FINAL_ONLY output.
        r = await self._send(http, "/v1/chat/completions/render", self.chat(op))
        rendered = await self._document(r, outcome)
        if rendered is None:
            return
        body = {
            "request_id": op.request_id(),
            "model": self.model,
            "token_ids": rendered["token_ids"],
            "features": rendered["features"],
            "sampling_params": {
                **op.sampling(self.cfg.max_tokens),
                "logprobs": 1,
                "output_kind": 2,
            },
        }
        answer = await self._document(
            await self._send(http, "/inference/v1/generate", body), outcome
        )
        if answer is None:
            return
        if answer.get("request_id") != op.request_id():
            outcome.error = f"answered with request id {answer.get('request_id')}"
            return
        choices = sorted(answer["choices"], key=lambda c: c["index"])
        for choice in choices:
            entries = (choice.get("logprobs") or {}).get("content") or []
            if not entries or any("token" not in e for e in entries):
                outcome.error = "logprobs not in TRL's shape (no token strings)"
                return
        outcome.tokens = [c["token_ids"] for c in choices]

    async def _responses(self, http: httpx.AsyncClient, op: Op, outcome: Outcome) -> None:
        # A background Response ends failed (code overloaded) when generate was full as its
        # run reached it: the caller learns it only then, and sends it again.
        ended: dict[str, Any] = {}
        for _ in range(MAX_429_RETRIES):
            answer = await self._response_ended(http, op, outcome)
            if answer is None:
                return
            ended = answer
            error = ended.get("error") or {}
            if ended["status"] != "failed" or error.get("code") != "overloaded":
                break
            self.refused_responses += 1
            await asyncio.sleep(1.0)
        # Incomplete at max_output_tokens is the answer the request asked for.
        reason = (ended.get("incomplete_details") or {}).get("reason")
        if ended["status"] != "completed" and reason != "max_output_tokens":
            outcome.error = f"response {ended['status']}: {ended.get('error')}"[:300]
            return
        (message,) = [o for o in ended["output"] if o["type"] == "message"]
        outcome.text = "".join(c["text"] for c in message["content"])

    async def _response_ended(
        self, http: httpx.AsyncClient, op: Op, outcome: Outcome
    ) -> dict[str, Any] | None:
        """The op's Response once its run has ended, or None with the failure noted."""
        response = await self._send(http, "/v1/responses", self.response(op))
        if op.stream:
            return await self._response_events(response, outcome)
        queued = await self._document(response, outcome)
        if queued is None:
            return None
        while True:  # asked for every 0.2 s
            r = await http.get(f"{self.front}/v1/responses/{queued['id']}")
            r.raise_for_status()
            answer: dict[str, Any] = r.json()
            if answer["status"] in RESPONSE_ENDS:
                return answer
            await asyncio.sleep(0.2)

    async def _response_events(
        self, response: httpx.Response, outcome: Outcome
    ) -> dict[str, Any] | None:
        """The response its background stream ends with (an ``error`` event: ``failed`` with
        that error), or None with the failure noted."""
        try:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")[:300]
                return None
            last: dict[str, Any] | None = None
            async for line in sse_lines(response):
                if line.startswith("data: {"):
                    last = json.loads(line[6:])
        finally:
            await response.aclose()
        if last is not None and last.get("type") == "error":
            return {"status": "failed", "error": last}
        if last is None or last.get("response", {}).get("status") not in RESPONSE_ENDS:
            outcome.error = f"the background stream ended with {last}"[:300]
            return None
        ended: dict[str, Any] = last["response"]
        return ended

    async def _document(self, response: httpx.Response, outcome: Outcome) -> Any:
        """The answer's JSON, or None with the failure noted."""
        try:
            outcome.status = response.status_code
            raw = await response.aread()
        finally:
            await response.aclose()
        if response.status_code != 200:
            outcome.error = raw.decode(errors="replace")[:300]
            return None
        return json.loads(raw)

    async def _chat(self, http: httpx.AsyncClient, op: Op, outcome: Outcome) -> None:
        body = {**self.chat(op), "return_token_ids": True, "stream": op.stream}
        response = await self._send(http, "/v1/chat/completions", body)
        if not op.stream:
            answer = await self._document(response, outcome)
            if answer is not None:
                choices = sorted(answer["choices"], key=lambda c: c["index"])
                outcome.tokens = [c["token_ids"] for c in choices]
            return
        try:
            outcome.status = response.status_code
            if response.status_code != 200:
                outcome.error = (await response.aread()).decode(errors="replace")[:300]
                return
            tokens: dict[int, list[int]] = {}
            async for line in sse_lines(response):
                if not line.startswith("data: {"):
                    continue
                try:
                    chunk = json.loads(line[6:])
                except json.JSONDecodeError as exc:  # a broken event: the server's fault
                    outcome.error = f"unreadable stream event: {exc}"
                    return
                for choice in chunk["choices"]:
                    tokens.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
            outcome.tokens = [tokens.get(i, []) for i in range(op.n)]
        finally:
            await response.aclose()


def served_tensor(model: str) -> tuple[str, Any]:
    """One whole tensor of the served checkpoint (the output projection when it has one)."""
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for file in sorted(Path(model).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    name = "lm_head.weight" if "lm_head.weight" in tensors else sorted(tensors)[0]
    return name, tensors[name]


async def replay(
    load: Load,
    http: httpx.AsyncClient,
    client: AsyncTandemClient,
    render: str,
    generate: str,
    op: Op,
) -> list[list[int]]:
    """The op's tokens from the same request sent alone, direct to render and generate."""
    if op.kind == "rollout":
        result = await load.rollout(client, op)
        return list(result.completion_ids)
    r = await http.post(f"{render}/v1/chat/completions/render", json=load.chat(op))
    r.raise_for_status()
    g = await http.post(f"{generate}/inference/v1/generate", json=r.json())
    g.raise_for_status()
    choices = sorted(g.json()["choices"], key=lambda c: c["index"])
    return [c["token_ids"] for c in choices]


@dataclass
class Report:
    requests: int
    by_kind: dict[str, int]
    windows: list[dict[str, float]]
    rss: dict[str, dict[str, float]]
    overloaded: int
    responses_refused: int
    """Background Responses that ended failed (overloaded), then sent again."""
    replayed: int
    updates: list[dict[str, Any]]
    versions_seen: list[str]
    failures: list[str]


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def windows(load: Load, t0: float, width: float) -> list[dict[str, float]]:
    rows = []
    outcomes = load.outcomes
    end = max((o.started + o.latency for o in outcomes), default=t0)
    start = t0
    while start < end:
        done = [o for o in outcomes if start <= o.started + o.latency < start + width]
        lat = [o.latency * 1000 for o in done if o.status == 200]
        rows.append(
            {
                "t": start - t0,
                "answered": float(len(done)),
                "req_per_s": sum(o.op.generate_requests for o in done) / width,
                "p50_ms": percentile(lat, 50),
                "p95_ms": percentile(lat, 95),
                "p99_ms": percentile(lat, 99),
                "overloaded": float(
                    sum(1 for x in load.watch.overloads if start <= x.at < start + width)
                ),
                "updates": float(
                    sum(1 for u in load.updates if start - t0 <= u["t"] < start - t0 + width)
                ),
            }
        )
        start += width
    return rows


async def held_slots(generate: str) -> float:
    """Requests generate still counts as admitted (its own gauge), once the load has ended."""
    await asyncio.sleep(2.0)
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{generate}/metrics")).text
    for line in text.splitlines():
        if line.startswith("tandem_generate_pending "):
            return float(line.split()[1])
    return float("nan")


@dataclass
class Counts:
    """Access-log 200s during the load, per server and route."""

    generate: int
    render: int
    door_chat: int
    door_responses: int
    """POSTs answered 200: queued (then read to their end) or their background stream."""
    door_generate: int
    door_render: int


def count_200s(stack_servers: dict[str, ServerProcess]) -> Counts:
    door = stack_servers["front"]
    return Counts(
        generate=access_count(stack_servers["generate"], ("/inference/v1/generate",)),
        render=access_count(
            stack_servers["render"], ("/v1/chat/completions/render", "/v1/completions/render")
        ),
        door_chat=access_count(door, ("/v1/chat/completions",)),
        door_responses=access_count(door, ("/v1/responses",)),
        door_generate=access_count(door, ("/inference/v1/generate",)),
        door_render=access_count(door, ("/v1/chat/completions/render", "/v1/completions/render")),
    )


def check(
    cfg: SoakConfig,
    load: Load,
    counted: Counts,
    held_after: float,
    served_version: str,
    rss: dict[str, dict[str, float]],
    mismatches: list[str],
) -> list[str]:
    failures: list[str] = []
    outcomes = load.outcomes
    for o in outcomes:
        if o.status >= 500 or o.status == 0 or o.error:
            failures.append(f"op {o.op.index} ({o.op.kind}): {o.status} {o.error}")
        elif o.op.kind == "responses":
            if o.text is None:
                failures.append(f"op {o.op.index} (responses): completed without a message")
        elif o.tokens is None or len(o.tokens) != o.op.n * len(o.op.images):
            failures.append(f"op {o.op.index} ({o.op.kind}): {o.tokens and len(o.tokens)} samples")
        elif any(not t for t in o.tokens):
            failures.append(f"op {o.op.index} ({o.op.kind}): a sample without tokens")
    if held_after != 0:
        failures.append(f"generate still holds {held_after} admission slots after the load")
    ok = [o for o in outcomes if o.status == 200 and not o.error]
    kinds = {k: [o for o in ok if o.op.kind == k] for k in set(KINDS)}
    rollout_prompts = sum(o.op.generate_requests for o in kinds["rollout"])
    # The door renders a chat completion again when generate refused it (429) and it is sent
    # again: render answers those too.
    chat_refused = sum(1 for x in load.watch.overloads if x.path == "/v1/chat/completions")
    # What each server must have answered with 200, once each: every chat op and Response is
    # one render and one generate request behind the door; a TRL op one of each through it; a
    # rollout one render request (its prompts in one batch) and one generate request per
    # prompt. A Response that ended failed (overloaded) was rendered, and sent again.
    inflated = sum(1 for h in load.hostile if h.kind == "compressed" and h.status == 200)
    # A render nobody read was still answered 200 (and logged) before it was cut.
    unread = sum(1 for h in load.hostile if h.kind == "unread" and h.status == 200)
    expected = Counts(
        generate=len(ok) - len(kinds["rollout"]) + rollout_prompts + inflated,
        render=len(ok) + chat_refused + unread + load.refused_responses,
        door_chat=len(kinds["chat"]),
        door_responses=len(kinds["responses"]) + load.refused_responses,
        door_generate=len(kinds["trl"]) + rollout_prompts + inflated,
        door_render=len(kinds["trl"]) + len(kinds["rollout"]) + unread,
    )
    for name, want in asdict(expected).items():
        got = getattr(counted, name)
        if got != want:
            failures.append(
                f"{name}: {got} requests answered 200 in the access log; {want} succeeded"
            )
    for x in load.watch.overloads:
        if not x.justified:
            failures.append(
                f"a 429 on {x.path} its process's own count does not justify: {x.details}"
            )
    for h in load.hostile:
        if h.status not in h.expected:
            failures.append(f"hostile {h.kind}: answered {h.status}, expected one of {h.expected}")
    due = math.ceil(cfg.seconds / cfg.weight_every_s - 0.5)  # at 0.5, 1.5, ... periods
    if len(load.updates) < due:
        failures.append(f"{len(load.updates)} weight updates ran; {due} were due")
    for u in load.updates:
        if "error" in u:
            failures.append(f"weight update {u['version']}: {u['error']}")
    if load.updates and served_version != load.updates[-1]["version"]:
        failures.append(f"serving {served_version!r} after the last update {load.updates[-1]}")
    for name, row in rss.items():
        allowed = max(RSS_SLACK_BYTES, RSS_SLACK_RATIO * row["warm"])
        if row["end"] - row["warm"] > allowed:
            failures.append(
                f"{name}: RSS grew {(row['end'] - row['warm']) / 2**20:.0f} MiB after warm-up"
            )
    return failures + mismatches


def plot(report: Report, rss_series: dict[str, list[tuple[float, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    t = [w["t"] for w in report.windows]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        top.plot(t, [w[key] for w in report.windows], marker="o", label=key.split("_")[0])
    for u in report.updates:
        top.axvline(u["t"], color="grey", linestyle=":", linewidth=1)
    top.set_ylabel("latency per op (ms)")
    top.set_title(
        f"Tandem soak through the door: {report.requests} ops, {report.overloaded} 429s "
        f"(retried), {len(report.updates)} weight updates (dotted)"
    )
    top.legend()
    for name, series in rss_series.items():
        bottom.plot([s[0] for s in series], [s[1] / 2**20 for s in series], label=name)
    bottom.set_ylabel("RSS (MiB)")
    bottom.set_xlabel("seconds since start")
    bottom.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class ServerExited(RuntimeError):
    """A service's process ended during the soak (its log tail in the message)."""


async def until_one_exits(servers: dict[str, ServerProcess], work: Awaitable[None]) -> None:
    """``work``, stopped with ``ServerExited`` as soon as any server's process ends: the load
    would otherwise wait on its retries and timeouts for many minutes, and hide the cause."""
    task = asyncio.ensure_future(work)
    while not task.done():
        gone = [s for s in servers.values() if s.proc.poll() is not None]
        if gone:
            task.cancel()
            s = gone[0]
            raise ServerExited(f"{s.name} exited ({s.proc.returncode}):\n{s.log_text()}")
        await asyncio.wait({task}, timeout=1.0)
    task.result()


async def soak(
    cfg: SoakConfig,
    model: str,
    servers: dict[str, ServerProcess],
    weight_dir: str,
) -> tuple[Report, Load]:
    """Drive the load against running services (``servers``: ``render``, ``generate`` and
    ``front``; their processes' RSS is sampled and their access logs read)."""
    render, generate, front = (servers[k].url for k in ("render", "generate", "front"))
    procs = processes(list(servers.values()))
    rss_series: dict[str, list[tuple[float, float]]] = {n: [] for n in procs}
    load = Load(cfg, model, front, weight_dir)
    load.prompt_ids(1, 0)  # the tokenizer loads before the clock starts
    before = count_200s(servers)
    t0 = time.monotonic()
    stop = asyncio.Event()

    async def sample_rss() -> None:
        while not stop.is_set():
            for name, p in procs.items():
                try:
                    rss_series[name].append((time.monotonic() - t0, float(p.memory_info().rss)))
                except psutil.Error:
                    pass
            try:
                await asyncio.wait_for(stop.wait(), cfg.rss_every_s)
            except TimeoutError:
                pass

    sampler = asyncio.create_task(sample_rss())
    await until_one_exits(servers, load.run(t0, t0 + cfg.seconds))
    stop.set()
    await sampler
    after = count_200s(servers)
    counted = Counts(**{k: v - getattr(before, k) for k, v in asdict(after).items()})
    held_after = await held_slots(generate)

    rss: dict[str, dict[str, float]] = {}
    for name, series in rss_series.items():
        if not series:
            continue
        warm = min(series, key=lambda s: abs(s[0] - cfg.warm_share * cfg.seconds))[1]
        rss[name] = {"start": series[0][1], "warm": warm, "end": series[-1][1]}

    # Replays are requests too: the access-log counts above were taken before them.
    mismatches: list[str] = []
    done = [
        o
        for o in load.outcomes
        if o.status == 200 and (o.tokens or o.text is not None) and not o.error
    ]
    sample = random.Random(cfg.seed).sample(done, min(cfg.replay, len(done)))
    async with (
        httpx.AsyncClient(timeout=300) as http,
        load.client(render, generate) as direct,
    ):
        served_version = (await http.get(f"{front}/weight_info")).json()["weight_version"]
        for o in sample:
            alone = await replay(load, http, direct, render, generate, o.op)
            if o.op.kind == "responses":
                # vLLM writes a Response's text from its tokens as it writes a chat's: an
                # unfinished UTF-8 sequence at the end (decoded alone as U+FFFD) is held back.
                decoded = load.tokenizer().decode(alone[0], skip_special_tokens=True)
                alone_text = decoded.rstrip("\ufffd")
                if alone_text != (o.text or "").rstrip("\ufffd"):
                    mismatches.append(
                        f"op {o.op.index} (responses, stream={o.op.stream}): {o.text!r} under "
                        f"load, {alone_text!r} alone ({alone[0]})"
                    )
            elif alone != o.tokens:
                mismatches.append(
                    f"op {o.op.index} ({o.op.kind}, n={o.op.n}, stream={o.op.stream}): "
                    f"{o.tokens} under load, {alone} alone"
                )
    by_kind: dict[str, int] = {}
    for o in load.outcomes:
        by_kind[o.op.kind] = by_kind.get(o.op.kind, 0) + 1
    report = Report(
        requests=len(load.outcomes),
        by_kind=by_kind,
        windows=windows(load, t0, cfg.window_s),
        rss=rss,
        overloaded=len(load.watch.overloads),
        responses_refused=load.refused_responses,
        replayed=len(sample),
        updates=load.updates,
        versions_seen=sorted({v or "?" for o in load.outcomes for v in o.versions}),
        failures=[],
    )
    report.failures = check(cfg, load, counted, held_after, served_version, rss, mismatches)
    cfg.out.mkdir(parents=True, exist_ok=True)
    plot(report, rss_series, cfg.out / "soak.png")
    raw = {
        "config": {**asdict(cfg), "out": str(cfg.out)},
        "report": asdict(report),
        "access_log_200s": asdict(counted),
        "rss_series": rss_series,
    }
    (cfg.out / "soak.json").write_text(json.dumps(raw, indent=1))
    return report, load


def print_report(report: Report, cfg: SoakConfig) -> None:
    print(f"\n{report.requests} ops in {cfg.seconds:.0f} s at concurrency {cfg.concurrency}")
    print(f"by kind: {report.by_kind}; 429s (then retried): {report.overloaded}")
    print(f"background Responses ended failed (overloaded), sent again: {report.responses_refused}")
    print(f"weight updates: {len(report.updates)}; versions rollouts saw: {report.versions_seen}")
    print(f"replayed alone: {report.replayed}\n")
    print("| t (s) | ops answered | generate req/s | p50 ms | p95 ms | p99 ms | 429s | updates |")
    print("|---|---|---|---|---|---|---|---|")
    for w in report.windows:
        print(
            f"| {w['t']:.0f} | {w['answered']:.0f} | {w['req_per_s']:.1f} | {w['p50_ms']:.0f} "
            f"| {w['p95_ms']:.0f} | {w['p99_ms']:.0f} | {w['overloaded']:.0f} "
            f"| {w['updates']:.0f} |"
        )
    print("\n| process | RSS start MiB | after warm-up | end | growth |")
    print("|---|---|---|---|---|")
    for name, row in report.rss.items():
        mib = {k: v / 2**20 for k, v in row.items()}
        print(
            f"| {name} | {mib['start']:.0f} | {mib['warm']:.0f} | {mib['end']:.0f} "
            f"| {mib['end'] - mib['warm']:+.0f} |"
        )
    lat = [w["p50_ms"] for w in report.windows if w["answered"]]
    if lat:
        print(f"\nmedian of window p50s: {statistics.median(lat):.0f} ms")
    print(f"plot and raw numbers: {cfg.out}/soak.png, soak.json")
    print("\nPASS" if not report.failures else "\nFAIL:\n  " + "\n  ".join(report.failures[:30]))


def run(cfg: SoakConfig, model: str | None = None) -> Report:
    """Start the stack, soak it, stop it."""
    model = model or str(ensure_model("qwen2-vl"))
    stack = Stack(model, cfg.generate_max_pending)
    servers = {"render": stack.render, "generate": stack.generate, "front": stack.front}
    try:
        report, _ = asyncio.run(soak(cfg, model, servers, stack.weight_dir))
    finally:
        stack.stop()
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=SoakConfig.seconds)
    p.add_argument("--concurrency", type=int, default=SoakConfig.concurrency)
    p.add_argument("--generate-max-pending", type=int, default=SoakConfig.generate_max_pending)
    p.add_argument("--replay", type=int, default=SoakConfig.replay)
    p.add_argument("--fresh-share", type=float, default=SoakConfig.fresh_share)
    p.add_argument("--weight-every", type=float, default=SoakConfig.weight_every_s)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=SoakConfig.out)
    p.add_argument("--model", help="model folder (default: the tiny Qwen2-VL)")
    args = p.parse_args()
    cfg = SoakConfig(
        seconds=args.seconds,
        concurrency=args.concurrency,
        generate_max_pending=args.generate_max_pending,
        replay=args.replay,
        fresh_share=args.fresh_share,
        weight_every_s=args.weight_every,
        seed=args.seed,
        out=args.out,
        window_s=max(10.0, args.seconds / 20),
    )
    report = run(cfg, args.model)
    print_report(report, cfg)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

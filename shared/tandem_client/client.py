"""The async client: render, generate (sending each item's tensors to a node once), chat, and
the RL trainer's control calls (pause/resume, weight updates) on every generate node."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import httpx
import msgspec

from tandem_wire import (
    ANY_WIRE_TRANSFORM,
    BODY_CODING_HEADER,
    DEFAULT_ZSTD_LEVEL,
    IDENTITY,
    MIN_COMPRESSED_BYTES,
    WIRE_TRANSFORMS_HEADER,
    ZSTD,
    GenerateRequest,
    GenerateResponse,
    GenerateTextResponse,
    PayloadTooLarge,
    WireError,
    WireFormat,
    accepts_coding,
    body_coding,
    compress_zstd,
    content_id,
    decode_body,
    decode_document,
    decode_generate_request,
    decode_generate_requests,
    encode_generate_request,
    error_types,
)
from tandem_wire.control import UpdateReceipt

from . import fleet
from .discovery import NodeSource
from .errors import (
    CacheMissError,
    FleetPartialFailure,
    PayloadTooLargeError,
    ServerError,
    ServiceError,
    TandemError,
    TransportError,
    error_from_response,
)
from .media import ImageLike, MediaLike, image_source, media_source
from .poller import FleetPoller
from .rollout import RolloutResult, rollout
from .routing import ROUTE_KEY_HEADER, RoundRobin, affinity_key
from .unix_nodes import node_client
from .weights import write_safetensors

__all__ = ["AsyncTandemClient"]

_MAX_RETRY_DELAY_S = 30.0
"""The longest wait before a retry, a server's Retry-After or the backoff's doubling: without
it, the tenth retry of a node that is down waited 2-6 minutes (the default 0.5 s doubled)."""


@dataclass(frozen=True, slots=True)
class _Answer:
    """One answer, its body decoded from its content coding."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    packed: bytes | None = None
    """The body as received when it came zstd-compressed: passed on to generate as it is."""


class _Held:
    """Which items (tenant, mm_hash) one generate node holds, as far as this client knows."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._keys: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._keys

    def add(self, key: tuple[str, str]) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.limit:
            self._keys.popitem(last=False)

    def discard(self, key: tuple[str, str]) -> None:
        self._keys.pop(key, None)

    def clear(self) -> None:
        self._keys.clear()


def _strings(urls: str | Sequence[str]) -> list[str]:
    return [urls.rstrip("/")] if isinstance(urls, str) else [u.rstrip("/") for u in urls]


class AsyncTandemClient:
    """Talks to one or more render and generate nodes.

    Binary (msgpack) bodies by default; ``binary=False`` speaks upstream-compatible JSON, which
    also works against upstream vLLM's render and generate servers. In binary, render is asked
    for the model's exact wire transforms (``wire_transforms``: ``"*"`` for all, names, or None
    for none), e.g. Qwen-VL images with their repeated temporal patches sent once; the client
    passes items on as bytes and never needs to understand them, the generate node undoes them.
    Connection errors and 429/503 answers are retried with exponential backoff (at most
    ``max_retries`` times, each wait at most 30 s); input errors (other 4xx) never are. A
    generate node that cannot be reached or answers 503 (its engine died) is skipped for
    ``node_cooldown_s`` and its requests move to the next node in their affinity order, with
    the items that node lacks. A node unreachable for longer than ``node_timeout_s`` leaves the
    fleet (``tandem_client.fleet``): the others' weights decide and updates go on without it.
    Control calls that load nothing (version checks, start, abort, pause, resume) wait at most
    ``control_timeout_s`` for a node. The client judges the fleet as the front door does: at
    its first call it asks every generate node what it holds and sends nothing before each
    answered or timed out, then asks again every ``fence_poll_s`` in the background (until
    ``aclose``).

    ``compression="zstd"`` (binary only) asks render for zstd-compressed answers and compresses
    generate bodies (``compression_level``) toward nodes that advertise zstd in their answers'
    ``Accept-Encoding`` (asked once per node at ``/health``; a 415 resends the body plain). A
    compressed render answer goes on to generate as it came. Under ``"*"`` it also takes the
    transforms that pay only under compression (Qwen-VL row deltas). It trades CPU on both sides
    (about 2-3 ms per MB to compress, 3 to decompress and undo the deltas, on this project's
    machine) for 32-55% fewer bytes on real photographs: worth it on links slower than a few
    Gbit/s, not on a fast local network. Answers are decoded with
    their size capped at ``max_answer_bytes`` before anything is allocated.

    ``api_key`` is sent on every call; ``admin_api_key`` (one of the nodes' ``--admin-api-key``)
    instead of it on the calls that change engine state (``pause``, ``resume``,
    ``update_weights``), so that a trainer can hold both: its rollouts run under the
    inference key. Without it those calls send ``api_key``.
    """

    def __init__(
        self,
        render_urls: str | Sequence[str],
        generate_urls: str | Sequence[str] | NodeSource,
        *,
        model: str | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        binary: bool = True,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        held_items_per_node: int = 100_000,
        wire_transforms: str | Sequence[str] | None = ANY_WIRE_TRANSFORM,
        node_cooldown_s: float = 10.0,
        node_timeout_s: float = 10.0,
        control_timeout_s: float = 10.0,
        fence_poll_s: float = 2.0,
        weight_dir: str | os.PathLike[str] | None = None,
        compression: str | None = None,
        compression_level: int = DEFAULT_ZSTD_LEVEL,
        max_answer_bytes: int = 1 << 30,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if compression not in (None, ZSTD):
            raise ValueError(f"compression must be None or {ZSTD!r}, not {compression!r}")
        self.model = model
        self.weight_dir = weight_dir
        self.fmt = WireFormat.MSGPACK if binary else WireFormat.JSON
        # Only binary bodies are compressed (JSON stays upstream's exchange, byte for byte).
        self.compression = compression if binary else None
        self.compression_level = compression_level
        self.max_answer_bytes = max_answer_bytes
        names = [wire_transforms] if isinstance(wire_transforms, str) else wire_transforms or []
        # Only binary answers carry transforms (render keeps JSON upstream's), so only then.
        self._render_headers = (
            {WIRE_TRANSFORMS_HEADER: ", ".join(names)} if binary and names else {}
        )
        if self.compression:
            self._render_headers["accept-encoding"] = self.compression
            self._render_headers[BODY_CODING_HEADER] = self.compression
        self.render_nodes = RoundRobin(_strings(render_urls))
        # dns+http://NAME:PORT entries are looked up at the first call and again once the
        # source's interval has passed (see tandem_client.discovery).
        self._generate_source = (
            generate_urls
            if isinstance(generate_urls, NodeSource)
            else NodeSource(_strings(generate_urls))
        )
        self._discovering = asyncio.Lock()
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self._held_items_per_node = held_items_per_node
        self._held: dict[str, _Held] = {}
        self.node_cooldown_s = node_cooldown_s
        self.node_timeout_s = node_timeout_s
        self.control_timeout_s = control_timeout_s
        self.fence_poll_s = fence_poll_s
        self.timeout_s = timeout_s
        self._nodes: dict[str, fleet.Node] = {}
        self._poller: FleetPoller[fleet.Node] = FleetPoller(
            self._ask, self._every_node, node_timeout_s, fence_poll_s, self._learnt
        )
        """What this client knows of the generate nodes' weights (shared with the door's)."""
        # Nodes that failed since they last told their weight version: asked before new work
        # (a node that comes back is a new process, maybe with its checkpoint's weights).
        self._suspect: set[str] = set()
        # Per generate node: whether it decodes zstd bodies (absent: not asked yet).
        self._zstd_nodes: dict[str, bool] = {}
        self._probes: dict[str, asyncio.Lock] = {}
        self.generate_urls: list[str] = []
        self._generate_nodes_are(self._generate_source.urls)
        self._slots = asyncio.Semaphore(max_concurrency)
        # Answers come uncompressed unless asked for (httpx would offer every coding it has).
        headers = {"accept-encoding": IDENTITY}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        # httpx merges these over the client's own headers on each control call.
        self._control_headers = (
            {"authorization": f"Bearer {admin_api_key}"} if admin_api_key else {}
        )
        limits = httpx.Limits(max_connections=2 * max_concurrency)
        nodes = [*self.render_nodes.urls, *(s.text for s in self._generate_source.specs)]
        self._http = node_client(
            nodes, limits, timeout=timeout_s, headers=headers, transport=transport, limits=limits
        )

    async def __aenter__(self) -> AsyncTandemClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._poller.aclose()
        await self._http.aclose()

    # -- transport ---------------------------------------------------------------------------

    def _encode(self, body: Any) -> bytes:
        return (
            msgspec.msgpack.encode(body)
            if self.fmt is WireFormat.MSGPACK
            else msgspec.json.encode(body)
        )

    async def _post(
        self,
        url: str,
        content: bytes,
        fmt: WireFormat | None = None,
        *,
        failover: bool = False,
        route_key: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
    ) -> _Answer:
        """POST with retries; with ``failover``, an unreachable node or a 503 raises at once
        (the caller moves the request to another node instead of waiting on this one)."""
        fmt = fmt or self.fmt
        headers = {"content-type": fmt.content_type, "accept": fmt.content_type}
        headers.update(extra_headers or {})
        if route_key:
            headers[ROUTE_KEY_HEADER] = route_key
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                async with self._slots:
                    r = await self._send(url, content, headers)
            except httpx.TransportError as exc:
                if last or failover:
                    raise TransportError(f"{url}: {type(exc).__name__}: {exc}") from exc
                await asyncio.sleep(self._delay(attempt))
                continue
            if r.status_code < 400:
                return r
            retry = r.status_code == 429 or (r.status_code == 503 and not failover)
            if retry and not last:
                await asyncio.sleep(self._delay(attempt, r.headers.get("retry-after")))
                continue
            raise error_from_response(r.status_code, _error_body(r), url)
        raise AssertionError("unreachable")

    async def _send(self, url: str, content: bytes, headers: Mapping[str, str]) -> _Answer:
        """One POST; the answer read as sent and decoded here, so that a compressed one is
        capped (httpx would inflate it without a bound) and kept for passing on."""
        request = self._http.build_request("POST", url, content=content, headers=headers)
        r = await self._http.send(request, stream=True)
        chunks = []
        coding: str | None = None
        try:
            total = 0
            async for chunk in r.aiter_raw():
                total += len(chunk)
                if total > self.max_answer_bytes:
                    raise PayloadTooLargeError(
                        f"answer exceeds {self.max_answer_bytes} bytes",
                        type=error_types.PAYLOAD_TOO_LARGE,
                        status_code=413,
                        url=url,
                    )
                chunks.append(chunk)
        except httpx.StreamConsumed:
            # An in-memory transport's answer, read (and decoded) before it got here.
            chunks, coding = [r.content], IDENTITY
        finally:
            await r.aclose()
        wire = b"".join(chunks)
        try:
            coding = coding or body_coding(r.headers.get("content-encoding"))
            body = decode_body(wire, coding, self.max_answer_bytes)
        except PayloadTooLarge as exc:
            raise PayloadTooLargeError(
                exc.message, type=exc.type, status_code=exc.status_code, url=url
            ) from None
        except WireError as exc:
            raise ServerError(
                f"unreadable answer: {exc.message}", type=exc.type, status_code=502, url=url
            ) from None
        return _Answer(r.status_code, r.headers, body, wire if coding == ZSTD else None)

    def _delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after and retry_after.replace(".", "", 1).isdigit():
            return min(float(retry_after), _MAX_RETRY_DELAY_S)
        backoff: float = self.backoff_s * (2**attempt) * (0.5 + random.random())
        return min(backoff, _MAX_RETRY_DELAY_S)

    # -- render --------------------------------------------------------------------------------

    async def render_chat(
        self, messages: list[dict[str, Any]], *, model: str | None = None, **fields: Any
    ) -> GenerateRequest[Any]:
        """Render an OpenAI chat conversation; image parts may hold bytes or PIL images too."""
        request, _ = await self._render_chat(messages, model=model, **fields)
        return request

    async def _render_chat(
        self, messages: list[dict[str, Any]], *, model: str | None = None, **fields: Any
    ) -> tuple[GenerateRequest[Any], _Answer]:
        body = {"model": model or self.model, "messages": self._messages(messages), **fields}
        url = f"{self.render_nodes.pick()}/v1/chat/completions/render"
        r = await self._post(
            url, self._encode(_drop_none(body)), extra_headers=self._render_headers
        )
        return decode_generate_request(r.content, self._answer_format(r)), r

    async def render_completion(
        self,
        prompt: str | list[int] | list[str] | list[list[int]],
        *,
        images: Sequence[Sequence[ImageLike] | None] | None = None,
        videos: Sequence[Sequence[MediaLike] | None] | None = None,
        audios: Sequence[Sequence[MediaLike] | None] | None = None,
        model: str | None = None,
        **fields: Any,
    ) -> list[GenerateRequest[Any]]:
        """Render prompts given as text or token ids (never re-tokenized), with ``images``,
        ``videos`` and ``audios``: each one list (or None) per prompt, whose items follow
        that modality's placeholders in the prompt (videos and clips as bytes or URLs)."""
        body: dict[str, Any] = {"model": model or self.model, "prompt": prompt, **fields}
        binary = self.fmt is WireFormat.MSGPACK
        if images is not None:
            body["images"] = [
                None if imgs is None else [image_source(i, binary=binary) for i in imgs]
                for imgs in images
            ]
        for name, given in (("videos", videos), ("audios", audios)):
            if given is not None:
                body[name] = [
                    None if items is None else [media_source(i, binary=binary) for i in items]
                    for items in given
                ]
        url = f"{self.render_nodes.pick()}/v1/completions/render"
        r = await self._post(
            url, self._encode(_drop_none(body)), extra_headers=self._render_headers
        )
        return decode_generate_requests(r.content, self._answer_format(r))

    def _messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        binary = self.fmt is WireFormat.MSGPACK
        out = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, list):
                message = {**message, "content": [self._part(p, binary) for p in content]}
            out.append(message)
        return out

    @staticmethod
    def _part(part: Any, binary: bool) -> Any:
        if not isinstance(part, dict) or part.get("type") not in ("image", "image_url"):
            return part
        value = part.get(part["type"])
        if isinstance(value, dict):
            value = value.get("url")
        source = image_source(value, binary=binary)
        if isinstance(source, bytes):
            return {"type": "image_bytes", "image_bytes": source}
        return {"type": "image_url", "image_url": {"url": source}}

    def _answer_format(self, r: _Answer) -> WireFormat:
        ctype = r.headers.get("content-type", "")
        return WireFormat.MSGPACK if "msgpack" in ctype else WireFormat.JSON

    # -- generate ------------------------------------------------------------------------------

    def route(self, request: GenerateRequest[Any]) -> str:
        """The generate node for a request: by its first item hash, so repeats of an image go
        where its tensors already are; by request id for text-only prompts. Nodes that failed
        recently come last."""
        return self._nodes_for(request)[0]

    def _nodes_for(self, request: GenerateRequest[Any]) -> list[str]:
        """The nodes that may serve, in the request's rendezvous order (``tandem_client.fleet``)."""
        nodes = [self._nodes[u] for u in self.generate_urls]
        order = fleet.rendezvous_nodes(_route_key(request), nodes, self._view(), time.monotonic())
        return [n.url for n in order]

    def _view(self) -> fleet.FleetView:
        return self._poller.view()

    def _generate_nodes_are(self, urls: Sequence[str]) -> None:
        """The generate node set is now ``urls``: nodes that stay keep what this client knows
        of them; a node that left is forgotten (back at the same address, it is a new process
        that holds nothing)."""
        self.generate_urls = list(urls)
        for state in (self._held, self._probes, self._zstd_nodes, self._nodes):
            for gone in set(state) - set(urls):
                del state[gone]
        self._suspect &= set(urls)
        for url in urls:
            self._nodes.setdefault(url, fleet.Node(url))
            self._held.setdefault(url, _Held(self._held_items_per_node))
            self._probes.setdefault(url, asyncio.Lock())

    async def _discover(self) -> None:
        """Look the generate names up again once their interval has passed; a node that
        joined is asked what it holds, and gets requests only if it holds the fleet's weights.
        At the first call, every node is asked before anything is sent (``_start_watch``)."""
        if not self._poller.started:
            async with self._discovering:
                if not self._poller.started:
                    await self._start_watch()
        source = self._generate_source
        if not source.due():
            return
        async with self._discovering:
            if not source.due():
                return  # another call looked them up meanwhile
            known = set(self.generate_urls)
            if await source.refresh():
                self._generate_nodes_are(source.urls)
            # New nodes, and fenced ones (they may have caught up), are asked what they hold.
            fenced = set(self.fenced())
            stale = [u for u in self.generate_urls if u not in known or u in fenced]
            await self._poller.ask_now([self._nodes[u] for u in stale])

    async def _start_watch(self) -> None:
        """Judge the fleet now (each node answered once or timed out) and every
        ``fence_poll_s`` from then on (``FleetPoller``, the front door's own)."""
        if self._generate_source.due():
            if await self._generate_source.refresh():
                self._generate_nodes_are(self._generate_source.urls)
        await self._poller.start()

    def _every_node(self) -> list[fleet.Node]:
        return [self._nodes[u] for u in self.generate_urls]

    def _learnt(self, node: fleet.Node) -> None:
        """A node's /weight_info answer (or failure) was just taken: one that answered has
        told what it holds, and needs no asking before new work."""
        if node.unreachable_since is None:
            self._suspect.discard(node.url)

    async def _recheck_suspects(self) -> None:
        """Nodes that failed and whose cool-down is over are asked what they hold before they
        get work again: a restarted node holds its checkpoint's weights, maybe not the fleet's,
        and a node that left the fleet (unreachable past ``node_timeout_s``) comes back only
        once it answers (no engine restarts within a cool-down)."""
        now = time.monotonic()
        due = [self._nodes[u] for u in self._suspect if self._nodes[u].down_until <= now]
        if due:
            await self._poller.ask_now(due)

    def _node_failed(self, url: str) -> None:
        self._nodes[url].cool_down(time.monotonic(), self.node_cooldown_s)
        self._suspect.add(url)
        # A node that comes back is a new process: it holds nothing we sent before (and may
        # be another version: its codings are asked again).
        self._held[url].clear()
        self._zstd_nodes.pop(url, None)

    async def _node_takes_zstd(self, url: str) -> bool:
        """Whether to compress toward a generate node: it said so in an answer's
        ``Accept-Encoding`` (asked once, at ``/health``). Upstream vLLM never says so, so it
        never gets a body it cannot read."""
        if self.compression is None:
            return False
        known = self._zstd_nodes.get(url)
        if known is not None:
            return known
        async with self._probes[url]:
            if url not in self._zstd_nodes:
                try:
                    r = await self._http.get(f"{url}/health")
                except httpx.TransportError:
                    return False  # asked again next time; the request finds out the rest
                self._zstd_nodes[url] = accepts_coding(r.headers.get("accept-encoding"), ZSTD)
            return self._zstd_nodes[url]

    def _coded(
        self, plain: bytes, packed: bytes | None, zstd: bool
    ) -> tuple[bytes, dict[str, str]]:
        """The generate body as it goes on the wire, and its Content-Encoding header."""
        if not zstd or (packed is None and len(plain) < MIN_COMPRESSED_BYTES):
            return plain, {}
        if packed is None:
            packed = compress_zstd(plain, self.compression_level)
        return packed, {"content-encoding": ZSTD}

    async def generate(self, request: GenerateRequest[Any], **sampling: Any) -> GenerateResponse:
        """Generate for a render output (``sampling`` overrides its sampling_params).

        Items the chosen node already holds are sent as null; if it answers 409
        ``mm_cache_miss`` (it evicted them, or restarted), they are resent with their data.
        If the node is unreachable or its engine died (503), the request moves to the next
        node in its affinity order.
        """
        return await self._generate(request, None, sampling)

    async def _generate(
        self, request: GenerateRequest[Any], raw: _Answer | None, sampling: dict[str, Any]
    ) -> GenerateResponse:
        if sampling:
            request = msgspec.structs.replace(
                request, sampling_params={**request.sampling_params, **sampling}
            )
            raw = None  # render's bytes no longer say what is asked
        await self._discover()
        failure: TandemError = TransportError("no generate node is configured")
        for attempt in range(self.max_retries + 1):
            await self._recheck_suspects()
            # Every node once, best first; then wait and go round again (nodes restart).
            for url in self._nodes_for(request):
                try:
                    answer = await self._generate_on(url, request, raw)
                    self._nodes[url].reached()
                    return answer
                except (TransportError, ServerError) as exc:
                    if isinstance(exc, ServerError) and exc.status_code != 503:
                        raise
                    self._node_failed(url)
                    failure = exc
            if attempt < self.max_retries:
                await asyncio.sleep(self._delay(attempt))
        raise failure

    async def _generate_on(
        self, url: str, request: GenerateRequest[Any], raw: _Answer | None
    ) -> GenerateResponse:
        held = self._held[url]
        tenant = request.cache_salt or ""
        ids = _content_ids(request, tenant)
        keys = _keys(ids, tenant)
        skip = {k for k in keys if k in held}
        zstd = await self._node_takes_zstd(url)
        for _ in range(3):
            fmt = self.fmt
            packed = None
            if raw is not None and not skip:
                # Render's answer goes on byte for byte (compressed as it came, if it did):
                # nothing to hold back, nothing changed.
                plain, fmt, packed = raw.content, self._answer_format(raw), raw.packed
            else:
                plain = encode_generate_request(_without(request, ids, skip, tenant), self.fmt)
            body, coding = self._coded(plain, packed, zstd)
            try:
                r = await self._post(
                    f"{url}/inference/v1/generate",
                    body,
                    fmt,
                    failover=True,
                    route_key=_route_key(request),
                    extra_headers=coding,
                )
            except CacheMissError as exc:
                missing = {(tenant, h) for hashes in exc.missing.values() for h in hashes}
                for key in missing:
                    held.discard(key)
                if not missing & skip:
                    raise  # it lacks items we did not hold back: nothing to resend
                skip -= missing
                continue
            except ServiceError as exc:
                if not coding or exc.type != error_types.UNSUPPORTED_CONTENT_ENCODING:
                    raise
                # The node no longer takes zstd (replaced by another version): send it plain.
                self._zstd_nodes[url] = zstd = False
                continue
            for key in keys:
                held.add(key)
            answer = GenerateTextResponse if request.output_mode == "text" else GenerateResponse
            return decode_document(r.content, answer, self._answer_format(r))
        raise ServerError(
            "items kept going missing", type=error_types.MM_CACHE_MISS, status_code=409
        )

    async def rollout(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        images: Sequence[Sequence[ImageLike] | None] | None = None,
        **kwargs: Any,
    ) -> RolloutResult:
        """TRL-shaped rollouts (see ``tandem_client.rollout.rollout`` for the arguments)."""
        return await rollout(self, prompts, images, **kwargs)

    # -- control (every generate node) ----------------------------------------------------------

    async def _on_every_node(self, path: str, params: dict[str, Any] | None = None) -> list[Any]:
        """A control POST on every node that has not left the fleet (``tandem_client.fleet``);
        the first node that fails it raises, typed."""
        await self._discover()
        nodes = self._poller.taking_part()
        query = f"?{urlencode(params)}" if params else ""
        answers = await fleet.ask_each(self._ask, nodes, "POST", path + query)
        fleet.learn_pausing(path, nodes, answers)
        for a in answers:
            if a.status == 0:
                raise TransportError(f"{a.url}{path}: {a.body}")
            if not a.ok:
                raise error_from_response(a.status, a.body, f"{a.url}{path}")
        return [a.body for a in answers]

    async def _ask(
        self, node: fleet.Node, method: str, path: str, body: bytes, extra: Mapping[str, str]
    ) -> fleet.NodeAnswer:
        """``fleet.Ask`` over this client's connections (JSON bodies, as vLLM's routes); only
        the calls that load weights may take the long timeout."""
        # Every POST here changes engine state (the update's steps): the admin key goes.
        headers = {**(self._control_headers if method == "POST" else {}), **extra}
        if body:
            headers["content-type"] = "application/json"
        loads = path.split("?")[0] in fleet.LOADING_PATHS
        timeout = self.timeout_s if loads else min(self.timeout_s, self.control_timeout_s)
        try:
            r = await self._http.request(
                method, f"{node.url}{path}", content=body, headers=headers, timeout=timeout
            )
        except httpx.TransportError as exc:
            self._node_failed(node.url)
            return fleet.NodeAnswer(node.url, 0, f"{type(exc).__name__}: {exc}")
        node.reached()
        try:
            return fleet.NodeAnswer(node.url, r.status_code, r.json())
        except ValueError:
            return fleet.NodeAnswer(node.url, r.status_code, r.text[:200])

    async def pause(self, mode: str = "keep", *, clear_cache: bool = True) -> None:
        """Pause generation on every node (vLLM's modes: ``keep`` freezes requests in flight
        until ``resume``, ``wait`` lets them finish first, ``abort`` ends them)."""
        params = {"mode": mode, "clear_cache": str(clear_cache).lower()}
        await self._on_every_node("/pause", params=params)

    async def resume(self) -> None:
        await self._on_every_node("/resume")

    async def weight_versions(self) -> dict[str, str]:
        """Each node's current weight version, by URL."""
        await self._discover()
        nodes = [self._nodes[u] for u in self.generate_urls]
        for answer in await self._poller.ask_now(nodes):
            if not answer.ok:
                if answer.status == 0:
                    raise TransportError(f"{answer.url}/weight_info: {answer.body}")
                raise error_from_response(answer.status, answer.body, answer.url)
        return {n.url: str(n.weight_version) for n in nodes}

    def fenced(self) -> list[str]:
        """The generate nodes that get no requests: they do not hold the fleet's weights (as
        last told; see ``tandem_client.fleet``)."""
        return [n.url for n in self._view().fenced([self._nodes[u] for u in self.generate_urls])]

    async def update_weights(
        self,
        weights: Mapping[str, Any] | Iterable[tuple[str, Any]],
        *,
        version: str | None = None,
    ) -> None:
        """Load new weights on every generate node and label them ``version``.

        ``weights`` maps checkpoint names (as in the model's safetensors files) to tensors
        (numpy arrays or torch tensors); it may be part of the model, in whole layers. They
        are written once into ``weight_dir`` (the folder the nodes were started with as
        ``--weight-transfer-dir``; see ``tandem_client.weights``), then the nodes run
        start -> update -> finish as ``tandem_client.fleet`` says: the update starts on every
        serving node or on none; a node whose update or finish fails while others load the
        weights is fenced (gets no requests from this client) until it holds the fleet's
        weights again, and FleetPartialFailure names each such node's own failure. A node
        unreachable past ``node_timeout_s`` has left the fleet and is not waited for. A file
        every node refuses alike raises that refusal (WeightUpdateError) and nothing is loaded
        anywhere.
        Requests running meanwhile go on under the new weights once they are loaded: each node
        resets its prefix cache (preempting running requests, which recompute their KV under
        the new weights), and each completion's ``weight_versions`` names the tokens each
        version produced. Pause the nodes first for completions of one version only.
        """
        if self.weight_dir is None:
            raise ValueError("update_weights needs the client's weight_dir (the shared folder)")
        await self._discover()
        path = await asyncio.to_thread(write_safetensors, weights, self.weight_dir)
        try:
            await self._update_everywhere(path.name, version)
        finally:
            path.unlink(missing_ok=True)  # each node copied the tensors at update_weights

    async def _update_everywhere(self, name: str, version: str | None) -> None:
        """start -> one chunk -> finish on every node that has not left the fleet, by
        ``tandem_client.fleet``'s protocol (the front door runs the same steps)."""
        everyone = [self._nodes[u] for u in self.generate_urls]
        await self._poller.ask_now(everyone)
        view = self._view()
        going = self._poller.taking_part()
        started = await fleet.start_update(self._ask, going, view, self._poller.seq_mark)
        self._poller.minted(started.update_id)
        if started.refusal is not None:
            raise _refusal(started.refusal)
        if started.failures:
            raise _fleet_failure(
                "start",
                started.failures,
                everyone,
                self._view(),
                "undone on every node that started",
            )
        failures = []
        going = started.succeeded
        chunk = {"path": name}
        body = msgspec.json.encode({"update_info": chunk})
        sent = await fleet.send_chunk(self._ask, going, view, body, {})
        if sent.refusal is not None:
            raise _refusal(sent.refusal)
        failures += [{**a.summary(), "step": "update"} for a in sent.failures]
        body = msgspec.json.encode({"weight_version": version})
        # What each node must have taken: a node that did not is refused the finish.
        receipt = UpdateReceipt.begin(started.update_id).took(chunk) if started.update_id else None
        finished = await fleet.finish_update(self._ask, sent.succeeded, view, body, {}, receipt)
        failures += [{**a.summary(), "step": "finish"} for a in finished.failures]
        await self._poller.ask_now(everyone)
        after = self._view()
        self._suspect.update(n.url for n in after.fenced(everyone))
        if failures:
            raise _fleet_failure("update", failures, everyone, after, "")

    async def chat(
        self, messages: list[dict[str, Any]], *, model: str | None = None, **fields: Any
    ) -> GenerateResponse:
        """Render then generate, the render output posted on as it came: its sampling is vLLM's
        own ``to_sampling_params`` of ``fields`` (``max_tokens`` clamped to the room left, the
        model's default stop tokens merged in), which the caller's raw fields would undo."""
        request, raw = await self._render_chat(messages, model=model, **fields)
        return await self._generate(request, raw, {})


def _refusal(answer: fleet.NodeAnswer) -> TandemError:
    """Every node refused a step alike (the same file checked against the same model): their
    refusal, as one node's would be."""
    return error_from_response(answer.status, answer.body, answer.url)


def _fleet_failure(
    step: str,
    failed: Sequence[fleet.NodeAnswer | dict[str, Any]],
    nodes: Sequence[fleet.Node],
    view: fleet.FleetView,
    note: str,
) -> FleetPartialFailure:
    """The caller's error for a fleet update: each failing node's own answer, the fleet's
    weights and the fenced nodes after it."""
    named = [f if isinstance(f, dict) else {**f.summary(), "step": step} for f in failed]
    names = ", ".join(
        f"{f['url']} ({f['step']}: {f['status'] or 'unreachable'} {f['type']})" for f in named
    )
    return FleetPartialFailure(
        f"weight update failed on {len(named)} of {len(nodes)} generate nodes: {names}"
        + (f" ({note})" if note else ""),
        type=error_types.CONTROL_PARTIAL_FAILURE,
        status_code=502,
        details={
            "failed": named,
            "weight_version": view.weight_version,
            "weights_id": view.weights_id,
            "fenced": [n.url for n in view.fenced(nodes)],
        },
    )


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def _error_body(r: _Answer | httpx.Response) -> Any:
    try:
        if "msgpack" in r.headers.get("content-type", ""):
            return msgspec.msgpack.decode(r.content)
        return msgspec.json.decode(r.content)
    except (ValueError, msgspec.DecodeError):
        return None


ContentIds = dict[str, list[str | None]]
"""Per modality, parallel to ``mm_hashes``: each item's content id, None where no data."""


def _route_key(request: GenerateRequest[Any]) -> str:
    feats = request.features
    return affinity_key(feats.mm_hashes if feats else None, request.request_id)


def _content_ids(request: GenerateRequest[Any], tenant: str) -> ContentIds:
    feats = request.features
    if feats is None or feats.kwargs_data is None:
        return {}
    return {
        m: [None if d is None else content_id(tenant, d) for d in data]
        for m, data in feats.kwargs_data.items()
    }


def _keys(ids: ContentIds, tenant: str) -> set[tuple[str, str]]:
    """The (tenant, content id) keys a generate node holds the items by once it has them."""
    return {(tenant, cid) for cids in ids.values() for cid in cids if cid is not None}


def _without(
    request: GenerateRequest[Any], ids: ContentIds, skip: set[tuple[str, str]], tenant: str
) -> GenerateRequest[Any]:
    """The request with the items in ``skip`` sent as null entries named by content id."""
    feats = request.features
    if not skip or feats is None or feats.kwargs_data is None:
        return request
    hashes = dict(feats.mm_hashes)
    kwargs: dict[str, list[Any]] = {}
    for m, data in feats.kwargs_data.items():
        held = [cid is not None and (tenant, cid) in skip for cid in ids[m]]
        hashes[m] = [
            cid if h and cid is not None else mm_hash
            for mm_hash, cid, h in zip(feats.mm_hashes[m], ids[m], held, strict=True)
        ]
        kwargs[m] = [None if h else d for d, h in zip(data, held, strict=True)]
    # mm_metadata only matters with encoder-cache transfer; drop it with the data it describes.
    new = msgspec.structs.replace(feats, mm_hashes=hashes, kwargs_data=kwargs, mm_metadata=None)
    return msgspec.structs.replace(request, features=new)

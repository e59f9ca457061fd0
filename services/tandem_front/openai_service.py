"""OpenAI chat and completions over the pair: render -> generate -> the answer, in the door.

The caller's body goes to render as it came (render validates it as vLLM's server does); the
rendered request goes to generate as rendered, in msgpack (tensors never travel back to the
caller); the token ids that come back are written up by the answer side (``Answers``:
``vllm_answers``, ``vllm serve``'s own serving code over vLLM's detokenizer). Upstream
refusals pass through unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from tandem_client.routing import affinity_key
from tandem_http import (
    AdmissionGate,
    BadRequest,
    Overloaded,
    Slot,
    principal_of,
    request_id_of,
    slot_of,
)
from tandem_wire import (
    PROMPT_TOKENS_DETAILS_HEADER,
    SYSTEM_FINGERPRINT_HEADER,
    WEIGHT_VERSIONS_HEADER,
    WIRE_TRANSFORMS_HEADER,
    GenerateRequest,
    GenerateResponse,
    GenerateStreamResponse,
    WireError,
    WireFormat,
    decode_document,
    decode_generate_request,
    decode_generate_requests,
    msgpack_fields,
    msgpack_pieces_with,
    new_request_id,
)
from tandem_wire.streams import (
    STREAM_CONTENT_TYPE,
    FrameReader,
    StreamFrameKind,
    decode_error,
    decode_event,
    is_stream_frames,
)

from .errors import UpstreamError, UpstreamRefused
from .proxy import (
    Forwarder,
    HandedOver,
    Relay,
    merged,
    sse_with_error_tail,
    tenant_header,
    with_upstream_headers,
)
from .settings import FrontSettings
from .upstreams import Node, Upstreams

__all__ = [
    "Answers",
    "MessagesPlan",
    "OpenAIService",
    "Plan",
    "RenderProbe",
    "ResponsesHops",
    "StreamEvent",
    "Written",
    "anthropic_error",
]

_MSGPACK = WireFormat.MSGPACK.content_type
# What the door accepts of a streamed generate answer: the binary stream, and msgpack for a
# refusal. A node that does not know the binary stream (upstream's) answers SSE, read as such.
_STREAM_ACCEPT = f"{STREAM_CONTENT_TYPE}, {_MSGPACK}"

StreamEvent = GenerateStreamResponse | dict[str, Any]
"""One event of generate's stream: decoded from the binary stream, or an SSE event's JSON
object (from a node that answers SSE)."""


class Plan(Protocol):
    """One request's answer side."""

    stream: bool
    stream_end: bytes
    """What ends its stream after the last event (OpenAI's ``[DONE]``; Messages: nothing)."""

    def sampling(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The generate request's ``sampling_params`` from render's."""
        ...

    async def whole(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        results: list[GenerateResponse],
    ) -> bytes:
        """The whole answer (JSON) to generate's answers, one per prompt."""
        ...

    def chunks(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        events: AsyncIterator[tuple[int, StreamEvent]],
    ) -> AsyncIterator[bytes]:
        """The SSE events (``data: ...``, without ``[DONE]``) for generate's stream events,
        each with its prompt's index; a failure of ``events`` is raised."""
        ...


RenderProbe = Callable[[dict[str, Any]], Awaitable[list[int] | None]]
"""A chat body rendered on a render node: its prompt's token ids, None if render refused it."""


class ResponsesHops(Protocol):
    """One Responses call's render and generate hops, made as the chat route makes them."""

    async def render(self, chat_body: bytes) -> list[int]:
        """The chat request rendered on a render node (held for the generate hop): its
        prompt's token ids. A refusal passes to the caller unchanged."""
        ...

    async def whole(self, request_id: str, sampling: dict[str, Any]) -> GenerateResponse:
        """The rendered prompt generated with ``sampling``, answered whole."""
        ...

    def events(self, request_id: str, sampling: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        """The rendered prompt generated with ``sampling``: generate's stream events."""
        ...


@dataclass
class Written:
    """An answer written up by vLLM's serving: a JSON ``document`` with its ``status``, or
    server-sent ``events``."""

    status: int
    document: bytes = b""
    events: AsyncIterator[bytes] | None = None
    running: asyncio.Future[Any] | None = None
    """A background response's run, which goes on after this answer (done when it ends)."""


class Answers(Protocol):
    """The tokenizer side (``vllm_answers.VllmAnswers``)."""

    vllm_version: str
    """The vLLM whose serving code writes the answers (the door's ``/version``)."""

    def plan(self, body: dict[str, Any], chat: bool, *, weight_versions: bool = False) -> Plan:
        """Raises BadRequest for a body vLLM's server refuses; ``weight_versions``: the caller
        asked for each choice's spans (``WEIGHT_VERSIONS_HEADER``)."""
        ...

    def saw_fingerprint(self, fingerprint: str) -> None:
        """A generate node's engine fingerprint, for the answers' ``system_fingerprint``."""
        ...

    async def messages_plan(self, body: dict[str, Any], probe: RenderProbe) -> MessagesPlan:
        """``/v1/messages``: raises BadRequest for a body vLLM's server refuses; ``probe``
        renders a chat body for the template probes vLLM's Messages serving makes."""
        ...

    async def count_tokens_body(self, body: dict[str, Any], probe: RenderProbe) -> dict[str, Any]:
        """``/v1/messages/count_tokens``: the chat body whose rendered prompt is counted."""
        ...

    async def responses(
        self, body: dict[str, Any], hops: ResponsesHops, tenant: str, size: int
    ) -> Written:
        """``/v1/responses``: raises BadRequest for a body vLLM's server refuses. ``tenant``:
        who asks (a stored response is its own: another tenant's is as unknown); ``size``:
        the body's bytes (what its stored input is counted as)."""
        ...

    async def retrieve_response(
        self, response_id: str, starting_after: int | None, stream: bool, tenant: str
    ) -> Written:
        """``GET /v1/responses/{response_id}`` (``tenant``'s own only)."""
        ...

    async def cancel_response(self, response_id: str, tenant: str) -> Written:
        """``POST /v1/responses/{response_id}/cancel`` (``tenant``'s own only)."""
        ...


class MessagesPlan(Plan, Protocol):
    """A Messages request's answer side: a chat request's, written up as Messages."""

    chat_body: bytes
    """The chat request render renders (JSON)."""


@dataclass
class _Relayed:
    """One prompt's generate request: as the answer side reads it, and its body's pieces."""

    gen: GenerateRequest[Any]
    pieces: list[bytes | memoryview]
    headers: dict[str, str] = field(default_factory=dict)
    """Sent to generate besides the request's own (what the answer side asks of it)."""


class _PassThrough(Exception):
    """An upstream refused: its answer goes to the caller unchanged."""

    def __init__(self, response: Response) -> None:
        self.response = response


class OpenAIService:
    """Answers ``/v1/chat/completions`` and ``/v1/completions`` as ``vllm serve`` does."""

    def __init__(
        self,
        settings: FrontSettings,
        upstreams: Upstreams,
        forwarder: Forwarder,
        answers: Answers,
        gate: AdmissionGate | None = None,
    ) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.forwarder = forwarder
        self.answers = answers
        self.gate = gate
        """The worker's admission, which background responses are held against too."""
        self._max_model_len: int | None = None
        self._background = 0
        """Background responses running in this worker."""

    # -- routes --------------------------------------------------------------------------

    async def chat(self, body: bytes, request: Request) -> Response:
        doc = _parsed(body, request)
        # Checked as vLLM's server checks a body before anything else (a 400 on bad types).
        plan = self.answers.plan(doc, chat=True, weight_versions=_asks_versions(request))
        try:
            return await self._chat(body, self._model(doc), plan, request)
        except _PassThrough as refused:
            return refused.response

    async def completions(self, body: bytes, request: Request) -> Response:
        doc = _parsed(body, request)
        plan = self.answers.plan(doc, chat=False, weight_versions=_asks_versions(request))
        try:
            raw = await self._render("/v1/completions/render", body, request)
            rid = f"cmpl-{new_request_id()}"
            # As on the chat path, nothing named keeps render's answer past ``_relays``: the
            # rendered requests' items are views into it (see ``_slim``).
            prompts = _decoded(decode_generate_requests, raw)
            ids = [f"{rid}-{i}" for i in range(len(prompts))]
            relays = self._relays(raw, prompts, plan, ids, True)
            rendered, raw, prompts = len(raw), b"", []
            return await self._answer(request, self._model(doc), plan, relays, rid, rendered)
        except _PassThrough as refused:
            return refused.response

    async def messages(self, body: bytes, request: Request) -> Response:
        """``/v1/messages`` as ``vllm serve`` answers it: the chat route's answer, written up by
        vLLM's Messages serving; refusals in the Messages API's error shape."""
        doc = _parsed(body, request)
        plan = await self.answers.messages_plan(doc, self._probe)
        try:
            return await self._chat(plan.chat_body, self._model(doc), plan, request)
        except _PassThrough as refused:
            return anthropic_error(refused.response)

    async def _chat(self, body: bytes, model: str, plan: Plan, request: Request) -> Response:
        """A chat ``body`` rendered, generated and answered by ``plan`` (render's refusals
        raised as ``_PassThrough``)."""
        raw = await self._render("/v1/chat/completions/render", body, request)
        # No name keeps the answer's bytes: its items are views into them, dropped with
        # them once generate has the request (see ``_slim``).
        rid = f"chatcmpl-{new_request_id()}"
        relays = self._relays(raw, [_decoded(decode_generate_request, raw)], plan, [rid], False)
        rendered, raw = len(raw), b""
        return await self._answer(request, model, plan, relays, rid, rendered)

    async def responses(self, body: bytes, request: Request) -> Response:
        """``/v1/responses`` as ``vllm serve`` answers it: vLLM's Responses serving, its
        prompt rendered on a render node and generated on a generate node (``_ResponsesTurn``);
        render's and generate's refusals pass unchanged, as on the chat route."""
        doc = _parsed(body, request)
        background = doc.get("background") is True
        slot = self._background_slot(request, len(body)) if background else slot_of(request)
        turn = _ResponsesTurn(self, request, slot, background)
        running: asyncio.Future[Any] | None = None
        try:
            written = await self.answers.responses(doc, turn, principal_of(request), len(body))
            running, events = written.running, written.events
            if events is None:
                return _document(written)
            head: list[bytes] = []
            if not background:
                # The status line waits until generate took the request, so that its refusal
                # is an HTTP answer here too (vLLM's first events come before generation). A
                # background run's events are sent as they come, as vllm serve sends them: a
                # refusal ends that run failed, with its error (``vllm_answers``).
                head = await _until(lambda: turn.opened, events)
        except _PassThrough as refused:
            return refused.response
        finally:
            if background:
                self._hold_until_done(slot, running)
        return _event_stream(_chained(head, events), request, turn.close)

    def _background_slot(self, request: Request, parsed: int) -> Slot | None:
        """A background response's own admission, held until its run ends (it outlives its
        request): a place and the document parsed from its body (moved here from the
        request's charge), then render's answer until generate has it. 429 past
        ``max_background_responses``, or when the worker's admission has no room."""
        limit = self.settings.max_background_responses
        if self._background >= limit:
            raise Overloaded(
                f"{self._background} background responses are running, the most this worker "
                "runs; retry",
                retry_after=1,
                details={
                    "background_responses": self._background,
                    "max_background_responses": limit,
                },
            )
        if self.gate is None:
            return None
        slot = self.gate.admit(parsed)
        own = slot_of(request)
        if own is not None:
            own.give_back(parsed)  # the parsed document is the background response's now
        self._background += 1
        return slot

    def _hold_until_done(self, slot: Slot | None, running: asyncio.Future[Any] | None) -> None:
        """``slot`` (from ``_background_slot``) released once ``running`` ends (now: no run)."""
        if slot is None:
            return

        def done(_: object = None) -> None:
            slot.release()
            self._background -= 1

        if running is None:
            done()
        else:
            running.add_done_callback(done)

    async def retrieve_response(self, response_id: str, request: Request) -> Response:
        """``GET /v1/responses/{response_id}``: a response stored by this door worker."""
        query = request.query_params
        after = query.get("starting_after")
        if after is not None and not after.lstrip("-").isdigit():
            raise BadRequest("starting_after must be an integer", param="starting_after")
        stream = _query_flag(query.get("stream"), "stream")
        written = await self.answers.retrieve_response(
            response_id, None if after is None else int(after), stream, principal_of(request)
        )
        if written.events is None:
            return _document(written)
        return _event_stream(written.events, request, None)

    async def cancel_response(self, response_id: str, request: Request) -> Response:
        """``POST /v1/responses/{response_id}/cancel``: a background response of this worker."""
        return _document(await self.answers.cancel_response(response_id, principal_of(request)))

    async def count_tokens(self, body: bytes, request: Request) -> Response:
        """``/v1/messages/count_tokens``: the rendered prompt's length, as ``vllm serve``'s."""
        chat = await self.answers.count_tokens_body(_parsed(body, request), self._probe)
        try:
            raw = await self._render("/v1/chat/completions/render", _compact(chat), request)
        except _PassThrough as refused:
            return anthropic_error(refused.response)
        n = len(_decoded(decode_generate_request, raw).token_ids)
        counted = {"input_tokens": n, "context_management": {"original_input_tokens": n}}
        return Response(_compact(counted), media_type="application/json")

    async def _probe(self, body: dict[str, Any]) -> list[int] | None:
        """A template probe rendered on a render node (no caller's request behind it)."""
        headers = {"content-type": "application/json", "accept": _MSGPACK}
        node, response = await self.forwarder.open(
            self.upstreams.render_order(),
            "POST",
            "/v1/chat/completions/render",
            headers,
            _compact(body),
        )
        raw = await self._read(node, response)
        if response.status_code != 200:
            return None
        return list(_decoded(decode_generate_request, raw).token_ids)

    async def _answer(
        self,
        request: Request,
        model: str,
        plan: Plan,
        relays: list[_Relayed],
        rid: str,
        rendered: int,
    ) -> Response:
        """Every prompt's generate request opened (so a refusal is a proper HTTP answer),
        then render's answer let go: ``gens`` keep only what the answer is written from (token
        ids, sampling, ids; see ``_slim``), and its ``rendered`` bytes go back to the request's
        admission slot. Then the answer, streamed or whole."""
        opened = await self._open_all(relays, request)
        gens = _slim([r.gen for r in relays])
        relays.clear()
        slot = slot_of(request)
        if slot is not None:
            slot.give_back(rendered)
        if plan.stream:
            return self._stream(request, opened, gens, plan, rid, model)
        try:
            results = await asyncio.gather(*(self._result(n, r) for n, r in opened))
        finally:
            for node, response in opened:  # one prompt failed: the others stop too
                await self.forwarder.close(node, response)
        document = await plan.whole(rid, model, gens, list(results))
        return Response(document, media_type="application/json")

    async def max_model_len(self) -> int | None:
        """The generate nodes' context length (asked once, from the first that answers)."""
        if self._max_model_len is None:
            for node in self.upstreams.generate:
                try:
                    r = await self.upstreams.http.get(f"{node.url}/v1/models", timeout=5.0)
                    self._max_model_len = int(r.json()["data"][0]["max_model_len"])
                    break
                except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
                    continue
        return self._max_model_len

    # -- the two hops --------------------------------------------------------------------

    def _headers(self, request: Request, content_type: str) -> dict[str, str]:
        return {
            "content-type": content_type,
            "accept": _MSGPACK,
            "x-request-id": request_id_of(request),
            **tenant_header(request),
        }

    async def _read(self, node: Node, response: httpx.Response) -> bytes:
        return await self.forwarder.read(node, response)

    async def _render(
        self, path: str, body: bytes, request: Request, slot: Slot | None = None
    ) -> bytes:
        """Render's answer, at most what a generate node takes (it is sent there), charged to
        the request's admission bytes (``slot``: another admission's) as it arrives; they are
        given back once generate has the rendered request (``_open_generate``)."""
        headers = self._headers(request, "application/json")
        # The answer goes to our own generate nodes: the model's exact wire transforms are
        # understood there, and cut the bytes of each first-seen item.
        headers[WIRE_TRANSFORMS_HEADER] = "*"
        node, response = await self.forwarder.open(
            self.upstreams.render_order(), "POST", path, headers, body
        )
        if response.status_code != 200:
            raw = await self._read(node, response)
            raise _PassThrough(_passed(response, raw))
        slot = slot_of(request) if slot is None else slot
        cap = await self.upstreams.generate_body_cap(0)
        return await self.forwarder.read(node, response, cap, slot)

    def _relays(
        self,
        raw: bytes,
        rendered: list[GenerateRequest[Any]],
        plan: Plan | _Sampled,
        request_ids: list[str],
        many: bool,
        stream_options: dict[str, Any] | None = None,
    ) -> list[_Relayed]:
        """Each rendered request as generate gets it, and as the answer side reads it.

        Sampling is render's, as rendered: vLLM's own ``to_sampling_params`` resolved the
        caller's body there (max_tokens clamped to the room left, the model's default
        stop_token_ids merged in); a field render left out equals SamplingParams' default,
        which generate reads back. Only what the door itself answers is set here: the
        stream's usage chunks and token ids are the door's to write. The body sent is
        render's with those fields set: its items go on as views into ``raw``, neither
        decoded nor re-encoded (megabytes of pixels per request)."""
        try:
            fields = msgpack_fields(raw, many=many)
        except WireError:
            raise UpstreamError("render answered an unreadable rendered request") from None
        relays = []
        for r, f, request_id in zip(rendered, fields, request_ids, strict=True):
            changes = {
                "request_id": request_id,
                "sampling_params": plan.sampling(r.sampling_params),
                "stream": plan.stream,
                "stream_options": stream_options,
                "return_token_ids": False,
            }
            gen = msgspec.structs.replace(r, **changes)
            relays.append(_Relayed(gen, msgpack_pieces_with(f, changes)))
        return relays

    def _generate_nodes(self, gen: GenerateRequest[Any]) -> list[Node]:
        feats = gen.features
        return self.upstreams.generate_order(
            affinity_key(feats.mm_hashes if feats else None, gen.request_id)
        )

    async def _open_generate(
        self, relay: _Relayed, request: Request, slot: Slot | None = None
    ) -> tuple[Node, httpx.Response]:
        slot = slot_of(request) if slot is None else slot
        body = HandedOver(relay.pieces)
        if slot is not None:
            slot.take(body.copied)  # its own pieces, held until a node has it
        headers = {**self._headers(request, _MSGPACK), **relay.headers}
        if relay.gen.stream:
            headers["accept"] = _STREAM_ACCEPT
        headers["content-length"] = str(body.length)
        try:
            node, response = await self.forwarder.open(
                self._generate_nodes(relay.gen), "POST", "/inference/v1/generate", headers, body
            )
        finally:
            body.drop()
            if slot is not None:
                slot.give_back(body.copied)
        if response.status_code != 200:
            raw = await self._read(node, response)
            raise _PassThrough(_passed(response, raw))
        fingerprint = response.headers.get(SYSTEM_FINGERPRINT_HEADER)
        if fingerprint:
            self.answers.saw_fingerprint(fingerprint)
        return node, response

    async def _result(self, node: Node, response: httpx.Response) -> GenerateResponse:
        raw = await self._read(node, response)
        fmt = (
            WireFormat.MSGPACK
            if "msgpack" in response.headers.get("content-type", "")
            else (WireFormat.JSON)
        )
        try:
            return decode_document(raw, GenerateResponse, fmt)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
            raise UpstreamError(f"{node.url} answered an unreadable generate response") from None

    def _model(self, doc: dict[str, Any]) -> str:
        asked = doc.get("model")
        names = self.settings.names()
        return asked if isinstance(asked, str) and asked in names else names[0]

    # -- streaming -------------------------------------------------------------------------

    def _stream(
        self,
        request: Request,
        opened: list[tuple[Node, httpx.Response]],
        gens: list[GenerateRequest[Any]],
        plan: Plan,
        rid: str,
        model: str,
    ) -> Response:
        # The prompts stream at once, their events merged as they come (as vLLM's completions
        # merge theirs).
        prompts = [
            self._prompt_events(p, node, response) for p, (node, response) in enumerate(opened)
        ]

        async def events() -> AsyncIterator[bytes]:
            async for chunk in plan.chunks(rid, model, gens, merged(prompts)):
                yield chunk
            if plan.stream_end:
                yield plan.stream_end

        async def release() -> None:
            for node, response in opened:
                await self.forwarder.close(node, response)

        tail = sse_with_error_tail(events(), request_id_of(request))
        return Relay(tail, release, media_type="text/event-stream")

    async def _open_all(
        self, relays: list[_Relayed], request: Request, slot: Slot | None = None
    ) -> list[tuple[Node, httpx.Response]]:
        """Every relay's generate request opened, each body charged to the request's
        admission (``slot``: another admission's) until a node has it."""
        tasks = [asyncio.ensure_future(self._open_generate(r, request, slot)) for r in relays]
        handed = False
        try:
            # The first refusal is the answer: the others are not waited for (a node may
            # keep a request's headers until it has run).
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [t for t in tasks if t.done() and t.exception() is not None]
            opened = [t.result() for t in failed or tasks]  # the first refusal is raised
            handed = True
            return opened
        finally:
            if not handed:  # a refusal, or the caller left: give back what did open
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for t in tasks:
                    if not t.cancelled() and t.exception() is None:
                        await self.forwarder.close(*t.result())

    async def _prompt_events(
        self, p: int, node: Node, response: httpx.Response
    ) -> AsyncIterator[tuple[int, StreamEvent]]:
        """One prompt's generate events, each with the prompt's index."""
        framed = is_stream_frames(response.headers.get("content-type"))
        events = _frame_events(response) if framed else _events(response)
        try:
            async for event in events:
                yield p, event
        except httpx.HTTPError as exc:
            raise self.forwarder.failure(exc, node) from None
        except (ValueError, KeyError, TypeError):  # a WireError (a malformed frame) too
            raise UpstreamError(f"{node.url} sent an unreadable stream event") from None
        finally:
            await self.forwarder.close(node, response)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    done = False
    async for line in response.aiter_lines():
        if done or not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            # Read on to the body's end (its last chunk is still to come): an answer closed
            # before it drops its connection, and every streamed request paid a new one.
            done = True
            continue
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise ValueError("a stream event is not an object")
        if "error" in event:
            raise UpstreamError(f"generate failed mid-stream: {str(event['error'])[:200]}")
        yield event


async def _frame_events(response: httpx.Response) -> AsyncIterator[GenerateStreamResponse]:
    """Generate's binary stream, decoded straight into its structs (no JSON on the way). The
    events that arrive together (the door was reading behind generate) are coalesced into one,
    as vLLM's output collector merges the outputs its reader has not taken yet: the same
    tokens, logprobs and finish reasons, in fewer chunks through vLLM's serving code."""
    reader = FrameReader()
    async for data in response.aiter_bytes():
        pending: GenerateStreamResponse | None = None
        for kind, payload in reader.feed(data):
            if kind is StreamFrameKind.EVENT:
                event = decode_event(payload, GenerateStreamResponse)
                if pending is not None and _coalesce(pending, event):
                    continue
                if pending is not None:
                    yield pending
                pending = event
            elif kind is StreamFrameKind.ERROR:
                if pending is not None:
                    yield pending
                    pending = None
                error = msgspec.to_builtins(decode_error(payload).error)
                raise UpstreamError(f"generate failed mid-stream: {str(error)[:200]}")
        if pending is not None:
            yield pending
    reader.finish()


def _coalesce(into: GenerateStreamResponse, event: GenerateStreamResponse) -> bool:
    """``event``'s tokens appended to ``into``'s, sample by sample, as vLLM's
    ``RequestOutput.add`` merges deltas; False (nothing changed) when they cannot be: a usage
    or prompt chunk, a sample that already finished, logprobs on one side only."""
    if into.usage is not None or event.usage is not None or event.prompt_token_ids is not None:
        return False
    if event.mm_placeholders is not None or not event.choices or not into.choices:
        return False
    held = {c.index: c for c in into.choices}
    for c in event.choices:
        was = held.get(c.index)
        if was is None:
            continue
        if was.finish_reason is not None or (was.logprobs is None) != (c.logprobs is None):
            return False
    for c in event.choices:
        was = held.get(c.index)
        if was is None:
            into.choices.append(c)
            held[c.index] = c
            continue
        # ``into`` is the door's own decoded event: its lists grow in place.
        if was.token_ids is None:
            was.token_ids = list(c.token_ids or ())
        else:
            was.token_ids += c.token_ids or ()
        if was.logprobs is not None and c.logprobs is not None:
            if was.logprobs.content is None:
                was.logprobs.content = list(c.logprobs.content or ())
            else:
                was.logprobs.content += c.logprobs.content or ()
        was.finish_reason = c.finish_reason
        was.stop_reason = c.stop_reason
        was.weight_versions = c.weight_versions
    return True


class _Sampled:
    """A generate request's sampling as given (the Responses serving resolved it itself)."""

    def __init__(self, sampling: dict[str, Any], stream: bool) -> None:
        self._sampling = sampling
        self.stream = stream

    def sampling(self, rendered: dict[str, Any]) -> dict[str, Any]:
        return self._sampling


class _ResponsesTurn:
    """``ResponsesHops`` for one door request: render's answer is held from the render hop
    to the generate hop (charged to ``slot``, the request's admission or a background
    response's own, until generate has it), and the generate answers it opened are closed
    however the caller's answer ends (a background response's are not: it runs on after its
    request, and a refusal of its generate hop is its typed error, ``UpstreamRefused``)."""

    def __init__(
        self, service: OpenAIService, request: Request, slot: Slot | None, background: bool
    ) -> None:
        self.service = service
        self.request = request
        self.slot = slot
        self.background = background
        self.opened = False
        self._raw = b""
        self._rendered: GenerateRequest[Any] | None = None
        self._answers: list[tuple[Node, httpx.Response]] = []

    async def render(self, chat_body: bytes) -> list[int]:
        path = "/v1/chat/completions/render"
        self._raw = await self.service._render(path, chat_body, self.request, self.slot)
        self._rendered = _decoded(decode_generate_request, self._raw)  # read once
        return list(self._rendered.token_ids)

    async def whole(self, request_id: str, sampling: dict[str, Any]) -> GenerateResponse:
        node, response = await self._open(request_id, sampling, stream=False)
        try:
            return await self.service._result(node, response)
        finally:
            await self.service.forwarder.close(node, response)

    async def events(self, request_id: str, sampling: dict[str, Any]) -> AsyncIterator[StreamEvent]:
        node, response = await self._open(request_id, sampling, stream=True)
        async for _, event in self.service._prompt_events(0, node, response):
            yield event

    async def close(self) -> None:
        if not self.background:
            for node, response in self._answers:
                await self.service.forwarder.close(node, response)

    async def _open(
        self, request_id: str, sampling: dict[str, Any], stream: bool
    ) -> tuple[Node, httpx.Response]:
        raw, self._raw = self._raw, b""
        rendered, self._rendered = self._rendered, None
        if rendered is None:  # vLLM generates only what it rendered first
            raise RuntimeError("a Responses generate hop without its render hop")
        plan = _Sampled(sampling, stream)
        # The Responses API's usage counts the prefix-cache hits: generate is asked for them
        # (streamed, in the usage chunk after the last token).
        usage = {"include_usage": True} if stream else None
        relays = self.service._relays(raw, [rendered], plan, [request_id], False, usage)
        relays[0].headers[PROMPT_TOKENS_DETAILS_HEADER] = "true"
        held, raw = len(raw), b""
        try:
            ((node, response),) = await self.service._open_all(relays, self.request, self.slot)
        except _PassThrough as refused:
            if not self.background:
                raise
            raise _refusal(refused.response) from None
        relays.clear()
        if self.slot is not None:
            self.slot.give_back(held)
        self._answers.append((node, response))
        self.opened = True
        return node, response


async def _until(done: Callable[[], bool], events: AsyncIterator[bytes]) -> list[bytes]:
    """The first ``events``, read until ``done()`` (or their end); closed if reading fails."""
    head: list[bytes] = []
    try:
        while not done():
            head.append(await anext(events))
    except StopAsyncIteration:
        pass
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        raise
    return head


async def _chained(head: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for chunk in head:
        yield chunk
    async for chunk in rest:
        yield chunk


def _refusal(refused: Response) -> UpstreamRefused:
    """An upstream's refusal (as ``_passed`` made it) as the door's typed error."""
    try:
        error = json.loads(bytes(refused.body))["error"]
        type_, message = str(error["type"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        type_, message = "upstream_error", "an upstream refused with an unreadable error"
    return UpstreamRefused(refused.status_code, type_, message[:300])


def _document(written: Written) -> Response:
    return Response(written.document, written.status, media_type="application/json")


def _event_stream(
    events: AsyncIterator[bytes], request: Request, release: Callable[[], Awaitable[None]] | None
) -> Response:
    tail = sse_with_error_tail(events, request_id_of(request))
    return Relay(tail, release or _nothing, media_type="text/event-stream")


async def _nothing() -> None:
    return None


def _query_flag(value: str | None, name: str) -> bool:
    """A boolean query parameter as FastAPI reads one (absent: false)."""
    if value is None:
        return False
    lowered = value.lower()
    if lowered in ("1", "true", "on", "yes", "t", "y"):
        return True
    if lowered in ("0", "false", "off", "no", "f", "n"):
        return False
    raise BadRequest(f"{name} must be a boolean", param=name)


def _slim(gens: list[GenerateRequest[Any]]) -> list[GenerateRequest[Any]]:
    """The generate requests without their items (views into render's answer, which they
    would keep alive): the answer side reads only token ids, sampling and ids."""
    return [msgspec.structs.replace(g, features=None) for g in gens]


def _decoded(decode: Any, raw: bytes) -> Any:
    """Render's answer read; one that does not read is render's fault (502), not the caller's."""
    try:
        return decode(raw, WireFormat.MSGPACK)
    except (WireError, msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        raise UpstreamError("render answered an unreadable rendered request") from None


def _parsed(body: bytes, request: Request) -> dict[str, Any]:
    """The body's JSON object, charged to the request as much again as the body (its
    strings, image data URLs above all, are copied out of it) before it is parsed."""
    slot = slot_of(request)
    if slot is not None:
        slot.take(len(body))
    return _json_object(body)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON") from None
    except RecursionError:
        raise BadRequest("the body nests too deeply") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the body must be a JSON object")
    return parsed


def _asks_versions(request: Request) -> bool:
    return request.headers.get(WEIGHT_VERSIONS_HEADER, "").strip().lower() == "true"


def _passed(response: httpx.Response, raw: bytes) -> Response:
    """An upstream refusal for the caller: status, headers and document unchanged, but in JSON
    (the OpenAI routes' callers speak JSON; the door asked the tiers for msgpack)."""
    ctype = response.headers.get("content-type", "")
    if "msgpack" in ctype:
        try:
            raw = json.dumps(msgspec.msgpack.decode(raw), separators=(",", ":")).encode()
            ctype = "application/json"
        except (msgspec.DecodeError, TypeError, ValueError):
            raise UpstreamError("an upstream answered an unreadable error") from None
    passed = Response(raw, response.status_code, media_type=ctype or "application/json")
    return with_upstream_headers(passed, response)


def _compact(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def anthropic_error(refused: Response) -> Response:
    """A refusal in the Messages API's shape, as ``vllm serve``'s Messages routes write an
    error of its serving code (``{"type": "error", "error": {"type", "message"}}``)."""
    try:
        error = json.loads(bytes(refused.body))["error"]
        shaped = {"type": "error", "error": {"type": error["type"], "message": error["message"]}}
    except (ValueError, KeyError, TypeError):
        return refused  # not an error document: passed on as it came
    answer = Response(_compact(shaped), refused.status_code, media_type="application/json")
    for name, value in refused.headers.items():
        if name.lower() not in ("content-length", "content-type"):
            answer.headers[name] = value
    return answer

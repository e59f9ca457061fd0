"""OpenAI chat and completions over the pair: render -> generate -> detokenize, in the door.

The caller's body goes to render as it came (render validates it as vLLM's server does); the
rendered request goes to generate as msgpack (tensors never travel back to the caller); the
token ids that come back are detokenized by the tokenizer side (``Texts``: vLLM's incremental
detokenizer and response models, in ``vllm_texts``). Upstream refusals pass through unchanged.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import httpx
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tandem_client.client import chat_sampling_fields
from tandem_client.routing import affinity_key
from tandem_http import BadRequest, request_id_of
from tandem_wire import (
    WIRE_TRANSFORMS_HEADER,
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    WireFormat,
    decode_document,
    decode_generate_request,
    decode_generate_requests,
    encode_generate_request,
    new_request_id,
)

from .errors import UpstreamError
from .proxy import Forwarder, downstream_headers
from .settings import FrontSettings
from .upstreams import Node, Upstreams

__all__ = ["OpenAIService", "TextStream", "Texts"]

_MSGPACK = WireFormat.MSGPACK.content_type


class TextStream(Protocol):
    def feed(self, token_ids: Sequence[int], stop_terminated: bool) -> str | None: ...

    def text(self, *, finished: bool, delta: bool) -> str: ...


class Texts(Protocol):
    """The tokenizer side (``vllm_texts.VllmTexts``)."""

    def stream(self, prompt_token_ids: list[int], sampling: dict[str, Any]) -> TextStream: ...

    def logprob_tokens(self, token_ids: list[int], context: list[int]) -> list[str]: ...

    def shape(self, kind: str, fields: dict[str, Any], *, chunk: bool = False) -> bytes: ...


class _PassThrough(Exception):
    """An upstream refused: its answer goes to the caller unchanged."""

    def __init__(self, response: Response) -> None:
        self.response = response


class _Ask:
    """What the caller asked for, beyond what render turns into sampling fields."""

    def __init__(self, body: dict[str, Any], chat: bool) -> None:
        self.body = body
        self.chat = chat
        self.stream = bool(body.get("stream"))
        options = body.get("stream_options") or {}
        self.include_usage = self.stream and bool(options.get("include_usage"))
        self.continuous_usage = self.include_usage and bool(options.get("continuous_usage_stats"))
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.as_token_ids = bool(body.get("return_tokens_as_token_ids"))
        if chat:
            self.top = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        else:
            lp = body.get("logprobs")
            self.top = None if lp is None else int(lp)

    def sampling(self) -> dict[str, Any]:
        fields = chat_sampling_fields(self.body)
        if not self.chat:
            fields.pop("logprobs", None)
            if self.top is not None:
                fields["logprobs"] = self.top
        return fields


class OpenAIService:
    """Answers ``/v1/chat/completions`` and ``/v1/completions`` as ``vllm serve`` does."""

    def __init__(
        self,
        settings: FrontSettings,
        upstreams: Upstreams,
        forwarder: Forwarder,
        texts: Texts,
    ) -> None:
        self.settings = settings
        self.upstreams = upstreams
        self.forwarder = forwarder
        self.texts = texts
        self._max_model_len: int | None = None

    # -- routes --------------------------------------------------------------------------

    async def chat(self, body: bytes, request: Request) -> Response:
        ask = _Ask(_json_object(body), chat=True)
        try:
            raw = await self._render("/v1/chat/completions/render", body, request)
            rendered = decode_generate_request(raw, WireFormat.MSGPACK)
            gen = self._generate_request(rendered, ask, f"chatcmpl-{new_request_id()}")
            if ask.stream:
                return await self._open_stream(request, [gen], ask)
            result = await self._generate(gen, request)
        except _PassThrough as refused:
            return refused.response
        return self._answer(self._chat_document(gen, result, ask))

    async def completions(self, body: bytes, request: Request) -> Response:
        ask = _Ask(_json_object(body), chat=False)
        try:
            raw = await self._render("/v1/completions/render", body, request)
            rid = f"cmpl-{new_request_id()}"
            gens = [
                self._generate_request(r, ask, f"{rid}-{i}")
                for i, r in enumerate(decode_generate_requests(raw, WireFormat.MSGPACK))
            ]
            if ask.stream:
                return await self._open_stream(request, gens, ask, rid)
            results = await asyncio.gather(*(self._generate(g, request) for g in gens))
        except _PassThrough as refused:
            return refused.response
        return self._answer(self._completion_document(rid, gens, list(results), ask))

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
        }

    async def _read(self, node: Node, response: httpx.Response) -> bytes:
        try:
            return await response.aread()
        finally:
            await self.forwarder.close(node, response)

    async def _render(self, path: str, body: bytes, request: Request) -> bytes:
        headers = self._headers(request, "application/json")
        # The answer goes to our own generate nodes: the model's exact wire transforms are
        # understood there, and cut the bytes of each first-seen item.
        headers[WIRE_TRANSFORMS_HEADER] = "*"
        node, response = await self.forwarder.open(
            self.upstreams.render_order(), "POST", path, headers, body
        )
        raw = await self._read(node, response)
        if response.status_code != 200:
            raise _PassThrough(_passed(response, raw))
        return raw

    def _generate_request(
        self, rendered: GenerateRequest[Any], ask: _Ask, request_id: str
    ) -> GenerateRequest[Any]:
        # Render leaves out sampling values equal to vLLM's defaults; what the caller asked
        # for is written explicitly (as tandem_client's chat does).
        sampling = {**rendered.sampling_params, **ask.sampling()}
        return msgspec.structs.replace(
            rendered,
            request_id=request_id,
            sampling_params=sampling,
            stream=ask.stream,
            stream_options=None,
            return_token_ids=False,
        )

    def _generate_nodes(self, gen: GenerateRequest[Any]) -> list[Node]:
        feats = gen.features
        return self.upstreams.generate_order(
            affinity_key(feats.mm_hashes if feats else None, gen.request_id)
        )

    async def _open_generate(
        self, gen: GenerateRequest[Any], request: Request
    ) -> tuple[Node, httpx.Response]:
        body = encode_generate_request(gen, WireFormat.MSGPACK)
        headers = self._headers(request, _MSGPACK)
        node, response = await self.forwarder.open(
            self._generate_nodes(gen), "POST", "/inference/v1/generate", headers, body
        )
        if response.status_code != 200:
            raw = await self._read(node, response)
            raise _PassThrough(_passed(response, raw))
        return node, response

    async def _generate(self, gen: GenerateRequest[Any], request: Request) -> GenerateResponse:
        node, response = await self._open_generate(gen, request)
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

    # -- non-streaming documents -----------------------------------------------------------

    def _text(self, prompt: list[int], sampling: dict[str, Any], choice: Any) -> str:
        stream = self.texts.stream(prompt, sampling)
        _feed(stream, choice.token_ids or [], choice.finish_reason, choice.stop_reason)
        return stream.text(finished=True, delta=False)

    def _chat_document(
        self, gen: GenerateRequest[Any], result: GenerateResponse, ask: _Ask
    ) -> bytes:
        choices = []
        for c in result.choices:
            choices.append(
                {
                    "index": c.index,
                    "message": {
                        "role": "assistant",
                        "content": self._text(gen.token_ids, gen.sampling_params, c),
                    },
                    "logprobs": self._chat_logprobs(c.logprobs, ask),
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                    "token_ids": c.token_ids if ask.return_token_ids else None,
                }
            )
        fields = {
            "id": gen.request_id,
            "created": int(time.time()),
            "model": self._model(ask),
            "choices": choices,
            "usage": _usage(len(gen.token_ids), [result]),
            "prompt_token_ids": gen.token_ids if ask.return_token_ids else None,
        }
        return self.texts.shape("chat", fields)

    def _completion_document(
        self,
        rid: str,
        gens: list[GenerateRequest[Any]],
        results: list[GenerateResponse],
        ask: _Ask,
    ) -> bytes:
        choices = []
        n = int(ask.body.get("n") or 1)
        for p, (gen, result) in enumerate(zip(gens, results, strict=True)):
            for c in result.choices:
                choices.append(
                    {
                        "index": p * n + c.index,
                        "text": self._text(gen.token_ids, gen.sampling_params, c),
                        "logprobs": self._completion_logprobs(c.logprobs, ask),
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                        "token_ids": c.token_ids if ask.return_token_ids else None,
                        "prompt_token_ids": gen.token_ids if ask.return_token_ids else None,
                    }
                )
        prompt_tokens = sum(len(g.token_ids) for g in gens)
        fields = {
            "id": rid,
            "created": int(time.time()),
            "model": self._model(ask),
            "choices": choices,
            "usage": _usage(prompt_tokens, results),
        }
        return self.texts.shape("completion", fields)

    def _model(self, ask: _Ask) -> str:
        asked = ask.body.get("model")
        names = self.settings.names()
        return asked if isinstance(asked, str) and asked in names else names[0]

    @staticmethod
    def _answer(document: bytes) -> Response:
        return Response(document, media_type="application/json")

    # -- logprobs --------------------------------------------------------------------------

    def _positions(
        self, logprobs: ChoiceLogprobs, ask: _Ask, context: list[int]
    ) -> list[tuple[str, list[str]]]:
        """Per position: the sampled token's text and its top tokens' texts. ``context``: the
        tokens sampled before this part of the answer (extended here)."""
        out = []
        for e in logprobs.content or ():
            ids = [e.token_id, *(t.token_id for t in e.top_logprobs)]
            if ask.as_token_ids:
                texts = [f"token_id:{i}" for i in ids]
            else:
                texts = self.texts.logprob_tokens(ids, context)
            context.append(e.token_id)
            out.append((texts[0], texts[1:]))
        return out

    def _chat_logprobs(
        self, logprobs: ChoiceLogprobs | None, ask: _Ask, context: list[int] | None = None
    ) -> Any:
        if logprobs is None or ask.top is None:
            return None
        positions = self._positions(logprobs, ask, [] if context is None else context)

        def entry(token: str, logprob: float) -> dict[str, Any]:
            return {
                "token": token,
                "logprob": logprob,
                "bytes": list(token.encode("utf-8", errors="replace")),
            }

        top = ask.top
        return {
            "content": [
                {
                    **entry(token, e.logprob),
                    "top_logprobs": [
                        entry(text, t.logprob)
                        for i, (text, t) in enumerate(zip(tops, e.top_logprobs, strict=True))
                        if top == -1 or i < top
                    ],
                }
                for (token, tops), e in zip(positions, logprobs.content or (), strict=True)
            ]
        }

    def _completion_logprobs(
        self, logprobs: ChoiceLogprobs | None, ask: _Ask, context: list[int] | None = None
    ) -> Any:
        if logprobs is None or ask.top is None:
            return None
        positions = self._positions(logprobs, ask, [] if context is None else context)
        out: dict[str, list[Any]] = {
            "text_offset": [],
            "token_logprobs": [],
            "tokens": [],
            "top_logprobs": [],
        }
        offset = 0
        for (token, tops), e in zip(positions, logprobs.content or (), strict=True):
            out["text_offset"].append(offset)
            offset += len(token)
            out["tokens"].append(token)
            out["token_logprobs"].append(e.logprob)
            # OpenAI's completions: the top ``logprobs`` plus the sampled token.
            out["top_logprobs"].append(
                {
                    text: t.logprob
                    for i, (text, t) in enumerate(zip(tops, e.top_logprobs, strict=True))
                    if ask.top == -1 or i <= ask.top
                }
            )
        return out

    # -- streaming -------------------------------------------------------------------------

    async def _open_stream(
        self,
        request: Request,
        gens: list[GenerateRequest[Any]],
        ask: _Ask,
        rid: str | None = None,
    ) -> Response:
        # The first upstream is opened before answering, so its refusal is a proper HTTP
        # answer; later prompts of a multi-prompt completion stream one after the other.
        first = await self._open_generate(gens[0], request)
        events = self._stream_events(request, gens, first, ask, rid or gens[0].request_id)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _stream_events(
        self,
        request: Request,
        gens: list[GenerateRequest[Any]],
        first: tuple[Node, httpx.Response],
        ask: _Ask,
        rid: str,
    ) -> AsyncIterator[bytes]:
        kind = "chat_chunk" if ask.chat else "completion_chunk"
        obj = "chat.completion.chunk" if ask.chat else "text_completion"
        created = int(time.time())
        model = self._model(ask)
        n = int(ask.body.get("n") or 1)
        prompt_tokens = 0
        generated = 0
        opened: tuple[Node, httpx.Response] | None = first
        for p, gen in enumerate(gens):
            node, response = opened or await self._open_generate(gen, request)
            opened = None
            prompt_tokens += len(gen.token_ids)
            streams: dict[int, TextStream] = {}
            counts: dict[int, int] = {}
            sampled: dict[int, list[int]] = {}  # per choice: the logprob context so far
            try:
                if ask.chat:
                    for i in range(n):
                        fields: dict[str, Any] = {
                            "id": rid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "choices": [
                                {"index": i, "delta": {"role": "assistant", "content": ""}}
                            ],
                        }
                        if ask.return_token_ids:
                            fields["prompt_token_ids"] = gen.token_ids
                        if ask.continuous_usage:
                            fields["usage"] = _usage_fields(len(gen.token_ids), 0)
                        yield _sse(self.texts.shape(kind, fields, chunk=True))
                async for event in _events(response):
                    for c in event.get("choices") or ():
                        i = int(c["index"])
                        ids = list(c.get("token_ids") or [])
                        finish = c.get("finish_reason")
                        stream = streams.get(i)
                        if stream is None:
                            stream = streams[i] = self.texts.stream(
                                gen.token_ids, gen.sampling_params
                            )
                        _feed(stream, ids, finish, c.get("stop_reason"))
                        counts[i] = counts.get(i, 0) + len(ids)
                        generated += len(ids)
                        delta = stream.text(finished=finish is not None, delta=True)
                        lp = None
                        if c.get("logprobs") is not None:
                            parsed = msgspec.convert(c["logprobs"], ChoiceLogprobs)
                            context = sampled.setdefault(i, [])
                            lp = (
                                self._chat_logprobs(parsed, ask, context)
                                if ask.chat
                                else self._completion_logprobs(parsed, ask, context)
                            )
                        choice: dict[str, Any] = {"index": p * n + i, "logprobs": lp}
                        if ask.chat:
                            choice["delta"] = {"content": delta}
                        else:
                            choice["text"] = delta
                            if ask.return_token_ids and counts[i] == len(ids):
                                choice["prompt_token_ids"] = gen.token_ids
                        if finish is not None:
                            choice["finish_reason"] = finish
                            choice["stop_reason"] = c.get("stop_reason")
                        if ask.return_token_ids:
                            choice["token_ids"] = ids
                        chunk: dict[str, Any] = {
                            "id": rid,
                            "object": obj,
                            "created": created,
                            "model": model,
                            "choices": [choice],
                        }
                        if ask.continuous_usage:
                            chunk["usage"] = _usage_fields(len(gen.token_ids), counts[i])
                        yield _sse(self.texts.shape(kind, chunk, chunk=True))
            finally:
                await self.forwarder.close(node, response)
        if ask.include_usage:
            usage = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage_fields(prompt_tokens, generated),
            }
            yield _sse(self.texts.shape(kind, usage, chunk=True))
        yield b"data: [DONE]\n\n"


def _feed(stream: TextStream, ids: Sequence[int], finish: Any, stop_reason: Any) -> None:
    # One token per engine step, as vLLM's output processor feeds its detokenizer; the last
    # token is a stop token (left out of the text) when the engine itself stopped on it.
    stop_token = finish == "stop" and not isinstance(stop_reason, str)
    last = len(ids) - 1
    for k, token_id in enumerate(ids):
        stream.feed([token_id], stop_token and k == last)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if isinstance(event, dict) and "error" in event:
            raise UpstreamError(f"generate failed mid-stream: {str(event['error'])[:200]}")
        yield event


def _usage_fields(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _usage(prompt_tokens: int, results: Sequence[GenerateResponse]) -> dict[str, int]:
    generated = sum(len(c.token_ids or []) for r in results for c in r.choices)
    return _usage_fields(prompt_tokens, generated)


def _sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the body must be a JSON object")
    return parsed


def _passed(response: httpx.Response, raw: bytes) -> Response:
    """An upstream refusal for the caller: status, headers and document unchanged, but in JSON
    (the OpenAI routes' callers speak JSON; the door asked the tiers for msgpack)."""
    kept = [
        (k, v)
        for k, v in downstream_headers(response)
        if k not in (b"content-length", b"content-encoding", b"content-type")
    ]
    ctype = response.headers.get("content-type", "")
    if "msgpack" in ctype:
        try:
            raw = json.dumps(msgspec.msgpack.decode(raw), separators=(",", ":")).encode()
            ctype = "application/json"
        except (msgspec.DecodeError, TypeError, ValueError):
            raise UpstreamError("an upstream answered an unreadable error") from None
    passed = Response(raw, status_code=response.status_code)
    passed.raw_headers = [
        *kept,
        (b"content-type", (ctype or "application/json").encode("latin-1")),
        (b"content-length", str(len(raw)).encode("ascii")),
    ]
    return passed

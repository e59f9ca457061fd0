"""The generate service's logic, independent of HTTP: check, admit, run, shape the answer."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from tandem_http import BadRequest, ModelNotFound, PromptTooLong, Slot
from tandem_wire import (
    DecodeLimits,
    ErrorBody,
    ErrorInfo,
    GenerateRequest,
    GenerateResponse,
    ItemBytes,
    TandemHTTPError,
    WireFormat,
    decode_generate_request,
    encode_document,
)
from tandem_wire.streams import END_FRAME, encode_error_frame, encode_event_frame

from .content_parts import RENDER_URL_FLAG, ContentPartsResolver
from .engine import Engine
from .errors import EngineNotReady, UnsupportedSamplingParams
from .inputs import InputBuilder
from .item_store import ItemStore
from .metrics import GenerateMetrics
from .outputs import full_response, prompt_details, stream_choice, usage_chunk
from .sampling import build_sampling_params, check_structured_outputs, default_max_tokens
from .settings import GenerateSettings

__all__ = ["GenerateService"]

Disconnected = Callable[[], Awaitable[bool]]


class GenerateService:
    """Feeds checked, pre-rendered requests to the engine; one per process."""

    def __init__(
        self,
        settings: GenerateSettings,
        engine: Engine,
        metrics: GenerateMetrics,
        render_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """``render_transport``: how the content-parts render node is reached (tests pass
        an in-process one; None: the network)."""
        self.settings = settings
        self.engine = engine
        self.metrics = metrics
        self.items = ItemStore(settings.item_cache_bytes, metrics)
        self.max_body_bytes = settings.max_body_bytes or engine.spec.max_request_bytes(
            engine.max_model_len, settings.max_items_per_prompt
        )
        self.limits = DecodeLimits(max_body_bytes=self.max_body_bytes)
        self.builder = InputBuilder(
            engine.spec,
            self.items,
            vocab_size=engine.vocab_size,
            max_items=settings.max_items_per_prompt,
            limits=self.limits,
            mm_limits=engine.mm_limits,
            accept_embeds=engine.accepts_mm_embeds,
        )
        self.content_parts = (
            ContentPartsResolver(settings, self.max_body_bytes, render_transport)
            if settings.content_parts_render_url
            else None
        )

    async def aclose(self) -> None:
        if self.content_parts is not None:
            await self.content_parts.aclose()

    def _check_request(self, req: GenerateRequest[Any]) -> None:
        """What is refused before anything else is done for a request."""
        if req.model is not None and req.model not in self.settings.served_model_names:
            raise ModelNotFound(f"model {req.model[:80]!r} is not served here", param="model")
        if req.output_mode == "text" and req.sampling_params.get("detokenize") is False:
            raise BadRequest(
                "output_mode='text' requires sampling_params.detokenize to be true",
                param="output_mode",
            )
        if self.engine.errored:
            raise EngineNotReady("the engine has failed; the server must be restarted")

    async def resolve_content_parts(
        self, req: GenerateRequest[ItemBytes | None], slot: Slot | None
    ) -> GenerateRequest[ItemBytes | None]:
        """``req`` as if its caller had sent the token ids and features the render node
        answers for its ``content_parts`` (``tandem_generate.content_parts``); ``req`` itself
        when it has none. The items render answers are charged to the admission ``slot``."""
        if not req.content_parts:
            return req
        self._check_request(req)
        if self.content_parts is None:
            raise BadRequest(
                "content_parts are not served here: this node was started without "
                f"{RENDER_URL_FLAG} (the render node that resolves them); render the request "
                "first and send its features",
                param="content_parts",
            )
        return await self.content_parts.resolve(req, slot.take if slot is not None else None)

    def _prepare(
        self, req: GenerateRequest[ItemBytes | None], principal: str, slot: Slot | None
    ) -> tuple[Any, Any, int | None]:
        self._check_request(req)
        if req.content_parts:  # resolve_content_parts was not called first: a bug
            raise RuntimeError("content_parts reached _prepare unresolved")
        params = build_sampling_params(
            req.sampling_params,
            stream=bool(req.stream),
            max_n=self.engine.max_num_seqs,
            max_logprobs=self.engine.max_logprobs,
            vocab_size=self.engine.vocab_size,
            max_structured_output_bytes=(
                self.settings.max_structured_output_bytes
                if self.settings.structured_outputs
                else None
            ),
        )
        if params.seed is not None and not self.engine.seeded_sampling_safe:
            raise UnsupportedSamplingParams(
                "seeded sampling would crash vLLM's CPU engine: it splits prefills, and its "
                "workers (--worker-cls, or model runner V2) cannot rewind a CPU generator; "
                "run with the default worker, or --no-enable-chunked-prefill, to take seeds",
                param="sampling_params.seed",
            )
        room = self.engine.max_model_len - len(req.token_ids)
        if room > 0 and "max_tokens" not in req.sampling_params:
            # Absent means what it means to upstream's generate (not SamplingParams' 16).
            params.max_tokens = default_max_tokens(
                self.engine.max_tokens_defaults, len(req.token_ids)
            )
        elif params.max_tokens is None:  # an explicit null: as long as the context allows
            params.max_tokens = room
        if room <= 0 or params.max_tokens > room:
            raise PromptTooLong(
                f"{len(req.token_ids)} prompt tokens + max_tokens {params.max_tokens} exceed the "
                f"context of {self.engine.max_model_len}",
                param="sampling_params.max_tokens",
            )
        if req.output_mode == "text":
            params.detokenize = True  # the engine's own text: stop strings cut, pieces whole
        # Disaggregated serving's parameters reach the engine as upstream's generate passes
        # them (an engine without a KV/EC connector ignores them, as upstream's does).
        transfer = {"kv_transfer_params": req.kv_transfer_params}
        transfer["ec_transfer_params"] = req.ec_transfer_params
        transfer = {k: v for k, v in transfer.items() if v is not None}
        if transfer:
            params.extra_args = {**(params.extra_args or {}), **transfer}
        check_structured_outputs(self.engine, params)
        # What the items allocate is charged before it is (429/413 when it does not fit), and
        # held with the request until it is answered.
        take = slot.take if slot is not None else _uncharged
        inputs = self.builder.build(req, tenant_of(req), principal, take)
        return params, inputs, params.logprobs

    def decode(
        self, body: bytes, fmt: WireFormat, slot: Slot | None
    ) -> GenerateRequest[ItemBytes | None]:
        """The request in ``body``; the bytes its JSON entries decode to (base64) are charged
        to its admission ``slot`` before they are decoded (429/413 when they do not fit)."""
        reserve = slot.take if slot is not None else None
        return decode_generate_request(body, fmt, self.limits, reserve)

    def _start(
        self, req: GenerateRequest[Any], engine_id: str, params: Any, inputs: Any
    ) -> AsyncIterator[Any]:
        return self.engine.generate(
            inputs.token_ids,
            inputs.items,
            inputs.hashes,
            inputs.placeholders,
            params,
            engine_id,
            # Under priority scheduling a caller's priority jumps the queue: an operator choice.
            priority=req.priority if self.settings.allow_request_priority else 0,
            cache_salt=req.cache_salt,
            reasoning_ended=req.reasoning_ended,
        )

    async def generate(
        self,
        req: GenerateRequest[ItemBytes | None],
        disconnected: Disconnected,
        principal: str = "",
        slot: Slot | None = None,
        cached_tokens: bool = False,
    ) -> GenerateResponse | None:
        """Run to completion; None if the client went away (the engine request is aborted).
        ``principal`` is the API key the request came with (``tandem_http.principal_of``);
        what its items allocate is charged to its admission ``slot`` before it is;
        ``cached_tokens``: the caller asked for the prefix-cache hits (see ``counts_cached``)."""
        params, inputs, top_n = self._prepare(req, principal, slot)
        start = time.perf_counter()
        engine_id = engine_request_id(req)
        task = asyncio.ensure_future(_last(self._start(req, engine_id, params, inputs)))
        try:
            while not task.done():
                done, _ = await asyncio.wait({task}, timeout=self.settings.disconnect_poll_s)
                if not done and await disconnected():
                    return None  # the engine request is aborted below
            result = task.result()
        finally:
            # The client went away, or this handler itself was cancelled (server shutdown):
            # no generation may be left running for nobody.
            if not task.done():
                task.cancel()  # vLLM aborts the request when its generator is cancelled
                await self.engine.abort(engine_id)
                self.metrics.requests.labels("aborted").inc()
        self.metrics.requests.labels("ok").inc()
        self.metrics.latency.observe(time.perf_counter() - start)
        self.metrics.generated_tokens.inc(sum(len(o.token_ids) for o in result.outputs))
        return full_response(
            result,
            request_id=req.request_id,
            model=req.model or self.settings.served_model_names[0],
            top_n=top_n,
            echo_prompt=bool(req.return_token_ids),
            placeholders=req.features.mm_placeholders if req.features else None,
            text=self._text_tokenizer(req),
            cached_tokens=self.counts_cached(cached_tokens),
        )

    def counts_cached(self, asked: bool) -> bool:
        """Whether an answer's usage tells the prefix-cache hits: on every answer with
        ``--enable-prompt-tokens-details``, else when the caller asked."""
        return asked or self.settings.enable_prompt_tokens_details

    def _text_tokenizer(self, req: GenerateRequest[Any]) -> Any:
        """The tokenizer of a ``text``-mode answer; None in ``tokens`` mode."""
        return self.engine.tokenizer if req.output_mode == "text" else None

    def stream(
        self,
        req: GenerateRequest[ItemBytes | None],
        principal: str = "",
        slot: Slot | None = None,
        cached_tokens: bool = False,
        framed: bool = False,
    ) -> AsyncIterator[bytes]:
        """Check now (errors become proper HTTP answers); return the stream's body: SSE, or
        with ``framed`` the binary stream's frames (``tandem_wire.streams``), which carry the
        same documents. Outputs the engine made while the reader was not taking them come as
        one chunk (vLLM's output collector merges a request's pending deltas)."""
        params, inputs, top_n = self._prepare(req, principal, slot)
        chunks = self._chunks(req, params, inputs, top_n, self.counts_cached(cached_tokens))
        return _frames(chunks) if framed else _sse_events(chunks)

    async def _chunks(
        self, req: Any, params: Any, inputs: Any, top_n: int | None, cached_tokens: bool
    ) -> AsyncIterator[Any]:
        """The stream's documents: one per engine output, then the usage when asked."""
        options = req.stream_options or {}
        prompt_tokens = len(inputs.token_ids)
        cached: int | None = None
        generated = 0
        first = True
        finished = False
        start = time.perf_counter()
        engine_id = engine_request_id(req)
        text = self._text_tokenizer(req)
        try:
            async for res in self._start(req, engine_id, params, inputs):
                choices = [stream_choice(o, top_n, text) for o in res.outputs]
                generated += sum(len(c.token_ids or []) for c in choices)
                chunk: dict[str, Any] = {
                    "request_id": req.request_id,
                    "choices": choices,
                    "output_mode": req.output_mode,
                }
                if first and req.return_token_ids:
                    chunk["prompt_token_ids"] = inputs.token_ids
                    chunk["mm_placeholders"] = (
                        req.features.mm_placeholders if req.features else None
                    )
                first = False
                yield chunk
                finished = res.finished
                cached = res.num_cached_tokens if res.num_cached_tokens is not None else cached
            if options.get("include_usage"):
                details = prompt_details(cached, cached_tokens)
                yield usage_chunk(
                    req.request_id, prompt_tokens, generated, text is not None, details
                )
            self.metrics.requests.labels("ok").inc()
            self.metrics.latency.observe(time.perf_counter() - start)
            self.metrics.generated_tokens.inc(generated)
        finally:
            if not finished:
                # The client went away mid-stream (or the engine failed): free the engine slot.
                self.metrics.requests.labels("aborted").inc()
                await self.engine.abort(engine_id)


async def _sse_events(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """Upstream's stream: each document as an SSE event, then ``[DONE]``."""
    try:
        async for chunk in chunks:
            yield _sse(encode_document(chunk, WireFormat.JSON))
        yield b"data: [DONE]\n\n"
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


async def _frames(chunks: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """The binary stream: each document as an ``EVENT`` frame, then ``END``. A typed error
    mid-stream is sent as the stream's ``ERROR`` frame (its reader learns what failed, and the
    connection is kept); anything else cuts the stream, as it cuts an SSE one."""
    try:
        async for chunk in chunks:
            yield encode_event_frame(chunk)
    except TandemHTTPError as exc:
        info = ErrorInfo(type=exc.type, message=exc.message, code=exc.status_code, param=exc.param)
        yield encode_error_frame(ErrorBody(info))
        return
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    yield END_FRAME


def _uncharged(nbytes: int) -> None:
    """A request without an admission slot (tests, in-process callers) is charged nothing."""


def engine_request_id(req: GenerateRequest[Any]) -> str:
    """The engine's id for a request: the caller's, made unique, so that one caller's
    disconnect can never abort another caller's request that reuses the same id. Answers
    still carry the caller's id."""
    return f"{req.request_id}-{secrets.token_hex(8)}"


def tenant_of(req: GenerateRequest[Any]) -> str:
    """The tenant a request names: its cache_salt (as for the engine's prefix cache). Content
    ids are computed with it; held items are scoped by it and by the caller's API key."""
    return req.cache_salt or ""


async def _last(results: AsyncIterator[Any]) -> Any:
    last = None
    async for res in results:
        last = res
    if last is None:
        raise EngineNotReady("the engine returned no output")
    return last


def _sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"

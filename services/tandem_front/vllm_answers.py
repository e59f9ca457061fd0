"""vLLM adapter of the front door: the OpenAI answers written by ``vllm serve``'s own code.

Generate answers token ids, as vLLM's engine core does. This module does what the rest of
vLLM does with them in ``vllm serve``: the output processor's detokenization (stop strings,
stop tokens, the streamed hold-back) and logprob token texts, then the answer itself through
``vllm serve``'s ``OpenAIServingChat`` / ``OpenAIServingCompletion`` (tool calls, reasoning,
echo, logprobs, usage, which chunks are sent and when). Their tool and reasoning parser
options come from the builder render's derender uses (``tandem_vllm.derender``). A caller
that asks (``WEIGHT_VERSIONS_HEADER``) also gets generate's ``weight_versions`` on each choice,
which vLLM 0.32's answers do not carry.

The only module of tandem_front that imports vLLM (a CPU import: tokenizer files only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextvars import ContextVar
from typing import Any, cast

import msgspec
from openai.types.responses import ResponseErrorEvent
from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.anthropic.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
)
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMValidationError
from vllm.inputs import TokensPrompt, tokens_input
from vllm.logprobs import Logprob
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.renderers.hf import resolve_chat_template
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.tokenizers import cached_tokenizer_from_config
from vllm.tokenizers.detokenizer_utils import convert_ids_list_to_tokens
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from vllm.v1.engine.logprobs import LogprobsProcessor
from vllm.version import __version__ as VLLM_VERSION  # type: ignore[attr-defined]

from tandem_http import BadRequest, Overloaded
from tandem_vllm.derender import model_registry, online_options
from tandem_vllm.sampling import sampling_params_to_wire
from tandem_vllm.upstream_names import check_upstream_names
from tandem_vllm.validation import VALIDATOR_SLIPS, first_error
from tandem_wire import (
    ChoiceLogprobs,
    GenerateRequest,
    GenerateResponse,
    GenerateStreamResponse,
    TandemHTTPError,
    WeightVersionSpan,
    error_types,
)

from .errors import UpstreamError
from .openai_service import RenderProbe, ResponsesHops, StreamEvent, Written
from .settings import FrontSettings

__all__ = ["VllmAnswers"]

log = logging.getLogger(__name__)

# The SamplingParams fields that decide detokenized text and stop-string cuts.
_TEXT_FIELDS = (
    "stop",
    "min_tokens",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)
# What vLLM's chat serving takes of the options render's derender is built with.
_CHAT_OPTIONS = (
    "request_logger",
    "chat_template",
    "chat_template_content_format",
    "trust_request_chat_template",
    "enable_auto_tools",
    "exclude_tools_when_tool_choice_none",
    "tool_parser",
    "tool_strict_level",
    "default_chat_template_kwargs",
)
# What vLLM's Messages serving takes of them (vllm serve passes the same).
_MESSAGES_OPTIONS = (
    "request_logger",
    "chat_template",
    "chat_template_content_format",
    "enable_auto_tools",
    "tool_parser",
    "tool_strict_level",
    "default_chat_template_kwargs",
)
_DONE = "data: [DONE]\n\n"


class _TokenizerSide:
    """What vLLM's serving classes read of a renderer: the tokenizer (no processor)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._executor = None

    def get_tokenizer(self) -> Any:
        return self.tokenizer


class _Engine:
    """What vLLM's serving classes read of an engine client at construction."""

    def __init__(self, model_config: Any, tokenizer: Any) -> None:
        self.model_config = model_config
        self.renderer = _TokenizerSide(tokenizer)
        self.input_processor = None
        self.vllm_config = None


class _TemplateSide:
    """What vLLM's Messages serving reads of its renderer at construction: the template."""

    def __init__(self, tokenizer: Any, chat_template: str | None, model_config: Any) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.model_config = model_config


class _DoorMessages(AnthropicServingMessages):
    """vLLM's Messages serving, its renderer a render node: the template probes go there."""

    probe: RenderProbe | None = None

    @classmethod
    def _should_merge_inline_system(cls, online_renderer: Any) -> bool:
        # As upstream's for an HF renderer: the templates it would apply, with and without
        # tools (ours has the tokenizer only, no renderer to ask).
        side: _TemplateSide = online_renderer
        variants: tuple[list[dict[str, Any]] | None, ...] = (None, [])
        return any(
            cls._detect_merge_inline_system(
                resolve_chat_template(
                    side.tokenizer, side.chat_template, tools, model_config=side.model_config
                )
            )
            for tools in variants
        )

    async def _render_probe_prompt(self, effort: Any) -> tuple[list[int] | None, None] | None:
        if self.probe is None:
            return None
        body = {"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}
        ids = await self.probe(body)
        return None if ids is None else (ids, None)


# The door request a Responses call serves: set around vLLM's ``create_responses``, read by
# the renderer below, which hands it on to the engine client in the engine input.
_HOPS: ContextVar[ResponsesHops | None] = ContextVar("tandem_responses_hops", default=None)
_HOPS_KEY = "tandem_hops"


async def _fail_stored(
    serving: OpenAIServingResponses, response_id: str, exc: Exception
) -> dict[str, str]:
    """``serving``'s stored response ``failed`` with ``exc`` as its error (``code``, ``message``, as
    OpenAI's Response carries it), unless it already ended; the error."""
    if isinstance(exc, TandemHTTPError):
        error = {"code": exc.type, "message": exc.message}
    else:
        log.error("background response %s failed", response_id, exc_info=exc)
        error = {
            "code": error_types.INTERNAL_ERROR,
            "message": f"internal error (response id {response_id})",
        }
    async with serving.response_store_lock:
        stored = serving.response_store.get(response_id)
        if stored is not None and stored.status not in ("completed", "cancelled"):
            stored.status = "failed"
            # OpenAI's field, which vLLM's model lacks (it takes extra fields).
            setattr(stored, "error", error)  # noqa: B010
    return error


class _DoorResponsesRenderer(OnlineRenderer):
    """vLLM's online renderer for its Responses serving, the chat it renders rendered on a
    render node: vLLM builds the messages and tools of the request (``render_responses``:
    instructions, earlier turns, tool calls and outputs, images), a render node applies the
    template to them and processes the images, as for a chat request."""

    async def preprocess_chat(
        self,
        request: ResponsesRequest,
        messages: list[Any],
        default_template: str | None,
        default_template_content_format: Any,
        default_template_kwargs: dict[str, Any] | None,
        tool_dicts: list[dict[str, Any]] | None = None,
        parser: Any = None,
        *,
        skip_mm_cache: bool = False,
    ) -> tuple[list[Any], list[Any]]:
        hops = _HOPS.get()
        if hops is None:
            raise RuntimeError("a Responses prompt is rendered only within a door request")
        body = _responses_chat_body(request, messages, default_template_kwargs, tool_dicts)
        ids = await hops.render(_json(body))
        # vLLM's own length rule for a Responses prompt (max_output_tokens counted).
        prompt = TokensPrompt(prompt_token_ids=list(ids))
        tok = request.build_tok_params(self.model_config)
        checked = tok.apply_post_tokenization(self.renderer.tokenizer, prompt)
        if len(checked["prompt_token_ids"]) != len(ids):
            # Cutting a rendered prompt would cut through its images' placeholders.
            raise BadRequest(
                "truncation 'auto' of a prompt past the context is not served by the door: "
                "send a shorter input",
                param="truncation",
            )
        engine_input = tokens_input(list(ids), cache_salt=request.cache_salt)
        cast(dict[str, Any], engine_input)[_HOPS_KEY] = hops
        return [], [engine_input]


def _responses_chat_body(
    request: ResponsesRequest,
    messages: list[Any],
    template_kwargs: dict[str, Any] | None,
    tool_dicts: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The chat request a render node renders for a Responses call: vLLM's messages, and its
    template arguments as its Responses serving resolved them. The tools go to the template
    as the Responses serving gives them (not as chat tools: those would be checked against
    chat's tool-choice rules, which the Responses API does not have)."""
    kwargs = dict(template_kwargs or {})
    if tool_dicts:
        kwargs["tools"] = tool_dicts
    body: dict[str, Any] = {
        "messages": [_chat_message(m) for m in to_jsonable_python(messages)],
        "chat_template_kwargs": kwargs,
        # Chat's own flags, set as the template arguments say (chat would override them).
        "add_generation_prompt": kwargs.get("add_generation_prompt", True),
        "continue_final_message": kwargs.get("continue_final_message", False),
        "priority": request.priority,
    }
    if isinstance(request.model, str):
        body["model"] = request.model
    for name in ("cache_salt", "mm_processor_kwargs", "media_io_kwargs"):
        value = getattr(request, name, None)
        if value is not None:
            body[name] = value
    document: dict[str, Any] = to_jsonable_python(body)
    return document


def _chat_message(message: Any) -> Any:
    """A message of vLLM's Responses conversation as the chat route takes it: its Responses
    ``input_image`` parts as the ``image_url`` parts vLLM's chat parser reads them as (the
    chat route's media screen takes those); anything else unchanged."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    return {**message, "content": [_chat_part(p) for p in content]}


def _chat_part(part: Any) -> Any:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        image = {"url": part["image_url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    return part


class _ResponsesEngine(_Engine):
    """What vLLM's Responses serving asks of its engine client: each generation is the
    request's generate hop, its answer made into the engine's outputs (``_Outputs``)."""

    errored = False
    answers: VllmAnswers
    """Whose output processing the answers get (set once they are built)."""

    def check_admission(self, n: int = 1) -> None:
        """The door admits requests itself (``tandem_http.admission``)."""

    async def generate(
        self, prompt: Any, sampling_params: SamplingParams, request_id: str, **_: Any
    ) -> AsyncIterator[RequestOutput]:
        hops: ResponsesHops = prompt[_HOPS_KEY]
        sampling = _generate_sampling(sampling_params)
        gen: GenerateRequest[Any] = GenerateRequest(
            token_ids=list(prompt["prompt_token_ids"]),
            sampling_params=sampling,
            request_id=request_id,
        )
        outputs = _Outputs(self.answers, gen, None)
        if sampling_params.output_kind == RequestOutputKind.FINAL_ONLY:
            result = await hops.whole(request_id, sampling)
            if len(result.choices) != 1:  # vLLM's Responses serving reads exactly one
                raise UpstreamError(f"generate answered {len(result.choices)} choices, not 1")
            yield outputs.request_output(result.choices, None, whole=result)
            return
        # The last output waits for the usage chunk that follows it: the prefix-cache hits
        # vLLM's Responses usage reads from the request's last output (the engine knows them
        # from the first; generate tells them at the end).
        last: RequestOutput | None = None
        async for event in hops.events(request_id, sampling):
            choices = _choices(event)
            if last is not None and not choices:  # the usage chunk
                last.num_cached_tokens = _cached_tokens(_usage(event))
                continue
            output = outputs.request_output(choices, None)
            if any(c.finish_reason is not None for c in choices):
                last = output
            elif choices:
                yield output
        if last is None:
            raise UpstreamError("generate's stream ended before its answer did")
        yield last


def _cached_tokens(usage: Any) -> int:
    """The prefix-cache hits a generate answer's usage tells (0 when it tells none)."""
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
    else:
        details = getattr(usage, "prompt_tokens_details", None)
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else 0


def _generate_sampling(params: SamplingParams) -> dict[str, Any]:
    """vLLM's sampling for a Responses call, as generate takes it (without the empty
    ``extra_args`` vLLM's Responses request always sets: the caller's are refused first)."""
    wire = sampling_params_to_wire(params)
    wire.pop("extra_args", None)
    return wire


def _written(answer: Any) -> Written:
    """What vLLM's Responses serving answered, as ``vllm serve``'s routes write it."""
    if isinstance(answer, ErrorResponse):
        return Written(answer.error.code, _json(answer.model_dump(mode="json", by_alias=True)))
    if isinstance(answer, BaseModel):
        return Written(200, _json(answer.model_dump(mode="json", by_alias=True)))
    return Written(200, events=_sse(answer))


async def _sse(events: AsyncGenerator[Any, None]) -> AsyncIterator[bytes]:
    """vLLM's Responses events as its server sends them (each named by its ``type``)."""
    try:
        async for event in events:
            kind = getattr(event, "type", "unknown")
            data = event.model_dump_json(indent=None, by_alias=True)
            yield f"event: {kind}\ndata: {data}\n\n".encode()
    finally:
        await events.aclose()


def _held_size(root: object) -> int:
    """The bytes Python holds for ``root`` and what it reaches through containers and pydantic
    models: ``sys.getsizeof`` of each object once (a model's field dict and fields-set
    included; None, booleans, classes and dict keys, which every object shares, left out).
    JSON lengths undercount what is held several times over: a one-token stream event is
    ~150 bytes of JSON and ~1 KB of objects; this estimate is within ~20 % of tracemalloc's
    count of what a stored response keeps alive."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        obj = todo.pop()
        if obj is None or isinstance(obj, (bool, type)) or id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            todo.extend(obj)
        elif isinstance(obj, BaseModel):
            todo += [obj.__dict__, obj.__pydantic_extra__]
            total += sys.getsizeof(obj.__pydantic_fields_set__)
    return total


class _Entry:
    """One stored response: whose it is, its counted bytes, and the runs still writing it."""

    __slots__ = ("tenant", "kept", "events", "runs")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.kept = 0
        """Bytes of its answer and input messages (until vLLM stores them: its request body's)."""
        self.events = 0
        """Bytes of the background stream events kept for it."""
        self.runs = 0
        """Runs still writing it (a request in the door, a background task, a stream being
        read): while any is, it is never evicted, since its run stores its answer at its end."""

    @property
    def nbytes(self) -> int:
        return self.kept + self.events


class _Tenant:
    """One tenant's stored responses, oldest first, and the bytes counted for them."""

    __slots__ = ("entries", "held", "running")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.held = 0
        self.running: set[str] = set()


class _Store:
    """Whose each stored response is, and what the store holds: vLLM keeps a response's
    answer, input messages and background events in three dicts keyed by its id (for ever,
    its own notes say); here each id belongs to the tenant that stored it (another tenant
    finds it as unknown), and what vLLM keeps of it is counted (``_held_size``) against its
    tenant's ``budget``: past it that tenant's oldest finished responses are evicted from all
    three, never another tenant's nor one still running. A tenant whose running responses
    alone hold its budget is refused a new one (429) until one ends."""

    def __init__(self, serving: OpenAIServingResponses, budget: int) -> None:
        self.serving = serving
        self.budget = budget
        self.held = 0
        """Bytes counted across all tenants."""
        self._entries: dict[str, _Entry] = {}
        self._tenants: dict[str, _Tenant] = {}

    def visible(self, response_id: str, tenant: str) -> bool:
        """Whether ``tenant`` may read, cancel or continue ``response_id``."""
        entry = self._entries.get(response_id)
        return entry is None or entry.tenant == tenant

    def claim(self, response_id: str, tenant: str, nbytes: int, continues: str | None) -> bool:
        """``response_id`` is ``tenant``'s from now on, held by the run that claims it (until
        ``ended``), counted as its input ``nbytes`` (and the turns of the response it
        ``continues``, kept again with it) until vLLM has stored it; False if it is
        another's. Raises Overloaded when ``tenant``'s running responses hold its budget."""
        entry = self._entries.get(response_id)
        if entry is not None and entry.tenant != tenant:
            return False
        owner = self._tenants.setdefault(tenant, _Tenant())
        self._check_room(owner)
        if entry is None:
            entry = self._entries[response_id] = owner.entries[response_id] = _Entry(tenant)
        else:
            owner.entries.move_to_end(response_id)  # stored again: the newest
        entry.runs += 1
        owner.running.add(response_id)
        earlier = self._entries.get(continues) if continues is not None else None
        self._count(response_id, nbytes + (earlier.kept if earlier is not None else 0))
        return True

    def _check_room(self, owner: _Tenant) -> None:
        # Running responses cannot be evicted: past the budget with them alone, a new one
        # waits for one to end rather than growing the store without bound.
        running = sum(self._entries[rid].nbytes for rid in owner.running)
        if owner.running and running >= self.budget:
            raise Overloaded(
                f"this key's running stored responses hold {running} bytes, the Responses "
                f"store's {self.budget} per key; retry once one ends (or send store: false)",
                retry_after=1,
                details={"running_stored_bytes": running, "responses_store_bytes": self.budget},
            )

    def measure(self, response_id: str) -> None:
        """What vLLM keeps of ``response_id`` (its answer, its input messages) counted anew;
        its events stay counted while vLLM keeps them."""
        if response_id not in self._entries:
            return
        serving = self.serving
        kept = _held_size(serving.response_store.get(response_id))
        self._count(response_id, kept + _held_size(serving.msg_store.get(response_id)))

    def kept_event(self, response_id: str, event: Any) -> None:
        """``event`` of ``response_id``'s background stream is kept (counted with it)."""
        entry = self._entries.get(response_id)
        if entry is not None:
            self._count(response_id, entry.kept, entry.events + _held_size(event))

    def _count(self, response_id: str, kept: int, events: int | None = None) -> None:
        """``response_id`` counted as ``kept`` bytes and ``events`` (None: its events as
        counted, or none once vLLM let them go); then its tenant trimmed to its budget."""
        entry = self._entries.get(response_id)
        if entry is None:
            return
        if events is None:
            events = entry.events if response_id in self.serving.event_store else 0
        owner = self._tenants[entry.tenant]
        change = kept + events - entry.nbytes
        entry.kept, entry.events = kept, events
        owner.held += change
        self.held += change
        self._trim(owner, response_id)

    def ended(self, response_id: str) -> None:
        """A run of ``response_id`` ended: unless another still writes it, it may be evicted
        (not now: its answer was just stored)."""
        entry = self._entries.get(response_id)
        if entry is None or entry.runs == 0:
            return
        entry.runs -= 1
        owner = self._tenants[entry.tenant]
        if entry.runs == 0:
            owner.running.discard(response_id)
        self._trim(owner, response_id)

    def _trim(self, owner: _Tenant, keep: str) -> None:
        """``owner``'s oldest finished responses but ``keep`` evicted until it fits its
        budget (a running one is skipped: its run would store its answer for nobody)."""
        over = owner.held - self.budget
        evicted = []
        for rid, entry in owner.entries.items():
            if over <= 0:
                break
            if entry.runs == 0 and rid != keep:
                evicted.append(rid)
                over -= entry.nbytes
        for rid in evicted:
            self._drop(rid)
            self.settle(rid)

    def _drop(self, response_id: str) -> None:
        entry = self._entries.pop(response_id)
        owner = self._tenants[entry.tenant]
        del owner.entries[response_id]
        owner.running.discard(response_id)
        owner.held -= entry.nbytes
        self.held -= entry.nbytes
        if not owner.entries:
            del self._tenants[entry.tenant]

    def unused(self, response_id: str) -> None:
        """A claim of a request that stored nothing (refused before vLLM stored it) let go."""
        serving = self.serving
        stored = response_id in serving.response_store or response_id in serving.msg_store
        if not stored and response_id in self._entries:
            self._drop(response_id)

    def settle(self, response_id: str) -> None:
        """vLLM's entries of a response the store does not hold let go."""
        if response_id not in self._entries:
            self.serving.response_store.pop(response_id, None)
            self.serving.msg_store.pop(response_id, None)
            self.serving.event_store.pop(response_id, None)

    async def held_while_read(
        self, response_id: str, events: AsyncGenerator[Any, None]
    ) -> AsyncGenerator[Any, None]:
        """A foreground stream's ``events``, holding ``response_id`` (its run's claim) until
        the stream ends or is closed: vLLM stores its answer at the stream's end. The door's
        route reads the stream at once (``_until``), so an unread one holds nothing for long."""
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()
            self.ended(response_id)


_LAST_EVENTS = frozenset({"response.completed", "error"})
"""The events a response's stream ends with (an ``error`` event: it failed)."""


def _forget_ended_run(serving: _DoorResponses, rid: str) -> None:
    """A ``request_id`` used again once its run has ended starts a new run: its stream is the
    new run's events, as ``vllm serve`` streams it, not the old run's kept ones (the run's own
    store is made with ``setdefault``, which would keep them; no longer counted either)."""
    run = serving.background_tasks.get(rid)
    if run is None or run.done():
        serving.event_store.pop(rid, None)
        serving.store.measure(rid)


class _DoorResponses(OpenAIServingResponses):
    """vLLM's Responses serving with what its background mode lacks at the door: a run's
    event stream can be read before its task has started (vLLM hands it back right after
    creating the task), a run that fails (a refusal of either hop, or any error) ends
    ``failed`` with its error and ends its event stream with an ``error`` event (vLLM would
    leave it ``queued`` and its readers waiting for ever), and the store is ``_Store``'s."""

    store: _Store

    async def create_responses(self, request: ResponsesRequest, raw_request: Any = None) -> Any:
        if request.background and request.stream:
            _forget_ended_run(self, request.request_id)
        answer = await super().create_responses(request, raw_request)
        if request.background and request.stream and not isinstance(answer, ErrorResponse):
            # The run's event store, made before its task makes it at its first step: the
            # stream handed back may be read first.
            self.event_store.setdefault(request.request_id, (deque(), asyncio.Event()))
        return answer

    async def responses_full_generator(
        self, request: ResponsesRequest, *args: Any, **kwargs: Any
    ) -> ErrorResponse | ResponsesResponse:
        answer = await super().responses_full_generator(request, *args, **kwargs)
        if request.store and isinstance(answer, ResponsesResponse):
            self.store.measure(answer.id)
        return answer

    async def _run_background_request(
        self, request: ResponsesRequest, *args: Any, **kwargs: Any
    ) -> None:
        try:
            await super()._run_background_request(request, *args, **kwargs)
        except Exception as exc:
            await _fail_stored(self, request.request_id, exc)

    async def _run_background_request_stream(
        self, request: ResponsesRequest, *args: Any, **kwargs: Any
    ) -> None:
        rid = request.request_id
        made: tuple[deque[Any], asyncio.Event] = (deque(), asyncio.Event())
        events, signal = cast(Any, self.event_store).setdefault(rid, made)
        try:
            async for event in self.responses_stream_generator(request, *args, **kwargs):
                events.append(event)
                self.store.kept_event(rid, event)
                signal.set()
        except Exception as exc:
            error = await _fail_stored(self, rid, exc)
            failed = ResponseErrorEvent(
                type="error", sequence_number=len(events), param=None, **error
            )
            events.append(failed)
            self.store.kept_event(rid, failed)
        finally:
            signal.set()

    async def responses_background_stream_generator(
        self, response_id: str, starting_after: int | None = None
    ) -> AsyncGenerator[Any, None]:
        """vLLM's, ending with a failed run's ``error`` event, or with its run whatever it
        sent (a cancelled run sends no last event)."""
        if response_id not in self.event_store:
            raise VLLMValidationError(
                f"Unknown response_id: {response_id}", parameter="response_id", value=response_id
            )
        events, signal = self.event_store[response_id]
        run = self.background_tasks.get(response_id)
        at = 0 if starting_after is None else starting_after + 1
        while True:
            signal.clear()
            while at < len(events):
                event = events[at]
                yield event
                if getattr(event, "type", None) in _LAST_EVENTS:
                    return
                at += 1
            if run is None or run.done():
                return
            await signal.wait()


class VllmAnswers:
    """The answer side of the OpenAI routes, done by vLLM's own code."""

    def __init__(self, settings: FrontSettings) -> None:
        check_upstream_names(["front"])  # a vLLM upgrade fails here, not mid-request
        self.vllm_version: str = VLLM_VERSION
        names = list(settings.names())
        args = AsyncEngineArgs(
            model=settings.model,
            tokenizer=settings.tokenizer,
            trust_remote_code=settings.trust_remote_code,
            served_model_name=names,
            mm_processor_cache_gb=0,  # no processor here: tokenizer files only
            enforce_eager=True,
            reasoning_parser=settings.reasoning_parser or "",
        )
        model_config = args.create_model_config()
        model_config.quantization = None  # no weights are loaded here
        self.tokenizer = cached_tokenizer_from_config(model_config)
        engine = _Engine(model_config, self.tokenizer)
        registry = model_registry(model_config, names, settings.model)
        shared = online_options(settings, model_config, engine.renderer)
        chat = {k: shared[k] for k in _CHAT_OPTIONS}
        self.chat_serving = OpenAIServingChat(
            engine,  # type: ignore[arg-type]
            registry,  # type: ignore[arg-type]
            "assistant",
            online_renderer=None,  # type: ignore[arg-type]  # rendering is render's
            reasoning_parser=shared["reasoning_parser"] or "",
            **chat,
        )
        self.completion_serving = OpenAIServingCompletion(
            engine,  # type: ignore[arg-type]
            registry,  # type: ignore[arg-type]
            online_renderer=None,  # type: ignore[arg-type]
            request_logger=None,
        )
        self.messages_serving = _DoorMessages(
            engine,  # type: ignore[arg-type]
            registry,  # type: ignore[arg-type]
            "assistant",
            online_renderer=_TemplateSide(self.tokenizer, shared["chat_template"], model_config),  # type: ignore[arg-type]
            reasoning_parser=shared["reasoning_parser"] or "",
            **{k: shared[k] for k in _MESSAGES_OPTIONS},
        )
        responses_engine = _ResponsesEngine(model_config, self.tokenizer)
        self.responses_serving = _DoorResponses(
            responses_engine,  # type: ignore[arg-type]
            registry,  # type: ignore[arg-type]
            _DoorResponsesRenderer(**shared),
            reasoning_parser=shared["reasoning_parser"] or "",
            **{k: shared[k] for k in _MESSAGES_OPTIONS},  # what vllm serve passes it too
        )
        self.responses_serving.store = _Store(
            self.responses_serving, settings.responses_store_bytes
        )
        responses_engine.answers = self
        if self.responses_serving.enable_store and settings.workers > 1:
            log.warning(
                "VLLM_ENABLE_RESPONSES_API_STORE is on with %d door workers: each keeps its "
                "own store, so a stored response is found only by the worker that made it "
                "(run the door with --workers 1 to use previous_response_id and retrieve)",
                settings.workers,
            )
        # Until a generate node tells its own: none (vLLM's would hash no configuration).
        self.chat_serving.system_fingerprint = None
        self.completion_serving.system_fingerprint = None
        self.max_logprobs: int = model_config.max_logprobs
        # vLLM's engine-side logprob-token decoding (its correction of byte-fallback pieces).
        self._logprobs = LogprobsProcessor(
            tokenizer=self.tokenizer,
            logprobs=None,
            prompt_logprobs=None,
            cumulative_logprob=None,
            num_logprobs=None,
            num_prompt_logprobs=None,
        )

    async def messages_plan(self, body: dict[str, Any], probe: RenderProbe) -> _MessagesPlan:
        """``/v1/messages``: the body as vLLM's server validates it (400 if not), turned into
        the chat request vLLM's Messages serving makes of it (``probe``: how its template
        probes are rendered)."""
        request = _validated(AnthropicMessagesRequest, body)
        chat = await self._as_chat(request, probe)
        return _MessagesPlan(self, request, _validated(ChatCompletionRequest, chat))

    async def count_tokens_body(self, body: dict[str, Any], probe: RenderProbe) -> dict[str, Any]:
        """``/v1/messages/count_tokens``: the chat request whose prompt is counted."""
        return await self._as_chat(_validated(AnthropicCountTokensRequest, body), probe)

    async def _as_chat(
        self, request: AnthropicMessagesRequest | AnthropicCountTokensRequest, probe: RenderProbe
    ) -> dict[str, Any]:
        serving = self.messages_serving
        effort: Any = "none"
        if request.thinking is not None and request.thinking.type == "disabled":
            serving.probe = probe  # asked once; vLLM's serving keeps the answer
            effort = await serving._get_disabled_thinking_effort()
        try:
            chat = serving.to_chat_completion_request(
                request,
                merge_inline_system=serving._merge_inline_system,
                disabled_thinking_effort=effort,
            )
        except (ValueError, TypeError, KeyError) as exc:  # vLLM's conversion refused it
            raise BadRequest(str(exc)[:300]) from None
        document: dict[str, Any] = chat.model_dump(mode="json", exclude_unset=True)
        return document

    async def responses(
        self, body: dict[str, Any], hops: ResponsesHops, tenant: str, size: int
    ) -> Written:
        """``/v1/responses``: vLLM's Responses serving, its prompt rendered and generated by
        ``hops``; the body as vLLM's server validates it (400 if not). A stored response is
        ``tenant``'s: another's is not found, whether continued or named as ``request_id``;
        429 when ``tenant``'s running stored responses hold its store budget."""
        request = _validated(ResponsesRequest, body)
        serving = self.responses_serving
        if serving.use_harmony:
            raise BadRequest(
                "the door does not serve the Responses API of Harmony (gpt-oss) models"
            )
        for name in ("vllm_xargs", "kv_transfer_params", "ec_transfer_params"):
            if getattr(request, name, None):
                raise BadRequest(f"{name} is not served on the door's Responses route", param=name)
        self._check_writable(request)
        store, rid = serving.store, request.request_id
        earlier = request.previous_response_id
        if earlier is not None and not store.visible(earlier, tenant):
            return _written(serving._make_not_found_error(earlier))
        stored = bool(request.store and serving.enable_store)
        if stored and not store.claim(rid, tenant, size, earlier):
            return _written(serving._make_not_found_error(rid))
        token = _HOPS.set(hops)
        answer: Any = None
        try:
            answer = await serving.create_responses(request)
        except VLLMValidationError as exc:
            raise BadRequest(
                str(exc.args[0] if exc.args else exc)[:300], param=exc.parameter
            ) from None
        finally:
            _HOPS.reset(token)
            if stored:
                store.measure(rid)
                answer = self._hand_over(request, answer)
                store.unused(rid)
                store.settle(rid)
        written = _written(answer)
        if request.background and not isinstance(answer, ErrorResponse):
            written.running = serving.background_tasks.get(rid)
        return written

    def _hand_over(self, request: ResponsesRequest, answer: Any) -> Any:
        """The claim of a stored request handed to what goes on writing its response (a
        background run's task, a foreground stream: ``answer`` wrapped), or let go (a whole
        answer, a refusal); ``answer`` as it is to be sent."""
        serving, rid = self.responses_serving, request.request_id
        store = serving.store
        run = serving.background_tasks.get(rid) if request.background else None
        if run is not None and not isinstance(answer, ErrorResponse):
            run.add_done_callback(lambda _: store.ended(rid))
        elif isinstance(answer, AsyncGenerator):
            return store.held_while_read(rid, answer)
        else:
            store.ended(rid)
        return answer

    def _check_writable(self, request: ResponsesRequest) -> None:
        """A request whose fields vLLM's answer cannot carry (``background: null`` and the
        like: its request model takes them, its response model does not) is refused before
        anything runs, rather than failing once generated."""
        try:
            ResponsesResponse.from_request(
                request, SamplingParams(), model_name="", created_time=0, output=[], status="queued"
            )
        except ValidationError as exc:
            raise BadRequest(first_error(exc)) from None

    async def retrieve_response(
        self, response_id: str, starting_after: int | None, stream: bool, tenant: str
    ) -> Written:
        """``GET /v1/responses/{id}``: a response this door worker stored for ``tenant``."""
        serving = self.responses_serving
        if not serving.store.visible(response_id, tenant):
            return _written(serving._make_not_found_error(response_id))
        answer = await serving.retrieve_responses(
            response_id, starting_after=starting_after, stream=stream
        )
        return _written(answer)

    async def cancel_response(self, response_id: str, tenant: str) -> Written:
        """``POST /v1/responses/{id}/cancel``: a background response of this door worker
        (``tenant``'s)."""
        serving = self.responses_serving
        if not serving.store.visible(response_id, tenant):
            return _written(serving._make_not_found_error(response_id))
        return _written(await serving.cancel_responses(response_id))

    def saw_fingerprint(self, fingerprint: str) -> None:
        # vLLM's serving code writes the fingerprint its engine has; here the engine is the
        # generate node's (one configuration across a fleet: the last one seen is the one).
        self.chat_serving.system_fingerprint = fingerprint
        self.completion_serving.system_fingerprint = fingerprint

    def plan(
        self, body: dict[str, Any], chat: bool, *, weight_versions: bool = False
    ) -> _ChatPlan | _CompletionPlan:
        """One request's answer side; the body as vLLM's server validates it (400 if not);
        ``weight_versions``: each choice carries generate's spans."""
        if chat:
            return _ChatPlan(self, _validated(ChatCompletionRequest, body), weight_versions)
        return _CompletionPlan(self, _validated(CompletionRequest, body), weight_versions)

    # -- what vLLM's output processor makes of engine token ids ----------------------------

    def detokenizer(self, prompt: list[int], sampling: dict[str, Any]) -> IncrementalDetokenizer:
        given = {k: sampling[k] for k in _TEXT_FIELDS if sampling.get(k) is not None}
        request = EngineCoreRequest(
            request_id="front",
            prompt_token_ids=prompt,
            mm_features=None,
            sampling_params=msgspec.convert(given, SamplingParams),
            pooling_params=None,
            arrival_time=0.0,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        return IncrementalDetokenizer.from_new_request(self.tokenizer, request)

    def _token_texts(self, ids: list[int], context: list[int]) -> list[str]:
        """The texts vLLM's engine gives these candidate ids after ``context`` (split UTF-8
        pieces completed from the tokens before)."""
        texts: list[str] = self._logprobs._verify_tokens(
            convert_ids_list_to_tokens(self.tokenizer, ids), ids, context
        )
        return texts

    def steps(
        self, logprobs: ChoiceLogprobs, context: list[int], keep_rank: int | None
    ) -> list[dict[int, Logprob]]:
        """The engine's per-position logprob dicts (sampled token first, then by rank) with
        the token texts its LogprobsProcessor writes; ``context``: the tokens sampled before
        (extended here); ``keep_rank``: keep only the sampled token and ranks up to it."""
        out: list[dict[int, Logprob]] = []
        for e in logprobs.content or ():
            tops = [
                t
                for j, t in enumerate(e.top_logprobs)
                if keep_rank is None or j == 0 or (t.rank is not None and t.rank <= keep_rank)
            ]
            ids = [e.token_id, *(t.token_id for t in tops)]
            texts = self._token_texts(ids, context)
            step = {e.token_id: Logprob(e.logprob, e.rank, texts[0])}
            for t, text in zip(tops, texts[1:], strict=True):
                step.setdefault(t.token_id, Logprob(t.logprob, t.rank, text))
            context.append(e.token_id)
            out.append(step)
        return out

    def prompt_steps(self, response: GenerateResponse) -> list[dict[int, Logprob] | None] | None:
        """Generate's ``prompt_logprobs`` as the engine's (token texts as it decodes them)."""
        if response.prompt_logprobs is None:
            return None
        out: list[dict[int, Logprob] | None] = []
        for position in response.prompt_logprobs:
            if position is None:
                out.append(None)
                continue
            ids = [int(t) for t in position]
            # As the engine: split UTF-8 pieces completed from the prompt tokens before (the
            # first key of each of the last four positions).
            context = [next(iter(p)) for p in out[-4:] if p]
            texts = self._token_texts(ids, context)
            out.append(
                {
                    i: Logprob(p.logprob, p.rank, text)
                    for i, p, text in zip(ids, position.values(), texts, strict=True)
                }
            )
        return out


class _Sample:
    """One choice's output as vLLM's output processor makes it from the engine's tokens."""

    def __init__(self, side: VllmAnswers, prompt: list[int], sampling: dict[str, Any]) -> None:
        self.side = side
        self.detok = side.detokenizer(prompt, sampling)
        self.context: list[int] = []

    def output(self, choice: Any, keep_rank: int | None, *, delta: bool) -> CompletionOutput:
        ids = list(choice.token_ids or [])
        finish, stop_reason = choice.finish_reason, choice.stop_reason
        # One token per engine step, as vLLM's output processor feeds its detokenizer; the
        # last token is a stop token (left out of the text) when the engine stopped on it.
        stop_token = finish == "stop" and not isinstance(stop_reason, str)
        for k, token_id in enumerate(ids):
            self.detok.update([token_id], stop_token and k == len(ids) - 1)
        logprobs = None
        if choice.logprobs is not None:
            logprobs = self.side.steps(choice.logprobs, self.context, keep_rank)
        return CompletionOutput(
            index=choice.index,
            text=self.detok.get_next_output_text(finish is not None, delta),
            token_ids=ids,
            cumulative_logprob=None,
            logprobs=logprobs,
            finish_reason=finish,
            stop_reason=stop_reason,
        )


class _Outputs:
    """One prompt's samples, streamed or whole."""

    def __init__(self, side: VllmAnswers, gen: GenerateRequest[Any], keep_rank: int | None):
        self.side = side
        self.gen = gen
        self.keep_rank = keep_rank
        self.samples: dict[int, _Sample] = {}

    def _sample(self, index: int) -> _Sample:
        if index not in self.samples:
            self.samples[index] = _Sample(self.side, self.gen.token_ids, self.gen.sampling_params)
        return self.samples[index]

    def request_output(
        self, choices: Sequence[Any], prompt: str | None, *, whole: GenerateResponse | None = None
    ) -> RequestOutput:
        outputs = [
            self._sample(c.index).output(c, self.keep_rank, delta=whole is None) for c in choices
        ]
        return RequestOutput(
            request_id=self.gen.request_id,
            prompt=prompt,
            prompt_token_ids=self.gen.token_ids,
            prompt_logprobs=None if whole is None else self.side.prompt_steps(whole),
            outputs=outputs,
            finished=whole is not None,
            kv_transfer_params=None if whole is None else whole.kv_transfer_params,
            num_cached_tokens=None if whole is None else _cached_tokens(whole.usage),
        )


class _Plan:
    """What one request's answer needs besides generate's tokens."""

    request: Any
    stream_end = _DONE.encode()

    def __init__(self, side: VllmAnswers, weight_versions: bool) -> None:
        self.side = side
        self.failure: BaseException | None = None
        # Generate's spans of each finished choice, by the answer's choice index; None: not
        # asked for (the answer is vllm serve's, field for field).
        self.spans: dict[int, list[WeightVersionSpan] | None] | None = (
            {} if weight_versions else None
        )

    def _saw(self, index: int, choice: Any) -> None:
        """Generate's choice, which is the answer's choice ``index``."""
        if self.spans is not None and choice.finish_reason is not None:
            self.spans[index] = choice.weight_versions

    def _document(self, answer: Any) -> bytes:
        """A whole answer serialized as ``vllm serve`` does (each choice with its spans when
        asked); vLLM's error on our own generate's output is the upstream's fault (502)."""
        if isinstance(answer, ErrorResponse):
            raise UpstreamError(
                f"generate's answer could not be written up: {answer.error.message}"[:300]
            )
        document = answer.model_dump()
        if self.spans is not None:
            _stamp(document["choices"], self.spans)
        return _json(document)

    def _stamped(self, piece: str) -> str:
        """A chunk of vLLM's stream, with generate's spans on each choice it finishes when
        asked (any other chunk unchanged, byte for byte)."""
        if self.spans is None:
            return piece
        chunk = json.loads(piece.removeprefix("data: "))
        ending = [c for c in chunk.get("choices") or () if c.get("finish_reason") is not None]
        if not ending:
            return piece
        _stamp(ending, self.spans)
        return f"data: {_json(chunk).decode()}\n\n"

    def sampling(self, rendered: dict[str, Any]) -> dict[str, Any]:
        """The generate request's sampling: render's, as rendered."""
        return rendered

    @property
    def keep_rank(self) -> int | None:
        return None

    async def _relayed(self, pieces: AsyncIterator[str]) -> AsyncIterator[bytes]:
        """vLLM's stream without its ``[DONE]``; a failure of our own upstreams is raised
        (the door's error tail answers it) rather than written up by vLLM's generator."""
        try:
            async for piece in pieces:
                if self.failure is not None:
                    raise self.failure
                if piece != _DONE:
                    yield self._stamped(piece).encode()
            if self.failure is not None:
                raise self.failure
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]

    async def _watched(self, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
        try:
            async for item in source:
                yield item
        except Exception as exc:
            self.failure = exc
            raise


class _ChatPlan(_Plan):
    def __init__(
        self, side: VllmAnswers, request: ChatCompletionRequest, weight_versions: bool
    ) -> None:
        super().__init__(side, weight_versions)
        self.request = request
        self.serving = side.chat_serving
        self.stream = bool(request.stream)

    def _conversation(self) -> list[Any]:
        # What echo reads of vLLM's parsed conversation: the last message's text.
        last = self.request.messages[-1] if self.request.messages else {}
        content = last.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
        return [{"role": last.get("role"), "content": content}]

    async def whole(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        results: list[GenerateResponse],
    ) -> bytes:
        (gen,), (result,) = gens, results
        res = _Outputs(self.side, gen, None).request_output(result.choices, None, whole=result)
        for choice in result.choices:
            self._saw(choice.index, choice)

        async def once() -> AsyncIterator[RequestOutput]:
            yield res

        serving = self.serving
        parser = None
        if serving.parser_cls is not None:
            kwargs = serving._effective_chat_template_kwargs(self.request)
            parser = serving._make_parser(self.request, self.side.tokenizer, kwargs)
        answer = await serving.chat_completion_full_generator(
            self.request,
            once(),
            rid,
            model,
            self._conversation(),
            self.side.tokenizer,
            RequestResponseMetadata(request_id=rid),
            parser=parser,
        )
        return self._document(answer)

    def chunks(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        events: AsyncIterator[tuple[int, StreamEvent]],
    ) -> AsyncIterator[bytes]:
        (gen,) = gens
        outputs = _Outputs(self.side, gen, None)

        async def results() -> AsyncIterator[RequestOutput]:
            async for _, event in events:
                choices = _choices(event)
                for choice in choices:
                    self._saw(choice.index, choice)
                yield outputs.request_output(choices, None)

        kwargs = self.serving._effective_chat_template_kwargs(self.request)
        pieces = self.serving.chat_completion_stream_generator(
            self.request,
            self._watched(results()),
            rid,
            model,
            self._conversation(),
            self.side.tokenizer,
            RequestResponseMetadata(request_id=rid),
            chat_template_kwargs=kwargs,
        )
        return self._relayed(pieces)


class _CompletionPlan(_Plan):
    def __init__(
        self, side: VllmAnswers, request: CompletionRequest, weight_versions: bool
    ) -> None:
        super().__init__(side, weight_versions)
        self.request = request
        self.serving = side.completion_serving
        self.stream = bool(request.stream)
        if self.stream and request.echo and request.logprobs is not None:
            # Generate's stream carries no prompt logprobs for vLLM's echo to list.
            raise BadRequest(
                "echo with logprobs is answered whole by the front door: ask without stream",
                param="echo",
            )

    @property
    def keep_rank(self) -> int | None:
        k = self.request.logprobs
        return k if isinstance(k, int) else None

    def sampling(self, rendered: dict[str, Any]) -> dict[str, Any]:
        # vLLM's completions list ``logprobs`` candidates besides the sampled token (k + 1
        # when it is not among the top k); generate, as vLLM's, lists ``logprobs`` entries
        # counting it. One more asked of the engine gives the missing one (``steps`` keeps
        # the sampled token and ranks up to k); the sampling itself is unchanged.
        k = rendered.get("logprobs")
        if isinstance(k, int) and 0 <= k < self.side.max_logprobs:
            return {**rendered, "logprobs": k + 1}
        return rendered

    def _prompts(self, gens: list[GenerateRequest[Any]]) -> list[str | None]:
        asked = self.request.prompt
        if isinstance(asked, str):
            return [asked]
        if isinstance(asked, list) and all(isinstance(p, str) for p in asked):
            return list(asked)
        tok = self.side.tokenizer
        return [tok.decode(g.token_ids) for g in gens]

    async def whole(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        results: list[GenerateResponse],
    ) -> bytes:
        batch = [
            _Outputs(self.side, gen, self.keep_rank).request_output(r.choices, text, whole=r)
            for gen, r, text in zip(gens, results, self._prompts(gens), strict=True)
        ]
        # vLLM numbers a whole answer's choices in turn, prompt after prompt.
        for index, choice in enumerate(c for r in results for c in r.choices):
            self._saw(index, choice)
        try:
            answer = self.serving.request_output_to_completion_response(
                batch,
                self.request,
                rid,
                _created(),
                model,
                self.side.tokenizer,
                RequestResponseMetadata(request_id=rid),
            )
        except (ValueError, KeyError, IndexError, TypeError, AssertionError) as exc:
            raise UpstreamError(
                f"generate's answer could not be written up: {exc!r}"[:300]
            ) from None
        return self._document(answer)

    def chunks(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        events: AsyncIterator[tuple[int, StreamEvent]],
    ) -> AsyncIterator[bytes]:
        outputs = [_Outputs(self.side, g, self.keep_rank) for g in gens]
        texts = self._prompts(gens)
        n = self.request.n or 1

        async def results() -> AsyncIterator[tuple[int, RequestOutput]]:
            async for p, event in events:
                choices = _choices(event)
                for choice in choices:  # vLLM's streamed index: prompt p's n choices from p * n
                    self._saw(p * n + choice.index, choice)
                yield p, outputs[p].request_output(choices, texts[p])

        pieces = self.serving.completion_stream_generator(
            self.request,
            [{"type": "token", "prompt_token_ids": g.token_ids} for g in gens],
            self._watched(results()),
            rid,
            _created(),
            model,
            len(gens),
            self.side.tokenizer,
            RequestResponseMetadata(request_id=rid),
        )
        return self._relayed(pieces)


def _choices(event: StreamEvent) -> list[Any]:
    """A generate stream event's choices, read as the wire's (a bad one is the node's fault):
    a binary stream's are the wire's already; an SSE event's are read here."""
    if isinstance(event, GenerateStreamResponse):
        return event.choices
    try:
        return [_StreamChoice(c) for c in event.get("choices") or ()]
    except (msgspec.ValidationError, KeyError, TypeError, ValueError):
        raise UpstreamError("generate sent an unreadable stream event") from None


def _usage(event: StreamEvent) -> Any:
    """A generate stream event's usage (None when it has none)."""
    if isinstance(event, GenerateStreamResponse):
        return event.usage
    return event.get("usage")


class _StreamChoice:
    __slots__ = (
        "index",
        "token_ids",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "weight_versions",
    )

    def __init__(self, c: dict[str, Any]) -> None:
        self.index = int(c["index"])
        self.token_ids = list(c.get("token_ids") or [])
        lp = c.get("logprobs")
        self.logprobs = None if lp is None else msgspec.convert(lp, ChoiceLogprobs)
        self.finish_reason = c.get("finish_reason")
        self.stop_reason = c.get("stop_reason")
        spans = c.get("weight_versions")
        self.weight_versions = (
            None if spans is None else msgspec.convert(spans, list[WeightVersionSpan])
        )


def _created() -> int:
    return int(time.time())


def _stamp(choices: Any, spans: dict[int, list[WeightVersionSpan] | None]) -> None:
    """Answer choices (JSON objects) given generate's spans of each, as ``weight_versions``
    (null when generate gave none)."""
    for choice in choices:
        got = spans.get(choice["index"])
        choice["weight_versions"] = None if got is None else msgspec.to_builtins(got)


def _json(document: Any) -> bytes:
    """JSON as ``vllm serve`` writes it (UTF-8, compact)."""
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


class _MessagesPlan:
    """``/v1/messages``: the chat request vLLM's Messages serving makes of the body, answered
    as the chat route answers it, then turned into a Messages answer by that serving (whole,
    or its events: it ends the stream itself, and writes a failure as an ``error`` event)."""

    stream_end = b""

    def __init__(
        self, side: VllmAnswers, request: AnthropicMessagesRequest, chat: ChatCompletionRequest
    ) -> None:
        self.serving = side.messages_serving
        self.chat = _ChatPlan(side, chat, weight_versions=False)
        self.stream = self.chat.stream
        self.request = request
        # What render is asked to render (serialized once: it holds the images).
        self.chat_body = _json(chat.model_dump(mode="json", exclude_unset=True))

    def sampling(self, rendered: dict[str, Any]) -> dict[str, Any]:
        return self.chat.sampling(rendered)

    async def whole(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        results: list[GenerateResponse],
    ) -> bytes:
        chat = ChatCompletionResponse.model_validate_json(
            await self.chat.whole(rid, model, gens, results)
        )
        return _json(self.serving.messages_full_converter(chat).model_dump(exclude_none=True))

    def chunks(
        self,
        rid: str,
        model: str,
        gens: list[GenerateRequest[Any]],
        events: AsyncIterator[tuple[int, StreamEvent]],
    ) -> AsyncIterator[bytes]:
        return self._converted(self.chat.chunks(rid, model, gens, events))

    async def _converted(self, pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async def chat() -> AsyncGenerator[str, None]:
            async for piece in pieces:
                yield piece.decode()
            yield _DONE

        events = self.serving.message_stream_converter(chat())
        try:
            async for event in events:
                yield event.encode()
        finally:
            await events.aclose()
            await pieces.aclose()  # type: ignore[attr-defined]


def _validated(model: Any, body: dict[str, Any]) -> Any:
    """``body`` as vLLM's server validates it for ``model``; a 400 if it does not."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(first_error(exc)) from None
    except VLLMValidationError as exc:
        raise BadRequest(str(exc.args[0] if exc.args else exc)[:300], param=exc.parameter) from None
    except VALIDATOR_SLIPS as exc:
        raise BadRequest(f"the body is not valid: {exc}"[:300]) from None

"""vLLM's own render stack (chat template, tokenizer, HF processor, hashing) without an engine.

The one module of the render service that drives vLLM: requests go through upstream's
``ServingRender`` so token ids, hashes, placeholders and sampling parameters are exactly what
``vllm launch render`` computes; only the feature serialization is ours.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import msgspec
import numpy as np
from pydantic import TypeAdapter, ValidationError
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.scale_out.render.serving import ServingRender
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    DerenderChatRequest,
    DerenderChatStreamRequest,
    DerenderChatStreamResponse,
    DerenderCompletionRequest,
    DerenderCompletionStreamRequest,
    DerenderCompletionStreamResponse,
)
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    MultiModalFeatures as UpstreamFeatures,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.entrypoints.serve.tokenize.protocol import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
from vllm.exceptions import VLLMClientError
from vllm.model_executor.models.qwen2_vl import Qwen2VLProcessingInfo
from vllm.multimodal.media import ImageMediaIO, VideoMediaIO
from vllm.renderers import renderer_from_config
from vllm.renderers.chat_utils import ChatTemplateResolutionError
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.transformers_utils.processor import get_video_processor_cls_name
from vllm.utils.async_utils import make_async
from vllm.version import __version__ as VLLM_VERSION  # type: ignore[attr-defined]

from tandem_http import (
    BadRequest,
    ModelNotFound,
    PromptTooLong,
    TokenOutOfVocabulary,
    VllmBadRequest,
)
from tandem_http.openapi import REF_TEMPLATE, BodySchemas
from tandem_vllm.derender import model_registry, online_options, serving_derender
from tandem_vllm.features import encode_vllm_item, features_from_engine_input
from tandem_vllm.requests import UpstreamGenerateRequest, generate_request_to_wire
from tandem_vllm.upstream_names import check_upstream_names
from tandem_vllm.validation import VALIDATOR_SLIPS, first_error
from tandem_vllm.wire_transforms import wire_transforms_for
from tandem_wire import GenerateRequest, TandemHTTPError, named_by_content

from .embeds import EmbedsSpec
from .inline import InlineExecutor
from .media import AudioDecoding
from .media_connector import (
    DecodedCache,
    PrefetchedMediaConnector,
    VideoLimits,
    check_video_bytes,
    decode_media,
    decoded_size,
    register_connector,
)
from .prepare import MEDIA_URL_PREFIX, ItemLimit, ProcessorFacts
from .render_call import PromptMedia, RenderCall, bound, current
from .settings import RenderSettings

__all__ = ["EngineRenderer", "ItemEncoder"]

log = logging.getLogger(__name__)

ItemEncoder = Callable[[str, Any], bytes]
"""(mm_hash, vLLM kwargs item) -> encoded item bytes; lets the caller cache by hash."""

_CONTEXT_LENGTH = re.compile(r"context length", re.IGNORECASE)
_INPUT_ERRORS = [
    _CONTEXT_LENGTH,
    # The prompt's placeholders do not match its media (e.g. fewer image tokens than images
    # in a token-id prompt): vLLM's processor asserts or raises RuntimeError.
    re.compile(r"^Failed to apply prompt replacement"),
    re.compile(r"^Expected there to be \d+ prompt (updates|placeholders)"),
    # The model's HF processor raised on the request's media (vLLM wraps whatever it raised).
    re.compile(r"^Failed to apply \w+ on data="),
]
"""vLLM's messages for input errors raised as plain ValueError/TypeError/AssertionError."""
_EMPTY_FEATURES = UpstreamFeatures(mm_hashes={}, mm_placeholders={})


class _CapturingServingRender(ServingRender):
    """Upstream's render logic; keeps the engine inputs instead of base64-encoding features."""

    def _extract_mm_features(self, engine_input: Any, *, mm_payload: Any = "tensors") -> Any:
        call = current()
        if call is None:
            raise RuntimeError("rendered outside EngineRenderer: no RenderCall is bound")
        call.captured.append((engine_input, mm_payload))
        return None if engine_input.get("type") != "multimodal" else _EMPTY_FEATURES


class _MediaOnlineRenderer(OnlineRenderer):
    """Adds media per completion prompt (token ids or text), which upstream lacks: the
    prompt's ``multi_modal_data``, as upstream's generate hands its processor."""

    async def render_completion(self, request: Any, *, skip_mm_cache: bool = False) -> Any:
        call = current()
        media = call.prompt_media if call is not None else None
        if not media or all(m is None for m in media):
            return await super().render_completion(request, skip_mm_cache=skip_mm_cache)
        prompts: list[Any] = []
        for prompt, mm in zip(_as_prompt_list(request.prompt), media, strict=True):
            key = "prompt" if isinstance(prompt, str) else "prompt_token_ids"
            prompts.append({key: prompt, "multi_modal_data": mm} if mm else {key: prompt})
        return await self.preprocess_cmpl(request, prompts, skip_mm_cache=skip_mm_cache)


def _as_prompt_list(prompt: Any) -> list[Any]:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt or [])


class EngineRenderer:
    """Renders chat and completion requests into wire generate requests."""

    def __init__(self, settings: RenderSettings) -> None:
        check_upstream_names(["render"])  # a vLLM upgrade fails here, not mid-request
        # Every media URL vLLM sees is one we substituted; this connector serves their bytes.
        register_connector(inline=settings.inline_processing)
        names = list(settings.names())
        # Only what the operator set: vLLM's defaults (999, capped by the model) otherwise.
        limits: dict[str, int | dict[str, int]] = {**settings.limit_mm_per_prompt()}
        engine_args = AsyncEngineArgs(
            model=settings.model,
            tokenizer=settings.tokenizer,
            revision=settings.revision,
            trust_remote_code=settings.trust_remote_code,
            max_model_len=settings.max_model_len,  # type: ignore[arg-type]  # None: the model's
            served_model_name=names,
            limit_mm_per_prompt=limits,
            mm_processor_cache_gb=settings.mm_processor_cache_gb,
            # vLLM's own gate for embedding inputs stays open: ours is in prepare.py
            # (--enable-mm-embeds), which alone lets an embedding part reach vLLM, checked.
            enable_mm_embeds=True,
            enforce_eager=True,
            reasoning_parser=settings.reasoning_parser or "",
        )
        model_config = engine_args.create_model_config()
        model_config.quantization = None  # no weights are loaded here
        vllm_config = VllmConfig(
            model_config=model_config,
            structured_outputs_config=engine_args.create_structured_outputs_config(),
        )
        renderer = renderer_from_config(vllm_config)
        if settings.inline_processing:
            _run_inline(renderer)
        # As `vllm launch render` builds both: the renderer and the derenderer share the
        # template and the tool/reasoning parser options (one builder, the door's too).
        shared = online_options(
            settings, model_config, renderer, vllm_config.structured_outputs_config.reasoning_parser
        )
        # Per-request processor kwargs are screened against an allowlist before this point.
        self.online = _MediaOnlineRenderer(**shared, trust_request_mm_kwargs=True)
        self.online.warmup()
        registry = model_registry(model_config, names, settings.model)
        self.serving = _CapturingServingRender(registry, self.online)
        self.derender = serving_derender(registry, shared)
        # `vllm launch render`'s /tokenize and /detokenize, over the same renderer.
        self.tokenization = ServingTokenization(
            registry,
            self.online,
            chat_template=shared["chat_template"],
            chat_template_content_format=shared["chat_template_content_format"],
            default_chat_template_kwargs=shared["default_chat_template_kwargs"],
            trust_request_chat_template=shared["trust_request_chat_template"],
        )
        self.vllm_version: str = VLLM_VERSION
        self.model_config = model_config
        self.max_model_len: int = model_config.max_model_len
        self.vocab_size: int = len(self.online.renderer.get_tokenizer())
        self.is_multimodal: bool = bool(model_config.is_multimodal_model)
        self.processor_facts = _processor_facts(renderer.mm_processor, model_config)
        mm_processor = renderer.mm_processor
        self.wire_transforms = wire_transforms_for(
            mm_processor.info.get_hf_processor() if mm_processor is not None else None
        )
        self.video_limits = VideoLimits(
            max_seconds=settings.max_video_seconds,
            max_frames=settings.max_video_frames,
            max_frame_pixels=settings.max_image_pixels,
            max_decoded_bytes=settings.max_decoded_video_bytes,
        )
        # What vLLM's video IO decodes per video (-1: every frame); media_io_kwargs from
        # requests are refused, so only the operator's --media-io-kwargs change it.
        mm_config = model_config.multimodal_config
        video_io = mm_config.media_io_kwargs.get("video", {}) if mm_config else {}
        default_frames = VideoMediaIO(ImageMediaIO()).num_frames
        self._video_frames = int(video_io.get("num_frames", default_frames))
        self.audio_decoding = AudioDecoding(
            limits=settings.media_policy().audio_limits,
            sample_rate=_audio_sample_rate(mm_processor),
        )
        self._token_rule = _image_token_rule(mm_processor)
        # The connector vLLM's chat parser loads (the model's media_io_kwargs; it serves only
        # the bytes a RenderCall names), for completion media decoded as chat parts are.
        self._connector = PrefetchedMediaConnector(
            media_io_kwargs=mm_config.media_io_kwargs if mm_config else None
        )
        self._video_processor = get_video_processor_cls_name(model_config)

    def load_image(self, data: bytes, decoded: DecodedCache | None = None) -> Any:
        """Decode with vLLM's own image IO, as the chat path does, so hashes agree."""
        return decode_media(ImageMediaIO(), data, decoded)

    def load_media(self, modality: str, data: bytes, decoded: DecodedCache | None = None) -> Any:
        """Decode one completion item's vetted bytes exactly as the chat route decodes a part
        of ``modality``, so items and hashes agree: videos and audio clips through vLLM's own
        fetch calls on the media connector (the model's video backend and media IO options,
        the clip limits, resampling to the model's rate), which serve only these bytes."""
        if modality == "image":
            return self.load_image(data, decoded)
        token = f"{MEDIA_URL_PREFIX}completion"
        call = RenderCall(media={token: data}, decoded=decoded, audio=self.audio_decoding)
        with bound(call):
            if modality == "video":
                return self._connector.fetch_video(token, video_processor=self._video_processor)
            if modality == "audio":
                return self._connector.fetch_audio(token)
        raise ValueError(f"unknown modality {modality!r}")  # prepare.py makes none

    def check_video_bytes(self, data: bytes) -> int:
        """Refuse, from the container's header, a video that would cost too much to decode;
        else the bytes its sampled frames decode to."""
        sampled = self._video_frames if self._video_frames > 0 else 2**31
        return check_video_bytes(data, self.video_limits, sampled)

    def image_tokens(self, width: int, height: int, mm_kwargs: Mapping[str, Any]) -> int | None:
        """Placeholder tokens of a ``width`` x ``height`` image under the request's
        ``mm_processor_kwargs``, by vLLM's own resize rule (None: no rule known here)."""
        if self._token_rule is None:
            return None
        info, image_processor = self._token_rule
        tokens: int = info.get_num_image_tokens(
            image_width=width,
            image_height=height,
            image_processor=image_processor,
            mm_kwargs=mm_kwargs,
        )
        return tokens

    def new_decoded_cache(self, budget_bytes: int) -> DecodedCache:
        return DecodedCache(budget_bytes, decoded_size)

    def accepted_wire_transforms(self, asked: frozenset[str], coded: bool) -> frozenset[str]:
        return self.wire_transforms.accepted(asked, coded)

    def encode_item(self, item: Any, transforms: frozenset[str] = frozenset()) -> bytes:
        """Wire bytes of an item, in those of ``transforms`` this model has where exact."""
        return encode_vllm_item(item, self.wire_transforms, transforms)

    async def render_chat(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: ItemEncoder,
        decoded: DecodedCache | None = None,
        *,
        embeds: Mapping[str, np.ndarray] | None = None,
    ) -> GenerateRequest[bytes | None]:
        """``embeds``: token -> tensor of the request's checked embedding parts (prepare.py)."""
        request = _validate(ChatCompletionRequest, body)
        call = self._conversation_call(media, decoded, embeds)
        result = await _in_call(call, self.serving.render_chat_request(request))
        return self._to_wire(result, call.captured[0], encode)

    def _conversation_call(
        self,
        media: Mapping[str, bytes],
        decoded: DecodedCache | None,
        embeds: Mapping[str, np.ndarray] | None,
    ) -> RenderCall:
        """The hand-off of a one-prompt render (chat, Responses, Messages)."""
        return RenderCall(
            media=media, embeds=embeds or {}, decoded=decoded, audio=self.audio_decoding
        )

    async def render_completion(
        self,
        body: dict[str, Any],
        prompt_media: PromptMedia | None,
        encode: ItemEncoder,
    ) -> list[GenerateRequest[bytes | None]]:
        request = _validate(CompletionRequest, body)
        call = RenderCall(prompt_media=prompt_media)
        results = await _in_call(call, self.serving.render_completion_request(request))
        return [self._to_wire(r, c, encode) for r, c in zip(results, call.captured, strict=True)]

    async def render_responses(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: ItemEncoder,
        decoded: DecodedCache | None = None,
        *,
        embeds: Mapping[str, np.ndarray] | None = None,
    ) -> GenerateRequest[bytes | None]:
        """A Responses request (its media already tokens naming ``media``), as upstream."""
        request = _validate(ResponsesRequest, body)
        call = self._conversation_call(media, decoded, embeds)
        result = await _in_call(call, self.serving.render_responses_request(request))
        wire = self._to_wire(result, call.captured[0], encode)
        # Upstream's Responses render passes the caller's transfer parameters on.
        return msgspec.structs.replace(
            wire,
            kv_transfer_params=result.kv_transfer_params,
            ec_transfer_params=result.ec_transfer_params,
        )

    async def render_messages(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        encode: ItemEncoder,
        decoded: DecodedCache | None = None,
        *,
        embeds: Mapping[str, np.ndarray] | None = None,
    ) -> GenerateRequest[bytes | None]:
        """An Anthropic Messages request (its media already tokens naming ``media``)."""
        request = _validate(AnthropicMessagesRequest, body)
        call = self._conversation_call(media, decoded, embeds)
        result = await _in_call(call, self.serving.render_messages_request(request))
        return self._to_wire(result, call.captured[0], encode)

    async def tokenize(
        self,
        body: dict[str, Any],
        media: Mapping[str, bytes],
        decoded: DecodedCache | None = None,
        *,
        embeds: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """``/tokenize`` as ``vllm serve`` answers it: a prompt, or chat messages (their media
        already tokens naming ``media``) rendered as the chat route renders them."""
        if "messages" in body:
            request = _validate(TokenizeChatRequest, body)
            call = self._conversation_call(media, decoded, embeds)
        else:
            request = _validate(TokenizeCompletionRequest, body)
            call = RenderCall()
        answer = await _in_call(call, self.tokenization.create_tokenize(request, _NO_REQUEST))
        return dict(answer.model_dump())

    async def detokenize(self, body: dict[str, Any]) -> dict[str, Any]:
        """``/detokenize`` as ``vllm serve`` answers it, every id checked first (upstream
        answers an id past the vocabulary with a 500)."""
        request = _validate(DetokenizeRequest, body)
        self._check_ids_in("tokens", request.tokens)
        answer = await _call(self.tokenization.create_detokenize(request, _NO_REQUEST))
        return dict(answer.model_dump())

    async def derender_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A generate answer (whole, or one streamed chunk with its ``stream_state``) as a
        chat completion, through upstream's ``ServingDerender``: upstream's answer as JSON."""
        if body.get("stream") is True:
            chunk = _validate(DerenderChatStreamRequest, body)
            self._check_ids(chunk)
            part, state = await _derender_call(self.derender.derender_chat_stream_response(chunk))
            return DerenderChatStreamResponse(chunk=part, stream_state=state).model_dump()
        whole = _validate(DerenderChatRequest, body)
        self._check_ids(whole)
        answer: Any = await _derender_call(self.derender.derender_chat_response(whole))
        return dict(answer.model_dump())

    async def derender_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """The completions counterpart of ``derender_chat``."""
        if body.get("stream") is True:
            chunk = _validate(DerenderCompletionStreamRequest, body)
            self._check_ids(chunk)
            part, state = await _derender_call(
                self.derender.derender_completion_stream_response(chunk)
            )
            return DerenderCompletionStreamResponse(chunk=part, stream_state=state).model_dump()
        whole = _validate(DerenderCompletionRequest, body)
        self._check_ids(whole)
        answer: Any = await _derender_call(self.derender.derender_completion_response(whole))
        return dict(answer.model_dump())

    def _check_ids(self, request: Any) -> None:
        """Every token id the caller hands to the tokenizer is in its vocabulary: upstream
        decodes them unchecked (an id past the end is an IndexError there, a 500)."""
        for where, ids in _derender_token_ids(request):
            self._check_ids_in(where, ids)

    def _check_ids_in(self, where: str, ids: Sequence[int]) -> None:
        for t in ids:
            if not 0 <= t < self.vocab_size:
                raise TokenOutOfVocabulary(
                    f"{where}: token id {t} is outside the vocabulary (size {self.vocab_size})"[
                        :300
                    ]
                )

    def _metadata_fields(self, modality: str) -> Collection[str]:
        return self.serving._placeholder_metadata_fields(modality)

    def _to_wire(
        self, req: UpstreamGenerateRequest, captured: Any, encode: ItemEncoder
    ) -> GenerateRequest[bytes | None]:
        engine_input, mm_payload = captured
        features = features_from_engine_input(
            engine_input,
            encode=encode,
            metadata_fields_for=self._metadata_fields,
            with_tensors=mm_payload == "tensors",
        )
        if features is not None:
            # The name the engine will key the item by (see tandem_wire.content_ids).
            features = named_by_content(features, req.cache_salt or "")
        return generate_request_to_wire(req, features)


_NO_REQUEST: Any = None
"""The HTTP request vLLM's tokenization handlers take: they read only its ``X-Request-Id``
(for their log lines), and take None for a random id."""


async def _derender_call(awaitable: Any) -> Any:
    """``_call`` for a derender: everything it reads is the caller's (token ids, logprobs,
    stream state), so what vLLM's detokenizer and parsers raise on it is the input's fault:
    a 400, as upstream answers a failed stream replay, rather than upstream's 500s."""
    try:
        return await _call(awaitable)
    except (ValueError, TypeError, KeyError, IndexError, AssertionError, OverflowError) as exc:
        log.info("derender failed on its input: %s: %s", type(exc).__name__, _first_arg(exc))
        raise BadRequest(f"derender failed on this input ({type(exc).__name__})") from None


def _derender_token_ids(request: Any) -> list[tuple[str, Sequence[int]]]:
    """(where, ids) of every token id list in a derender request."""
    found: list[tuple[str, Sequence[int]]] = []
    responses = getattr(request, "generate_responses", None)
    if responses is None:
        one = getattr(request, "generate_response", None) or request.generate_chunk
        responses = [one]
    for r, response in enumerate(responses):
        found.append((f"generate_responses[{r}].prompt_token_ids", response.prompt_token_ids or []))
        for choice in response.choices:
            where = f"choices[{choice.index}]"
            found.append((f"{where}.token_ids", choice.token_ids or []))
            content = choice.logprobs.content if choice.logprobs is not None else None
            for entry in content or []:
                found.append((f"{where}.logprobs", [entry.token_id]))
                found.append((f"{where}.top_logprobs", [e.token_id for e in entry.top_logprobs]))
    prompt = request.prompt_token_ids
    for ids in prompt if prompt and not isinstance(prompt[0], int) else [prompt]:
        found.append(("prompt_token_ids", ids or []))
    state = getattr(request, "stream_state", None)
    if state is not None:
        found.append(("stream_state.output_token_ids", state.output_token_ids))
        found.append(("stream_state.logprob_context_token_ids", state.logprob_context_token_ids))
    return found


def _first_arg(exc: BaseException) -> str:
    # The message alone: vLLM appends the offending value to str(exc).
    return str(exc.args[0] if exc.args else type(exc).__name__)[:300]


def _param_of(exc: VLLMClientError) -> str | None:
    """The field vLLM's refusal names (``VLLMValidationError.parameter``), as its server does."""
    param = getattr(exc, "parameter", None)
    return param if isinstance(param, str) else None


def _client_error(message: str, param: str | None = None) -> TandemHTTPError:
    """vLLM's refusal of an input, typed as ``vllm serve`` types it (a prompt too long for
    the context keeps its own type: clients act on it)."""
    if _CONTEXT_LENGTH.search(message):
        return PromptTooLong(message)
    return VllmBadRequest(message, param=param)


def _processor_facts(mm_processor: Any, model_config: Any) -> ProcessorFacts:
    """The resize bounds of the model's HF image and video processors, where they state them,
    and how it takes precomputed image embeddings."""
    if mm_processor is None:
        return ProcessorFacts()
    hf = mm_processor.info.get_hf_processor()
    image = getattr(hf, "image_processor", None)
    video = getattr(hf, "video_processor", None)
    size = getattr(image, "size", None)
    max_pixels = getattr(image, "max_pixels", None) or getattr(size, "longest_edge", None)
    patch, merge = getattr(image, "patch_size", None), getattr(image, "merge_size", None)
    per_token = (patch * merge) ** 2 if isinstance(patch, int) and isinstance(merge, int) else None
    # Only Qwen-style "longest_edge" is a pixel count; other processors use it for a side.
    is_pixel_count = isinstance(max_pixels, int) and per_token is not None
    frames = getattr(video, "max_frames", None)
    return ProcessorFacts(
        max_pixels=max_pixels if is_pixel_count else None,
        pixels_per_token=per_token,
        max_frames=frames if isinstance(frames, int) else None,
        embeds=_embeds_specs(mm_processor, model_config, merge),
        item_limits=_item_limits(mm_processor.info),
    )


def _item_limits(info: Any) -> dict[str, ItemLimit]:
    """Each modality's item limit as vLLM's processor derives it (``validate_num_items``)."""
    return {
        modality: ItemLimit(info.allowed_mm_limits.get(modality, 0), supported)
        for modality, supported in info.supported_mm_limits.items()
    }


def _embeds_specs(mm_processor: Any, model_config: Any, merge: Any) -> dict[str, EmbedsSpec]:
    """How the model takes image embeddings, from its vLLM data parser's declared embedding
    fields: one values tensor and one ``*_grid_thw`` (the Qwen-VL family). Other layouts are
    not taken here (no entry: their parts are refused)."""
    fields = mm_processor.info.data_parser.embedding_fields.get("image", {})
    values = [k for k, role in fields.items() if role == "values"]
    grids = [k for k, role in fields.items() if role == "metadata" and k.endswith("grid_thw")]
    if len(values) != 1 or len(grids) != 1 or len(fields) != 2 or not isinstance(merge, int):
        return {}
    spec = EmbedsSpec(
        values_key=values[0],
        grid_key=grids[0],
        hidden_size=int(model_config.get_inputs_embeds_size()),
        merge_size=merge,
        max_rows=int(model_config.max_model_len),
    )
    return {"image": spec}


def _image_token_rule(mm_processor: Any) -> tuple[Any, Any] | None:
    """vLLM's processing info and image processor where its image token count follows from
    the image's size alone (the Qwen-VL family's smart_resize); None for other models."""
    info = getattr(mm_processor, "info", None)
    if not isinstance(info, Qwen2VLProcessingInfo):
        return None
    return info, info.get_image_processor()


def _audio_sample_rate(mm_processor: Any) -> int | None:
    """The rate the model's audio feature extractor takes (Whisper-style processors)."""
    if mm_processor is None:
        return None
    extractor = getattr(mm_processor.info.get_hf_processor(), "feature_extractor", None)
    rate = getattr(extractor, "sampling_rate", None)
    return rate if isinstance(rate, int) and rate > 0 else None


def _run_inline(renderer: Any) -> None:
    """Run the renderer's tokenizer, chat template and multimodal steps on the calling thread.

    vLLM hands each step to a thread pool; ``make_async`` bound those executors when the
    renderer was built, so the pool behind the swappable one is replaced and the multimodal
    wrappers are bound again.
    """
    inline = InlineExecutor()
    renderer._executor._inner.shutdown(wait=False)
    renderer._executor._inner = inline
    renderer._mm_executor.shutdown(wait=False)
    renderer._mm_executor = inline
    renderer._process_multimodal_async = make_async(renderer._process_multimodal, executor=inline)
    renderer._clear_mm_cache_async = make_async(renderer.clear_mm_cache, executor=inline)


def _validate(model: Any, body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except VLLMClientError as exc:  # vLLM's own validators raise it from inside pydantic
        raise _client_error(_first_arg(exc), _param_of(exc)) from None
    except ValidationError as exc:
        raise _invalid(exc) from None
    except VALIDATOR_SLIPS as exc:
        raise BadRequest(f"the body is not valid: {exc}"[:300]) from None


def _invalid(exc: ValidationError) -> BadRequest:
    return BadRequest(first_error(exc))


async def _in_call(call: RenderCall, upstream: Awaitable[Any]) -> Any:
    """Run an upstream render call with ``call`` as its hand-off: the one place a RenderCall
    is bound (see ``render_call`` for why it cannot be passed down as an argument)."""
    with bound(call):
        return await _call(upstream)


async def _call(awaitable: Any) -> Any:
    """Run an upstream render call, turning its error values and input errors into ours."""
    try:
        result = await awaitable
    except TandemHTTPError:
        raise
    except VLLMClientError as exc:
        raise _client_error(_first_arg(exc), _param_of(exc)) from None
    except ValidationError as exc:
        # Message content parts are validated lazily, as vLLM walks them: still the input.
        raise _invalid(exc) from None
    except ChatTemplateResolutionError as exc:
        # A chat for a model without a chat template (Whisper's, say): vllm serve's 400.
        raise _client_error(_first_arg(exc)) from None
    except (ValueError, TypeError, AssertionError, RuntimeError, NotImplementedError) as exc:
        # vLLM raises these for bad input and for its own bugs alike: only the input errors
        # named in _INPUT_ERRORS are the caller's (a 400); the rest are a 500 whose body says
        # nothing of the internals (the traceback goes to the log under the request id).
        message = _first_arg(exc)
        if not any(p.search(message) for p in _INPUT_ERRORS):
            raise
        if isinstance(exc, (AssertionError, RuntimeError)):
            message = f"the prompt does not match its media: {message}"
        raise _client_error(message) from None
    if isinstance(result, ErrorResponse):
        err = result.error
        if err.code == 404:
            raise ModelNotFound(err.message[:300], param=err.param)
        raise _client_error(err.message[:300], err.param)
    return result


BODY_MODELS: dict[str, Any] = {
    "chat": ChatCompletionRequest,
    "completion": CompletionRequest,
    "responses": ResponsesRequest,
    "messages": AnthropicMessagesRequest,
    "chat_derender": DerenderChatRequest | DerenderChatStreamRequest,
    "completion_derender": DerenderCompletionRequest | DerenderCompletionStreamRequest,
    "tokenize": TokenizeCompletionRequest | TokenizeChatRequest,
    "detokenize": DetokenizeRequest,
}
"""The body each render route takes, by route kind: vLLM's own request models."""


def body_schemas(paths: Mapping[str, str]) -> BodySchemas:
    """The JSON Schemas of the bodies render takes (``paths``: route kind -> path), made in
    one go so that pydantic names apart the definitions of one name that differ (vLLM's
    ``Logprob`` of the derender bodies and of the others)."""
    template = REF_TEMPLATE.replace("{name}", "{model}")  # pydantic's placeholder
    inputs = [(path, "validation", TypeAdapter(BODY_MODELS[kind])) for kind, path in paths.items()]
    by_key, top = TypeAdapter.json_schemas(inputs, ref_template=template)  # type: ignore[arg-type]
    bodies = {path: dict(by_key[(path, "validation")]) for path in paths.values()}
    return BodySchemas(bodies, dict(top.get("$defs", {})))

"""vLLM's own render stack (chat template, tokenizer, HF processor, hashing) without an engine.

The one module of the render service that drives vLLM: requests go through upstream's
``ServingRender`` so token ids, hashes, placeholders and sampling parameters are exactly what
``vllm launch render`` computes; only the feature serialization is ours.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

import numpy as np
from pydantic import ValidationError
from vllm.config import VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.models.protocol import BaseModelPath
from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
from vllm.entrypoints.scale_out.render.serving import ServingRender
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    MultiModalFeatures as UpstreamFeatures,
)
from vllm.entrypoints.serve.engine.protocol import ErrorResponse
from vllm.exceptions import VLLMClientError
from vllm.multimodal.media import ImageMediaIO, VideoMediaIO
from vllm.renderers import renderer_from_config
from vllm.renderers.chat_utils import load_chat_template
from vllm.renderers.online_renderer import OnlineRenderer
from vllm.utils.async_utils import make_async

from tandem_http import BadRequest, ModelNotFound, PromptTooLong
from tandem_http.openapi import REF_TEMPLATE, BodySchemas
from tandem_vllm.features import encode_vllm_item, features_from_engine_input
from tandem_vllm.requests import UpstreamGenerateRequest, generate_request_to_wire
from tandem_vllm.upstream_names import check_upstream_names
from tandem_vllm.wire_transforms import wire_transforms_for
from tandem_wire import GenerateRequest, TandemHTTPError

from .embeds import EmbedsSpec
from .inline import InlineExecutor
from .media import AudioDecoding
from .media_connector import (
    DecodedCache,
    VideoLimits,
    check_video_bytes,
    decode_media,
    decoded_size,
    register_connector,
)
from .prepare import ProcessorFacts
from .render_call import PromptMedia, RenderCall, bound, current
from .settings import RenderSettings

__all__ = ["EngineRenderer", "ItemEncoder"]

ItemEncoder = Callable[[str, Any], bytes]
"""(mm_hash, vLLM kwargs item) -> encoded item bytes; lets the caller cache by hash."""

_CONTEXT_LENGTH = re.compile(r"context length", re.IGNORECASE)
_INPUT_ERRORS = [
    _CONTEXT_LENGTH,
    # The prompt's placeholders do not match its media (e.g. fewer image tokens than images
    # in a token-id prompt): vLLM's processor asserts or raises RuntimeError.
    re.compile(r"^Failed to apply prompt replacement"),
    re.compile(r"^Expected there to be \d+ prompt (updates|placeholders)"),
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
    """Adds images per completion prompt (token ids or text), which upstream lacks."""

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
        engine_args = AsyncEngineArgs(
            model=settings.model,
            tokenizer=settings.tokenizer,
            revision=settings.revision,
            trust_remote_code=settings.trust_remote_code,
            max_model_len=settings.max_model_len,  # type: ignore[arg-type]  # None: the model's
            served_model_name=names,
            limit_mm_per_prompt={
                "image": settings.max_images_per_prompt,
                "video": settings.max_videos_per_prompt,
                "audio": settings.max_audios_per_prompt,
            },
            mm_processor_cache_gb=settings.mm_processor_cache_gb,
            # vLLM's own gate for embedding inputs stays open: ours is in prepare.py
            # (--enable-mm-embeds), which alone lets an embedding part reach vLLM, checked.
            enable_mm_embeds=True,
            enforce_eager=True,
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
        self.online = _MediaOnlineRenderer(
            model_config=model_config,
            renderer=renderer,
            request_logger=None,
            chat_template=load_chat_template(settings.chat_template),
            chat_template_content_format="auto",
            trust_request_chat_template=False,
            # Per-request processor kwargs are screened against an allowlist before this point.
            trust_request_mm_kwargs=True,
        )
        self.online.warmup()
        registry = OpenAIModelRegistry(
            model_config=model_config,
            base_model_paths=[BaseModelPath(name=n, model_path=settings.model) for n in names],
        )
        self.serving = _CapturingServingRender(registry, self.online)
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

    def load_image(self, data: bytes, decoded: DecodedCache | None = None) -> Any:
        """Decode with vLLM's own image IO, as the chat path does, so hashes agree."""
        return decode_media(ImageMediaIO(), data, decoded)

    def check_video_bytes(self, data: bytes) -> None:
        """Refuse, from the container's header, a video that would cost too much to decode."""
        sampled = self._video_frames if self._video_frames > 0 else 2**31
        check_video_bytes(data, self.video_limits, sampled)

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
        call = RenderCall(
            media=media, embeds=embeds or {}, decoded=decoded, audio=self.audio_decoding
        )
        result = await _in_call(call, self.serving.render_chat_request(request))
        return self._to_wire(result, call.captured[0], encode)

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
        return generate_request_to_wire(req, features)


def _first_arg(exc: BaseException) -> str:
    # The message alone: vLLM appends the offending value to str(exc).
    return str(exc.args[0] if exc.args else type(exc).__name__)[:300]


def _client_error(message: str) -> TandemHTTPError:
    if _CONTEXT_LENGTH.search(message):
        return PromptTooLong(message)
    return BadRequest(message)


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
    )


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
        raise _client_error(_first_arg(exc)) from None
    except ValidationError as exc:
        raise _invalid(exc) from None


def _invalid(exc: ValidationError) -> BadRequest:
    errors = exc.errors()
    if not errors:
        return BadRequest("invalid request")
    where = ".".join(str(p) for p in errors[0]["loc"])
    return BadRequest(f"{where}: {errors[0]['msg']}"[:300])


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
        raise _client_error(_first_arg(exc)) from None
    except ValidationError as exc:
        # Message content parts are validated lazily, as vLLM walks them: still the input.
        raise _invalid(exc) from None
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
        if _CONTEXT_LENGTH.search(err.message):
            raise PromptTooLong(err.message[:300])
        raise BadRequest(err.message[:300], param=err.param)
    return result


def body_schemas(chat_path: str, completion_path: str) -> BodySchemas:
    """The JSON Schemas of the bodies render takes: vLLM's own chat and completion requests."""
    template = REF_TEMPLATE.replace("{name}", "{model}")  # pydantic's placeholder
    return BodySchemas.of_json_schemas(
        {
            chat_path: ChatCompletionRequest.model_json_schema(ref_template=template),
            completion_path: CompletionRequest.model_json_schema(ref_template=template),
        }
    )

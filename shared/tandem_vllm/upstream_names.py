"""Every vLLM internal the services lean on, checked at start-up and in CI.

Private names (``_x``) carry no compatibility promise, and neither do the signatures of the
methods we override: a vLLM upgrade that renames or reshapes one would otherwise fail in the
middle of a request (or, for an override, silently stop being called). ``check_upstream_names``
resolves each entry of ``UPSTREAM_NAMES`` against the installed vLLM and raises
``UpstreamChanged`` naming every difference; each service calls it before building anything
(``EngineRenderer.__init__``, ``Engine.__init__``), and ``tests/unit/vllm_adapters`` runs it.

When vLLM changes one of these, update the code that uses it and this table together.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["UPSTREAM_NAMES", "UpstreamChanged", "UpstreamName", "check_upstream_names"]

Side = Literal["render", "generate", "front"]


@dataclass(frozen=True)
class UpstreamName:
    """One vLLM name we rely on, and what we rely on it being."""

    where: str
    """``module:Qualified.name``; a last part assigned in ``__init__`` is an instance attribute."""

    params: tuple[str, ...] | None
    """The parameter list as ``signature_of`` spells it (``*`` opens keyword-only parameters);
    None for an attribute, whose presence alone is checked."""

    side: Side
    """The service whose start-up checks it."""

    why: str
    """Where we use it, so whoever updates vLLM knows what to look at."""


_SERVING_RENDER = "vllm.entrypoints.scale_out.render.serving:ServingRender"
_GPU_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
_ONLINE_RENDERER = "vllm.renderers.online_renderer:OnlineRenderer"
_BASE_RENDERER = "vllm.renderers.base:BaseRenderer"
_CONNECTOR = "vllm.multimodal.media:MediaConnector"
_SERVING_CHAT = "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat"
_SERVING_COMPLETION = "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion"
_RESPONSES = "vllm.entrypoints.openai.responses.serving:OpenAIServingResponses"
_MESSAGES = "vllm.entrypoints.anthropic.serving:AnthropicServingMessages"

UPSTREAM_NAMES: tuple[UpstreamName, ...] = (
    # Render: the capture of engine inputs (vllm_renderer._CapturingServingRender).
    UpstreamName(
        f"{_SERVING_RENDER}._extract_mm_features",
        ("self", "engine_input", "*", "mm_payload"),
        "render",
        "overridden to keep the engine input instead of upstream's base64 features",
    ),
    UpstreamName(
        f"{_SERVING_RENDER}._placeholder_metadata_fields",
        ("self", "modality"),
        "render",
        "called for the fields each item's mm_metadata keeps",
    ),
    # Render: images per completion prompt (vllm_renderer._MediaOnlineRenderer).
    UpstreamName(
        f"{_ONLINE_RENDERER}.render_completion",
        ("self", "request", "*", "skip_mm_cache"),
        "render",
        "overridden to attach each prompt's images",
    ),
    UpstreamName(
        f"{_ONLINE_RENDERER}.preprocess_cmpl",
        ("self", "request", "prompts", "*", "skip_mm_cache"),
        "render",
        "called by that override with prompts carrying multi_modal_data",
    ),
    # Render: running the renderer's steps on the calling thread (vllm_renderer._run_inline).
    UpstreamName(f"{_BASE_RENDERER}._executor", None, "render", "its pool is swapped inline"),
    UpstreamName(
        "vllm.renderers.base:_SwappableExecutor._inner",
        None,
        "render",
        "the pool behind renderer._executor, replaced by the inline executor",
    ),
    UpstreamName(f"{_BASE_RENDERER}._mm_executor", None, "render", "replaced inline"),
    UpstreamName(f"{_BASE_RENDERER}._process_multimodal_async", None, "render", "rebound inline"),
    UpstreamName(
        f"{_BASE_RENDERER}._process_multimodal",
        (
            "self",
            "prompt",
            "mm_data",
            "mm_uuids",
            "mm_processor_kwargs",
            "media_io_kwargs",
            "*",
            "skip_mm_cache",
        ),
        "render",
        "wrapped again with make_async on the inline executor",
    ),
    UpstreamName(f"{_BASE_RENDERER}._clear_mm_cache_async", None, "render", "rebound inline"),
    UpstreamName(f"{_BASE_RENDERER}.clear_mm_cache", ("self",), "render", "wrapped again inline"),
    # Render: the media connector (media_connector.PrefetchedMediaConnector).
    UpstreamName(
        f"{_CONNECTOR}.load_from_url",
        ("self", "url", "media_io", "*", "fetch_timeout"),
        "render",
        "overridden to serve only prefetched bytes",
    ),
    UpstreamName(
        f"{_CONNECTOR}.load_from_url_async",
        ("self", "url", "media_io", "*", "fetch_timeout"),
        "render",
        "overridden to serve only prefetched bytes",
    ),
    # Render: embedding fetches serve only the request's checked tensors (never torch.load).
    *(
        UpstreamName(
            f"{_CONNECTOR}.fetch_{modality}_embedding{suffix}",
            ("self", "data"),
            "render",
            "overridden to serve only tensors from checked embedding parts (render/embeds.py)",
        )
        for modality in ("image", "audio", "video")
        for suffix in ("", "_async")
    ),
    # Render and generate: which tensors make a model's precomputed-embedding input.
    UpstreamName(
        "vllm.multimodal.parse:MultiModalDataParser.embedding_fields",
        None,
        "render",
        "vllm_renderer._embeds_specs reads the values and grid keys of image embeddings",
    ),
    UpstreamName(
        "vllm.multimodal.parse:MultiModalDataParser.embedding_fields",
        None,
        "generate",
        "engine._probe_embeds reads the values and grid keys of image embeddings",
    ),
    UpstreamName(
        "vllm.multimodal.processing.context:BaseProcessingInfo.parse_mm_data",
        ("self", "mm_data", "*", "validate"),
        "generate",
        "engine.process_one probes embedding items with validate=False (the service gates them)",
    ),
    # Generate: called by keyword from tandem_vllm.
    UpstreamName(
        "vllm.inputs:mm_input",
        (
            "prompt_token_ids",
            "mm_kwargs",
            "mm_hashes",
            "mm_placeholders",
            "*",
            "prompt",
            "cache_salt",
        ),
        "generate",
        "tandem_vllm.prompts.engine_prompt builds the engine prompt with it",
    ),
    UpstreamName(
        "vllm.entrypoints.serve.utils.api_utils:get_max_tokens",
        (
            "max_model_len",
            "max_tokens",
            "input_length",
            "default_sampling_params",
            "override_max_tokens",
            "truncate_prompt_tokens",
        ),
        "generate",
        "tandem_vllm.sampling.default_max_tokens: what an absent max_tokens means upstream",
    ),
    UpstreamName(
        "vllm.sampling_params:SamplingParams._validate_structured_outputs",
        ("self", "model_config", "structured_outputs_config", "tokenizer"),
        "generate",
        "tandem_vllm.sampling.check_structured_outputs: vLLM's check, run before the answer starts",
    ),
    UpstreamName(
        "vllm.sampling_params:StructuredOutputsParams._backend",
        None,
        "generate",
        "tandem_vllm.sampling.check_structured_outputs reads the backend vLLM's check chose",
    ),
    UpstreamName(
        "vllm.model_executor.models.qwen2_audio:_get_feat_extract_output_lengths",
        ("input_lengths",),
        "generate",
        "tandem_vllm.item_rules.WhisperFeatures: embedding tokens of a Qwen2-Audio item",
    ),
    # Generate: the engine core's scheduler sends new requests' items whole (vllm_scheduler).
    UpstreamName(
        "vllm.v1.core.sched.scheduler:Scheduler.schedule",
        ("self", "throttle_prefills"),
        "generate",
        "overridden by tandem_generate.vllm_scheduler to undo strip_covered_mm_data",
    ),
    UpstreamName(
        "vllm.v1.core.sched.scheduler:Scheduler.requests",
        None,
        "generate",
        "tandem_generate.vllm_scheduler reads each new request's full mm_features there",
    ),
    UpstreamName(
        "vllm.v1.core.sched.output:strip_covered_mm_data",
        ("mm_features", "num_computed_tokens", "uses_mrope"),
        "generate",
        "what tandem_generate.vllm_scheduler undoes; gone upstream, the override may be too",
    ),
    # Generate: seeded sampling on a CPU engine that splits prefills (vllm_worker).
    UpstreamName(
        f"{_GPU_RUNNER}._sample",
        ("self", "logits", "spec_decode_metadata"),
        "generate",
        "overridden by tandem_generate.vllm_worker to undo a discarded draw of a CPU generator",
    ),
    UpstreamName(
        f"{_GPU_RUNNER}._bookkeeping_sync",
        (
            "self",
            "scheduler_output",
            "sampler_output",
            "logits",
            "hidden_states",
            "num_scheduled_tokens",
        ),
        "generate",
        "overridden by tandem_generate.vllm_worker to keep its offset rewind off CPU generators",
    ),
    UpstreamName(
        f"{_GPU_RUNNER}.discard_request_mask",
        None,
        "generate",
        "tandem_generate.vllm_worker reads which rows' sampled tokens are thrown away",
    ),
    UpstreamName(
        "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
        ("self",),
        "generate",
        "overridden by tandem_generate.vllm_worker to run its model runner",
    ),
    # Front door: the Messages API through vLLM's Messages serving (vllm_answers._DoorMessages).
    UpstreamName(
        f"{_MESSAGES}._should_merge_inline_system",
        ("online_renderer",),
        "front",
        "overridden: the templates are resolved from the tokenizer (no renderer in the door)",
    ),
    UpstreamName(
        f"{_MESSAGES}._detect_merge_inline_system",
        ("chat_template",),
        "front",
        "called by the override above",
    ),
    UpstreamName(
        f"{_MESSAGES}._render_probe_prompt",
        ("self", "effort"),
        "front",
        "overridden: the thinking-disabled probes are rendered on a render node",
    ),
    UpstreamName(
        f"{_MESSAGES}._get_disabled_thinking_effort",
        ("self",),
        "front",
        "called for thinking.type=disabled, as create_messages calls it",
    ),
    UpstreamName(
        f"{_MESSAGES}._merge_inline_system",
        None,
        "front",
        "passed to to_chat_completion_request, as create_messages passes it",
    ),
    # Front door: the Responses API through vLLM's Responses serving (vllm_answers).
    UpstreamName(
        "vllm.renderers.online_renderer:OnlineRenderer.preprocess_chat",
        (
            "self",
            "request",
            "messages",
            "default_template",
            "default_template_content_format",
            "default_template_kwargs",
            "tool_dicts",
            "parser",
            "*",
            "skip_mm_cache",
        ),
        "front",
        "overridden by _DoorResponsesRenderer: render_responses' chat goes to a render node",
    ),
    UpstreamName(
        "vllm.renderers.online_renderer:OnlineRenderer.render_responses",
        (
            "self",
            "request",
            "*",
            "previous_messages",
            "previous_response_outputs",
            "tool_server",
            "skip_mm_cache",
        ),
        "front",
        "builds the messages and tools the override above gets (non-Harmony models)",
    ),
    UpstreamName(
        f"{_RESPONSES}.create_responses",
        ("self", "request", "raw_request"),
        "front",
        "the door's /v1/responses; its engine client is _ResponsesEngine",
    ),
    UpstreamName(
        f"{_RESPONSES}.retrieve_responses",
        ("self", "response_id", "starting_after", "stream"),
        "front",
        "the door's GET /v1/responses/{id}",
    ),
    UpstreamName(
        f"{_RESPONSES}.cancel_responses",
        ("self", "response_id"),
        "front",
        "the door's POST /v1/responses/{id}/cancel",
    ),
    UpstreamName(
        f"{_RESPONSES}.responses_full_generator",
        (
            "self",
            "request",
            "sampling_params",
            "result_generator",
            "context",
            "model_name",
            "tokenizer",
            "request_metadata",
            "created_time",
        ),
        "front",
        "overridden by _DoorResponses: a stored whole answer is charged to the store",
    ),
    UpstreamName(
        f"{_RESPONSES}._run_background_request",
        ("self", "request", "*args", "**kwargs"),
        "front",
        "overridden by _DoorResponses: a background run that fails ends failed, not queued",
    ),
    UpstreamName(
        f"{_RESPONSES}._run_background_request_stream",
        ("self", "request", "*args", "**kwargs"),
        "front",
        "overridden by _DoorResponses: a background stream's events, charged to the store",
    ),
    UpstreamName(
        f"{_RESPONSES}.responses_background_stream_generator",
        ("self", "response_id", "starting_after"),
        "front",
        "overridden by _DoorResponses: a failed run's stream ends with its error event",
    ),
    UpstreamName(
        f"{_RESPONSES}._make_not_found_error",
        ("self", "response_id"),
        "front",
        "the door's 404 for another key's (or an evicted) stored response, as vLLM words it",
    ),
    UpstreamName(
        f"{_RESPONSES}.enable_store",
        None,
        "front",
        "the door warns when the store is on with more than one worker",
    ),
    UpstreamName(
        f"{_RESPONSES}.use_harmony",
        None,
        "front",
        "Harmony (gpt-oss) Responses are refused at the door",
    ),
    # Front door: logprob token texts exactly as vLLM's engine writes them.
    UpstreamName(
        "vllm.v1.engine.logprobs:LogprobsProcessor._verify_tokens",
        ("self", "decoded_tokens_list", "tokens", "context_token_ids"),
        "front",
        "tandem_front.vllm_answers.VllmAnswers.steps completes split UTF-8 pieces with it",
    ),
    # Front door: the OpenAI answers written by vllm serve's own serving code.
    UpstreamName(
        f"{_SERVING_CHAT}.chat_completion_full_generator",
        (
            "self",
            "request",
            "result_generator",
            "request_id",
            "model_name",
            "conversation",
            "tokenizer",
            "request_metadata",
            "parser",
            "mm_token_counts",
        ),
        "front",
        "tandem_front.vllm_answers: whole chat answers from rebuilt RequestOutputs",
    ),
    UpstreamName(
        f"{_SERVING_CHAT}.chat_completion_stream_generator",
        (
            "self",
            "request",
            "result_generator",
            "request_id",
            "model_name",
            "conversation",
            "tokenizer",
            "request_metadata",
            "chat_template_kwargs",
            "mm_token_counts",
        ),
        "front",
        "tandem_front.vllm_answers: streamed chat chunks from rebuilt RequestOutputs",
    ),
    UpstreamName(
        f"{_SERVING_CHAT}._effective_chat_template_kwargs",
        ("self", "request"),
        "front",
        "the parsers' template kwargs, as vllm serve resolves them",
    ),
    UpstreamName(
        f"{_SERVING_CHAT}._make_parser",
        ("self", "request", "tokenizer", "chat_template_kwargs"),
        "front",
        "the whole answer's parser, made as vllm serve makes it",
    ),
    UpstreamName(
        f"{_SERVING_COMPLETION}.completion_stream_generator",
        (
            "self",
            "request",
            "engine_inputs",
            "result_generator",
            "request_id",
            "created_time",
            "model_name",
            "num_prompts",
            "tokenizer",
            "request_metadata",
        ),
        "front",
        "tandem_front.vllm_answers: streamed completions from rebuilt RequestOutputs",
    ),
    UpstreamName(
        f"{_SERVING_COMPLETION}.request_output_to_completion_response",
        (
            "self",
            "final_res_batch",
            "request",
            "request_id",
            "created_time",
            "model_name",
            "tokenizer",
            "request_metadata",
        ),
        "front",
        "tandem_front.vllm_answers: whole completions from rebuilt RequestOutputs",
    ),
)


class UpstreamChanged(RuntimeError):
    """The installed vLLM lacks, or has reshaped, a name the services rely on."""


def signature_of(obj: Any) -> tuple[str, ...]:
    """Parameter names in order, ``*`` before the first keyword-only one (unless ``*args``),
    ``*args``/``**kwargs`` spelled so, ``/`` after positional-only ones."""
    out: list[str] = []
    params = list(inspect.signature(obj).parameters.values())
    for i, p in enumerate(params):
        kind = p.kind
        if kind is p.KEYWORD_ONLY and (
            i == 0 or params[i - 1].kind not in (kind, p.VAR_POSITIONAL)
        ):
            out.append("*")
        out.append(
            f"*{p.name}"
            if kind is p.VAR_POSITIONAL
            else f"**{p.name}"
            if kind is p.VAR_KEYWORD
            else p.name
        )
        if kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not kind):
            out.append("/")
    return tuple(out)


def _assigned_in_init(owner: type, attr: str) -> bool:
    # An instance attribute: look for ``self.<attr> =`` in an __init__ along the MRO.
    pattern = re.compile(rf"\bself\.{re.escape(attr)}\s*(:[^=\n]*)?=(?!=)")
    for klass in owner.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            source = inspect.getsource(init)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def _problem(name: UpstreamName) -> str | None:
    """What is wrong with ``name`` in the installed vLLM; None if nothing."""
    module_name, _, qualname = name.where.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        return f"module {module_name} cannot be imported ({exc})"
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        last = i == len(parts) - 1
        if last and name.params is None and isinstance(obj, type) and _assigned_in_init(obj, part):
            return None
        return "missing"
    if name.params is None:
        return None
    try:
        actual = signature_of(obj)
    except (TypeError, ValueError):
        return "no longer has a signature"
    if actual != name.params:
        return f"signature is ({', '.join(actual)}), expected ({', '.join(name.params)})"
    return None


def check_upstream_names(
    sides: Iterable[Side] = ("render", "generate", "front"),
    names: Iterable[UpstreamName] = UPSTREAM_NAMES,
) -> None:
    """Raise ``UpstreamChanged`` listing every entry of ``names`` (for ``sides``) that the
    installed vLLM no longer has as expected."""
    wanted = set(sides)
    problems = []
    for name in names:
        if name.side not in wanted:
            continue
        problem = _problem(name)
        if problem is not None:
            problems.append(f"  {name.where}: {problem} (used: {name.why})")
    if problems:
        import vllm

        raise UpstreamChanged(
            f"vLLM {getattr(vllm, '__version__', '?')} differs from what Tandem relies on "
            "(see tandem_vllm/upstream_names.py):\n" + "\n".join(problems)
        )

"""vLLM's async engine in this process: build it, probe the model, run requests.

The one module of the generate service that drives vLLM's engine. Requests arrive as
``MultiModalInput``s carrying already-processed items, so vLLM's input processor skips the HF
processor entirely on this path.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
from fastapi.encoders import jsonable_encoder
from vllm.config import SchedulerConfig, VllmConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.serve.utils.fingerprint import get_system_fingerprint
from vllm.exceptions import VLLMClientError
from vllm.outputs import RequestOutput
from vllm.platforms import current_platform
from vllm.sampling_params import SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.metrics.loggers import PrometheusStatLogger
from vllm.version import __version__ as VLLM_VERSION  # type: ignore[attr-defined]

from tandem_http import BadRequest
from tandem_vllm.item_rules import item_rule_for
from tandem_vllm.items import item_from_vllm, placeholder_from_vllm
from tandem_vllm.prompts import engine_prompt
from tandem_vllm.sampling import MaxTokensDefaults, check_structured_outputs
from tandem_vllm.upstream_names import check_upstream_names
from tandem_vllm.wire_transforms import wire_transforms_for
from tandem_wire import PlaceholderRange

from .errors import EngineNotReady
from .model_spec import ModalitySpec, ModelSpec, grid_cells, modality_spec
from .vllm_plugin import PLUGIN_NAME
from .vllm_scheduler import whole_items_scheduler
from .weight_files import BACKEND

__all__ = ["Engine"]

ENGINE_WATCH_S = 1.0
"""How often the engine's liveness is checked: by requests waiting for output, and by the
server, which stops with a non-zero status once the engine died (as vLLM's own server does)."""

log = logging.getLogger("tandem.generate")


class Engine:
    """One vLLM AsyncLLM plus the facts about its model that validation needs."""

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        check_upstream_names(["generate"])  # a vLLM upgrade fails here, not mid-request
        check_weight_backend_installed(engine_args)
        args, stat_loggers = prometheus_stats_only(seed_safe_engine_args(engine_args))
        config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        self.llm = AsyncLLM.from_vllm_config(
            seed_safe_config(resumable_config(config)),
            usage_context=UsageContext.OPENAI_API_SERVER,
            stat_loggers=stat_loggers,
            enable_log_requests=args.enable_log_requests,
            disable_log_stats=args.disable_log_stats,
        )
        self.vllm_config = self.llm.vllm_config
        # As vllm serve's OpenAI routes answer it (the door passes it on).
        self.system_fingerprint: str | None = get_system_fingerprint(self.vllm_config)
        self.seeded_sampling_safe = seeded_sampling_safe(self.vllm_config)
        mc = self.vllm_config.model_config
        self.model_config = mc
        self.max_model_len: int = mc.max_model_len
        self.vllm_version: str = VLLM_VERSION
        self.vocab_size: int = mc.get_vocab_size()
        # Answers in output_mode "text" decode logprob tokens with it (as upstream's generate).
        self.tokenizer: Any = self.llm.input_processor.tokenizer
        self.max_num_seqs: int = self.vllm_config.scheduler_config.max_num_seqs
        self.max_logprobs: int = mc.max_logprobs
        self.max_tokens_defaults = MaxTokensDefaults.from_model_config(mc)
        self.spec = probe_model(mc) if mc.is_multimodal_model else ModelSpec()
        # --limit-mm-per-prompt, enforced by the service as vLLM's own server does (items
        # arrive processed here, so vLLM's processor never counts them).
        mm = mc.multimodal_config
        self.mm_limits: dict[str, int] = (
            {m: mm.get_limit_per_prompt(m) for m in self.spec.modalities} if mm else {}
        )
        # vLLM's --enable-mm-embeds: items carrying precomputed embeddings are taken (checked
        # against self.spec.embeds) only when the operator asked for them, as upstream does.
        self.accepts_mm_embeds: bool = bool(mm is not None and mm.enable_mm_embeds)

    def check_structured_outputs(self, params: SamplingParams) -> None:
        """vLLM's own check of the request's structured outputs, as its input processor runs
        it when the request is added (``tandem_vllm.sampling.check_structured_outputs``)."""
        check_structured_outputs(params, self.vllm_config, self.llm.input_processor.tokenizer)

    def generate(
        self,
        token_ids: list[int],
        items: dict[str, list[Any]],
        hashes: dict[str, list[str]],
        placeholders: dict[str, list[PlaceholderRange]],
        sampling_params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        reasoning_ended: bool | None = None,
    ) -> AsyncIterator[RequestOutput]:
        prompt = engine_prompt(token_ids, items, hashes, placeholders, cache_salt=cache_salt)
        return self._outputs(
            self.llm.generate(
                prompt,
                sampling_params,
                request_id,
                priority=priority,
                reasoning_ended=reasoning_ended,
            )
        )

    async def _outputs(
        self, outputs: AsyncGenerator[RequestOutput, None]
    ) -> AsyncGenerator[RequestOutput, None]:
        """The engine's outputs; its death becomes a 503 that clients retry on another node.

        vLLM fails the requests it knows of when its core dies, but a request added while the
        core was dying can wait forever; so the wait for each output also watches the engine.
        """
        step: asyncio.Future[RequestOutput] | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(outputs))
                while not step.done():
                    await asyncio.wait({step}, timeout=ENGINE_WATCH_S)
                    if not step.done() and self.errored:
                        raise EngineDeadError()
                try:
                    out = step.result()
                except StopAsyncIteration:
                    return
                yield out
        except EngineDeadError:
            raise EngineNotReady("the engine died; this node is restarting") from None
        except VLLMClientError as exc:
            # vLLM's own verdict that the input is at fault; any other exception is a 500.
            message = str(exc.args[0] if exc.args else type(exc).__name__)[:300]
            raise BadRequest(message) from None
        finally:
            if step is not None and not step.done():
                # Cancelled mid-wait: vLLM aborts the request when its generator is cancelled.
                step.cancel()
                await asyncio.wait({step})
            if not self.errored:
                await outputs.aclose()  # a consumer that stops early aborts the engine request

    async def wait_until_dead(self) -> None:
        """Return once the engine has died (its core process exited or its output loop failed)."""
        while not self.errored:
            await asyncio.sleep(ENGINE_WATCH_S)

    async def abort(self, request_id: str) -> None:
        if self.errored:
            return  # nothing runs any more
        try:
            await self.llm.abort(request_id)
        except EngineDeadError:
            pass

    async def reset_prefix_cache(self) -> bool:
        return bool(await self.llm.reset_prefix_cache())

    def kv_event_sources(self) -> dict[str, Any]:
        """Where each engine (by data-parallel rank) publishes its KV-cache events, as
        ``vllm serve``'s ``/kv_event_sources`` answers it; empty without ``--kv-events-config``."""
        sources = self.llm.get_kv_event_sources()
        return {str(rank): jsonable_encoder(config) for rank, config in sources.items()}

    async def check_health(self) -> None:
        await self.llm.check_health()

    @property
    def errored(self) -> bool:
        return bool(self.llm.errored)

    def shutdown(self) -> None:
        self.llm.shutdown()


def check_weight_backend_installed(engine_args: AsyncEngineArgs) -> None:
    """Fail at start-up, with the fix, when the tandem_file backend is asked for but vLLM's
    engine processes cannot register it: they are spawned (always, on CPU) and find it only
    through the package's ``vllm.general_plugins`` entry point."""
    wt = engine_args.weight_transfer_config
    backend = wt.get("backend") if isinstance(wt, dict) else getattr(wt, "backend", None)
    if backend != BACKEND:
        return
    from importlib.metadata import entry_points

    if not any(ep.name == PLUGIN_NAME for ep in entry_points(group="vllm.general_plugins")):
        raise RuntimeError(
            f"the {BACKEND} weight-transfer backend needs Tandem installed with its vLLM plugin "
            "entry point: run `make setup` (or `pip install -e .`) and start again"
        )


def prometheus_stats_only(
    engine_args: AsyncEngineArgs,
) -> tuple[AsyncEngineArgs, list[Any] | None]:
    """The engine's stats with vLLM's Prometheus logger alone (the ``vllm:*`` metrics /metrics
    shows), unless the operator turned stats off (``--disable-log-stats``).

    vLLM's other default logger tallies every engine step for a log line that only its own
    server prints, on a timer this server does not run.
    """
    if engine_args.disable_log_stats:
        return engine_args, None
    args = copy.copy(engine_args)
    args.disable_log_stats = True  # no default loggers; the one given keeps stats on
    return args, [PrometheusStatLogger]


def resumable_config(config: VllmConfig) -> VllmConfig:
    """The engine core's scheduler sends every new request's items whole
    (``tandem_generate.vllm_scheduler``): with vLLM's own, a multimodal request preempted
    after a prefix-cache hit kills the engine when it resumes. An operator's own
    ``--scheduler-cls`` is kept, and that risk logged."""
    sched = config.scheduler_config
    if sched.scheduler_cls is None:
        sched.scheduler_cls = whole_items_scheduler(bool(sched.async_scheduling))
    elif config.model_config.is_multimodal_model:
        log.warning(
            "--scheduler-cls %s: a multimodal request preempted after a prefix-cache hit "
            "(a weight update, or KV pressure) may stop vLLM's engine when it resumes; "
            "tandem_generate.vllm_scheduler shows the fix",
            sched.scheduler_cls,
        )
    return config


def seed_safe_engine_args(engine_args: AsyncEngineArgs) -> AsyncEngineArgs:
    """On vLLM's CPU build, prefills are not split across steps unless the operator asks or
    the model needs it.

    When a prefill is split, vLLM rewinds the random generator of a seeded request by its
    Philox offset, which a CPU ``torch.Generator`` does not have: the engine core dies
    ("CPU Generator does not use offset") and takes every later request with it. Whole
    prefills never take that path, and cost nothing on a CPU, where chunking buys no overlap.
    A model that needs split prefills (``prefills_must_chunk``) keeps vLLM's default, and its
    workers rewind seeded generators in a way a CPU's can be (``seed_safe_config``).
    """
    if not current_platform.is_cpu() or engine_args.enable_chunked_prefill is not None:
        return engine_args
    model_config = engine_args.create_model_config()
    if prefills_must_chunk(engine_args, model_config):
        log.info(
            "CPU build: chunked prefill stays on (%s caches its state block by block with "
            "prefix caching on); seeded generators are rewound by the worker",
            model_config.architecture,
        )
        return engine_args
    args = copy.copy(engine_args)
    max_len = args.max_model_len or model_config.max_model_len
    args.enable_chunked_prefill = False
    # Without chunking, one step must hold the longest prompt.
    args.max_num_batched_tokens = max(
        args.max_num_batched_tokens or 0, max_len, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
    )
    log.info(
        "CPU build: chunked prefill off, max_num_batched_tokens=%d (seeded sampling stays safe)",
        args.max_num_batched_tokens,
    )
    return args


def prefills_must_chunk(engine_args: AsyncEngineArgs, model_config: Any) -> bool:
    """vLLM's own rule (``MambaModelConfig.verify_and_update_config``): with prefix caching on,
    a model keeping conv or SSM state (hybrid, or Mamba's) caches that state at block
    boundaries ("align" mode), which asserts that chunked prefill is on."""
    caching = engine_args.enable_prefix_caching
    if caching is None:  # vLLM's default for the model
        caching = model_config.is_prefix_caching_supported
    stateful = model_config.is_hybrid or model_config.is_attention_free
    return bool(caching) and bool(stateful)


def seed_safe_config(config: VllmConfig) -> VllmConfig:
    """On the CPU build with chunked prefill on, vLLM's workers run with a model runner that
    rewinds a seeded request's generator as a CPU one can be (``tandem_generate.vllm_worker``).
    An operator's own ``--worker-cls`` is kept (seeds are then refused:
    ``seeded_sampling_safe``)."""
    if not current_platform.is_cpu() or not config.scheduler_config.enable_chunked_prefill:
        return config
    # Imported here: vLLM's worker modules cost the server's start-up time otherwise.
    from .vllm_worker import seed_safe_worker

    parallel = config.parallel_config
    if parallel.worker_cls == VLLM_CPU_WORKER and not config.use_v2_model_runner:
        parallel.worker_cls = seed_safe_worker()
    return config


VLLM_CPU_WORKER = "vllm.v1.worker.cpu_worker.CPUWorker"
"""The worker vLLM's CPU platform picks for ``--worker-cls auto``."""


def seeded_sampling_safe(config: VllmConfig) -> bool:
    """Whether a seeded request leaves the engine alive: anywhere but on a CPU engine that
    splits prefills with vLLM's own worker."""
    if not current_platform.is_cpu() or not config.scheduler_config.enable_chunked_prefill:
        return True
    from .vllm_worker import seed_safe_worker

    return bool(config.parallel_config.worker_cls == seed_safe_worker())


def process_one(proc: Any, modality: str, sample: Any, *, embeds: bool = False) -> Any:
    """vLLM's processor output for a one-item chat prompt (``proc``: from
    ``MULTIMODAL_REGISTRY.create_processor``); ``embeds``: ``sample`` is a dict of embedding
    tensors (parsed whatever ``enable_mm_embeds`` says: the service gates those items)."""
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    tok = proc.info.get_tokenizer()
    ids = tok.encode(probe_prompt(proc, modality), add_special_tokens=False)
    if embeds:
        data = proc.info.parse_mm_data({modality: sample}, validate=False)
    else:
        data = proc.info.parse_mm_data({modality: [sample]})
    return proc.apply(ProcessorInputs(ids, data), TimingContext(enabled=False))


def probe_prompt(proc: Any, modality: str) -> str:
    """A chat of one ``modality`` item and the text "x", rendered as vllm serve renders it for
    this model: its chat template, or vLLM's fallback for it (PaliGemma's, BLIP-2's), given
    content parts, or for a template that reads content as a string (InternVL-style) the
    model's placeholder string before the text; vLLM's dummy text where no template exists."""
    from transformers import PreTrainedTokenizerBase
    from vllm.model_executor.model_loader import get_model_cls
    from vllm.renderers.hf import resolve_chat_template, resolve_chat_template_content_format

    tok, model_config = proc.info.get_tokenizer(), proc.info.ctx.model_config
    content: Any = [{"type": modality}, {"type": "text", "text": "x"}]
    if not isinstance(tok, PreTrainedTokenizerBase):  # mistral_common renders parts itself
        chat = [{"role": "user", "content": content}]
        return str(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    hf: Any = tok  # vLLM types its HF tokenizers as its own backends, not transformers' base
    template = resolve_chat_template(hf, None, None, model_config=model_config)
    if template is None:
        return str(proc.dummy_inputs.get_dummy_text({modality: 1}))
    content_format = resolve_chat_template_content_format(
        template, None, "auto", hf, model_config=model_config
    )
    if content_format == "string":
        model_cls: Any = get_model_cls(model_config)  # a SupportsMultiModal class
        placeholder = model_cls.get_placeholder_str(modality, 1)
        content = "x" if placeholder is None else f"{placeholder}\nx"
    chat = [{"role": "user", "content": content}]
    return str(
        tok.apply_chat_template(
            chat, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    )


_VIDEO_METADATA = {
    "fps": 2.0,
    "duration": 2.0,
    "total_num_frames": 4,
    "frames_indices": [0, 1, 2, 3],
    "video_backend": "opencv",
    "do_sample_frames": False,
}
"""What vLLM's video IO reports for a 4-frame, 2 fps clip decoded whole."""


def probe_model(model_config: Any) -> ModelSpec:
    """Run vLLM's processor on synthetic media once, to learn what items look like."""
    from PIL import Image
    from vllm.multimodal import MULTIMODAL_REGISTRY

    proc = MULTIMODAL_REGISTRY.create_processor(model_config)
    samples: dict[str, Any] = {
        "image": Image.fromarray(np.full((64, 96, 3), 128, np.uint8)),
        # With the metadata vLLM's video loader returns: models that place timestamps between
        # frames (Qwen3-VL) refuse a video without it.
        "video": (np.full((4, 64, 64, 3), 128, np.uint8), _VIDEO_METADATA),
        # A second of a 440 Hz tone, as (waveform, sample rate) the way vLLM's audio IO decodes.
        "audio": (np.sin(np.arange(16_000, dtype=np.float32) * (2 * np.pi * 440 / 16_000)), 16_000),
    }
    hf_processor = proc.info.get_hf_processor()
    spec = ModelSpec(wire_transforms=wire_transforms_for(hf_processor))
    supported = proc.info.get_supported_mm_limits()
    for modality, sample in samples.items():
        if modality not in supported:
            continue
        try:
            out = process_one(proc, modality, sample)
        except Exception as exc:
            # The model takes this modality, but not our sample: its items are refused with
            # a message that says so, and the cause is in the log.
            log.warning("could not learn this model's %s items: %r", modality, exc)
            spec.unlearned[modality] = type(exc).__name__
            continue
        item, mspec = _probed_spec(out, modality)
        rule = item_rule_for(hf_processor, modality, item)
        if rule is not None:
            made, placed = rule.embed_tokens(item), probe_embed_tokens(out, modality)
            if made != placed:  # vLLM changed how it counts: every item would be misjudged
                raise RuntimeError(
                    f"the {modality} rule of {type(hf_processor).__name__} counts {made} "
                    f"embedding tokens where vLLM's processor placed {placed}"
                )
            mspec = replace(mspec, rule=rule)
        spec.modalities[modality] = mspec
        if modality in _EMBEDS_MODALITIES:
            embeds = _probe_embeds(proc, model_config, modality, item, mspec)
            if embeds is not None:
                spec.embeds[modality] = embeds
    return spec


_EMBEDS_MODALITIES = ("image",)
"""Modalities whose precomputed embeddings generate takes (render sends image_embeds only)."""


def _probed_spec(out: Any, modality: str) -> tuple[Any, ModalitySpec]:
    processed = out["mm_kwargs"][modality][0]
    if processed is None:  # a processor-cache placeholder; the probe never asks the cache
        raise RuntimeError(f"the {modality} probe returned no item")
    item = item_from_vllm(processed)
    ranges = [placeholder_from_vllm(p) for p in out["mm_placeholders"][modality]]
    return item, modality_spec(item, list(out["prompt_token_ids"]), ranges)


def probe_embed_tokens(out: Any, modality: str) -> int:
    """Embedding tokens in a probe's placeholder ranges for ``modality``."""
    ranges = [placeholder_from_vllm(p) for p in out["mm_placeholders"][modality]]
    return sum(r.length if r.is_embed is None else sum(r.is_embed) for r in ranges)


def _probe_embeds(
    proc: Any, model_config: Any, modality: str, pixel_item: Any, pixel_spec: ModalitySpec
) -> ModalitySpec | None:
    """The item vLLM's processor makes of precomputed embeddings for the probe's own grid (the
    Qwen-VL layout: one values tensor of the model's input embedding size and the item's
    ``*_grid_thw``); None when the model declares no such embedding input."""
    import torch

    fields = proc.info.data_parser.embedding_fields.get(modality, {})
    values = [k for k, role in fields.items() if role == "values"]
    grid_key = pixel_spec.grid_key
    per_token = pixel_spec.grid_cells_per_token
    if len(values) != 1 or set(fields) != {values[0], grid_key} or not per_token:
        return None
    grid = np.asarray(pixel_item[grid_key].data).reshape(1, -1)
    rows = grid_cells(grid) // per_token
    hidden = model_config.get_inputs_embeds_size()
    sample = {
        values[0]: torch.zeros(rows, hidden, dtype=model_config.dtype),
        grid_key: torch.from_numpy(grid.astype(np.int64)),
    }
    _, spec = _probed_spec(process_one(proc, modality, sample, embeds=True), modality)
    return replace(spec, embeds_key=values[0])

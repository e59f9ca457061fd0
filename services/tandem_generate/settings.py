"""Generate service settings (the API side; vLLM's engine options travel as AsyncEngineArgs)."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_http import BodyDeadline, SendDeadline

__all__ = ["ENGINE_MM_PROCESSOR_CACHE_GB", "ONEDNN_KERNEL_CACHE", "GenerateSettings"]

ENGINE_MM_PROCESSOR_CACHE_GB = 0.0
"""Generate's default for vLLM's ``--mm-processor-cache-gb`` (vLLM's own: 4 GiB), in GiB.
Items reach the engine already processed and always with their data (nulls are resolved by
the item store first), so vLLM's engine-side copy of each one is only ever written, never
read: left on, it grew the engine core's RSS by ~0.3 MiB per fresh image up to 4 GiB. A
user's own ``--mm-processor-cache-gb`` still wins."""

ONEDNN_KERNEL_CACHE = 128
"""Generate's default for oneDNN's compiled-kernel cache in the engine's worker on the CPU build
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``; oneDNN's own: 1024 kernels, with no byte bound): one
kernel per input shape, so a mix of prompt lengths and image sizes kept adding kernels (the
worker grew ~450 MiB over 150 s of varied prompts and was still rising; at 64 it stayed
within ~30 MiB over 10 minutes). A value set in the environment still wins."""


@dataclass(frozen=True)
class GenerateSettings:
    """Everything the HTTP side of the generate service is configured with."""

    served_model_names: tuple[str, ...]
    """Names clients may use in ``model`` (null ``model`` means the first)."""

    host: str = "127.0.0.1"
    port: int = 8200
    uds: str | None = None
    """A Unix-domain socket path to listen on instead of ``host`` and ``port`` (``--uds``,
    as ``vllm serve``'s); clients name the node ``unix:PATH``. None: TCP."""
    api_key: str | tuple[str, ...] | None = None
    """Inference keys: when set, every route but /health needs ``Authorization: Bearer
    <key>`` with one of them or with an admin key. Held items are kept per key."""

    admin_api_key: str | tuple[str, ...] = ()
    """Admin keys: the only keys that may call the state-changing control routes (pause,
    resume, abort, weight updates, cache reset); an inference key gets 403 ``admin_required``.
    They also pass wherever an inference key does. Empty: no admin key (see
    ``enable_control_routes``); with admin keys only, inference routes stay open."""

    door_api_key: str | tuple[str, ...] = ()
    """Keys of front doors (each also an inference or admin key): a request with one of them
    and ``x-tandem-tenant`` keeps its held items under that tenant (the door's caller), not
    under the door's key, so callers behind one door cannot probe each other's items."""

    enable_control_routes: bool = False
    """With no ``admin_api_key``, serve the state-changing control routes to every caller the
    key check lets in (any inference key, or anyone when there is no key); off, they answer
    403 (``admin_required`` to an inference key, else ``control_routes_disabled``). Changes
    nothing when admin keys are set."""

    weight_transfer_dir: str | None = None
    """The folder ``tandem_file`` weight updates are read from (paths outside it are refused);
    trainer and server must both see it (same machine or a shared filesystem)."""

    update_idle_timeout_s: float = 300.0
    """A weight update with no step (start, chunk) for this long is ended without loading it,
    as ``/abort_weight_update`` ends it: its trainer crashed mid-update, and every start would
    otherwise be refused until an operator aborts it. A start with a router's newer update id
    ends it at once. 0: never."""

    log_level: str = "info"
    max_body_bytes: int | None = None
    """Largest request body; by default what the model can take (its context filled with
    item tokens, see ``ModelSpec.max_request_bytes``)."""

    max_items_per_prompt: int = 32
    """Most multimodal items in one request."""

    max_pending: int = 256
    """Requests admitted (decoding, queued or running) before answering 429."""

    max_held_bytes: int | None = None
    """Bytes the admitted requests may hold: their bodies (by Content-Length, before any is
    read) plus the items decoded from them; past it a request is answered 429 with
    Retry-After before its body is read, and one declaring more than all of it 413. None: a
    quarter of this process's memory (its cgroup limit, else the host's RAM); 0: no byte
    budget."""

    body_timeout_s: float = BodyDeadline.timeout_s
    """A request body's grace and the longest pause within it, in seconds: past either, 408
    ``body_timeout`` and the request is let go (``tandem_http.BodyDeadline``); 0: no deadline."""

    body_min_rate: int = BodyDeadline.min_rate
    """Bytes per second a request body must keep on average once ``body_timeout_s`` is spent."""

    send_timeout_s: float = SendDeadline.timeout_s
    """An answer's grace and the longest a write of it may wait on a caller that does not
    read, in seconds: past either, the connection is cut and the request let go, as when its
    caller hangs up (``tandem_http.SendDeadline``); 0: no deadline."""

    send_min_rate: int = SendDeadline.min_rate
    """Bytes per second a caller must read its answer at on average, in the time writes wait
    on it, once ``send_timeout_s`` is spent."""

    allow_request_priority: bool = False
    """Honour the ``priority`` a request sets (with ``--scheduling-policy priority`` a caller
    could otherwise put itself ahead of everyone); off: every request runs at priority 0."""

    enable_prompt_tokens_details: bool = False
    """Every answer's usage carries the engine's prefix-cache hits
    (``prompt_tokens_details.cached_tokens``), as upstream's flag of that name does; off, only
    a request that asks (``PROMPT_TOKENS_DETAILS_HEADER``) gets them."""

    item_cache_bytes: int = 1024 * 1024 * 1024
    """Bytes of decoded items kept for null ``kwargs_data`` entries (per tenant and hash). At
    most what start-up faults in (``tandem_http.memory.MAX_PRETOUCH``), so the process's RSS
    stays flat while the store fills; 1 GiB is ~4% of a 24 GiB host and ~3,000 Qwen2-VL
    224x224 images."""

    pretouch_item_cache: bool = True
    """Keep freed memory in the process and fault in the item cache's budget at start-up, so
    filling the cache does not make requests pay for fresh pages (measured: ~2 ms of API CPU
    per request with an image on our VMs)."""

    structured_outputs: bool = True
    """Take ``sampling_params.structured_outputs`` (JSON schema, regex, choice, grammar,
    structural tag), as vLLM's generate does; off: refused with a 400."""

    max_structured_output_bytes: int = 64 * 1024
    """Largest ``structured_outputs`` accepted, in bytes of its JSON (the schema, regex,
    grammar or choices with their options): bounds what the API process parses and the
    engine compiles per request. Larger is a 400."""

    content_parts_render_url: str | None = None
    """The render node (its base URL; ``unix:/PATH`` for one on a Unix-domain socket) that
    resolves ``content_parts``: their media and the
    caller's token ids go to its ``/v1/completions/render``, and the request proceeds with the
    token ids and features it answers (``tandem_generate.content_parts``). None: requests with
    ``content_parts`` are refused (400 naming ``--content-parts-render-url``)."""

    content_parts_render_api_key: str | None = None
    """The key sent to that render node (one of its ``--api-key``); None: none sent."""

    content_parts_render_timeout_s: float = 60.0
    """How long that render node may take to answer (media fetches included), in seconds;
    past it the request is answered 503 ``upstream_unavailable``."""

    disconnect_poll_s: float = 0.25
    """How often a non-streaming request checks whether its client went away."""

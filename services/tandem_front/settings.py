"""Front door settings: one frozen object, built from the command line or the environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from tandem_client.discovery import parse_node_spec
from tandem_http import BodyDeadline, SendDeadline, settings_from_json, settings_to_json
from tandem_http.draining import KEEP_ALIVE_S

__all__ = ["FrontSettings", "LogprobsFormat", "SETTINGS_ENV"]

SETTINGS_ENV = "TANDEM_FRONT_SETTINGS"
"""Environment variable carrying the settings (JSON) from the launcher to worker processes."""

LogprobsFormat = Literal["auto", "vllm-0.32", "trl"]


@dataclass(frozen=True)
class FrontSettings:
    """Everything the front door is configured with."""

    render_urls: tuple[str, ...]
    """Base URLs of the render nodes (requests spread by pending count); ``unix:/PATH`` is a
    node on that Unix-domain socket (``tandem_client.unix_nodes``); an entry
    ``dns+http://NAME:PORT`` stands for every address NAME resolves to (see
    ``tandem_client.discovery``)."""

    generate_urls: tuple[str, ...]
    """Base URLs of the generate nodes (requests routed by first item hash); ``unix:`` and
    ``dns+http://`` entries as for ``render_urls``. A generate node found after the first is
    pending (no inference work) until it reports the fleet's weight version."""

    model: str
    """Model folder or hub name: its tokenizer detokenizes the OpenAI routes' answers."""

    served_model_name: tuple[str, ...] = ()
    """Names clients may use in ``model``; defaults to ``model``."""

    tokenizer: str | None = None
    """Tokenizer folder or name when it differs from ``model``."""

    trust_remote_code: bool = False

    chat_template: str | None = None
    """A chat template file or string overriding the model's: give the door what render has
    (vLLM's derender reads the template's keyword arguments for the parsers)."""

    tool_call_parser: str | None = None
    """vLLM's tool-call parser (e.g. ``hermes``): the OpenAI routes answer ``tool_calls``
    parsed from the generated text; None: tool calls stay text. Give the door what render has."""

    enable_auto_tool_choice: bool = False
    """Parse tool calls for ``tool_choice: auto`` (needs ``tool_call_parser``); as render's."""

    exclude_tools_when_tool_choice_none: bool = False
    """vLLM's option of the same name; as render's."""

    tool_strict_level: str = "auto"
    """vLLM's structural-tag tool calling floor (``auto``, ``function``, ``parameter``); as
    render's."""

    reasoning_parser: str | None = None
    """vLLM's reasoning parser (e.g. ``deepseek_r1``): answers carry ``reasoning_content``;
    None: no reasoning split. Give the door what render has."""

    default_chat_template_kwargs: dict[str, Any] | None = None
    """Chat template keyword arguments every request starts from (as render's); None: none."""

    cohere_format: str | None = "cmd4"
    """vLLM's Cohere prompt format added to the default chat template kwargs; as render's."""

    host: str = "127.0.0.1"
    port: int = 8000
    uds: str | None = None
    """A Unix-domain socket path to listen on instead of ``host`` and ``port`` (``--uds``,
    as ``vllm serve``'s); clients name the node ``unix:PATH``. None: TCP."""
    workers: int = 1
    """Worker processes. One, as ``vllm serve`` runs one API process: the door's own work is
    5-6 ms of CPU per 448x448 chat, so one worker carries well over a hundred requests a
    second, and a second one on a shared host only preempts render and the engine (measured
    on 2 cores at c=8: 31 req/s with one door worker, 26 with two). Raise it where the door
    has cores of its own."""

    api_key: str | None = None
    """The inference key: when set, every route but /health needs ``Authorization: Bearer
    <key>`` with it or with an admin key."""

    admin_api_key: tuple[str, ...] = ()
    """Admin keys: the only keys that may call the state-changing control routes (their
    holders' calls are fanned out; an inference key gets 403 ``admin_required`` and nothing
    reaches a node). They also pass wherever the inference key does. Empty: no admin key (see
    ``enable_control_routes``); with admin keys only, inference routes stay open."""

    upstream_api_key: str | None = None
    """The key the front door presents to the render and generate nodes (None: none)."""

    upstream_admin_api_key: str | None = None
    """The key the front door presents to the generate nodes on state-changing control routes
    (one of their ``--admin-api-key``); None: ``upstream_api_key`` there too."""

    enable_control_routes: bool = False
    """With no ``admin_api_key``, serve the state-changing control routes to every caller the
    key check lets in (the inference key's holders, or anyone when there is no key); off,
    they answer 403. Changes nothing when admin keys are set."""

    logprobs_format: LogprobsFormat = "auto"
    """Shape of ``/inference/v1/generate`` logprob entries: ``vllm-0.32``, integer
    ``token_id`` entries as they come (the body passes through untouched); ``trl``, each entry
    also gets ``token: "token_id:<id>"``, the shape TRL 1.16's ``parse_logprobs`` reads;
    ``auto``, TRL's shape for requests that signal TRL (a ``request_id`` starting ``trl-``, as
    TRL's ``VLLMClient`` sends) and untouched otherwise. A request may also pick with the
    header ``X-Tandem-Logprobs-Format: trl|vllm-0.32``."""

    log_level: str = "info"

    max_body_bytes: int = 256 * 1024 * 1024
    """Largest ``/inference/v1/generate`` body taken: the operator's cap when
    ``follow_generate_body_cap`` is off; else the cap until a generate node has told its own
    (the largest any node told, on its ``/health`` answers, wins)."""

    follow_generate_body_cap: bool = True
    """Take as generate bodies' cap the largest cap the generate nodes tell (their model's,
    see ``x-tandem-max-body-bytes``) instead of ``max_body_bytes``. Off when
    ``--max-body-bytes`` is given."""

    render_max_body_bytes: int = 64 * 1024 * 1024
    """Largest body of the routes that go to render (render pass-through, OpenAI chat and
    completions): render's own default cap; set it to what the render nodes run with."""

    max_pending: int = 1024
    """Requests one worker process holds (reading, waiting on a node, streaming back) before
    answering 429 with Retry-After."""

    max_held_bytes: int | None = None
    """Bytes of request bodies (and their decoded copies) one worker process may hold; past
    it a request is answered 429 with Retry-After before its body is read (413 if it alone
    declares more). None: a quarter of the memory limit (cgroup, else RAM) shared among the
    workers; 0: no byte budget."""

    max_background_responses: int = 64
    """Background Responses (``background: true``, the store on) one worker runs at once;
    past it, 429 ``overloaded`` before anything runs. Each also holds a place and the bytes it
    keeps (the document parsed from its body, render's answer until generate has it) against
    ``max_pending`` and ``max_held_bytes`` until it ends, as a request does."""

    responses_store_bytes: int = 256 * 1024 * 1024
    """Bytes of the Responses store each tenant (API key; one for all when the door has no
    keys) keeps in one worker (``VLLM_ENABLE_RESPONSES_API_STORE``): what vLLM keeps of each
    stored response (its input messages, earlier turns included, its answer, a background
    stream's events), counted as the bytes its objects hold in memory. Past it the tenant's
    oldest finished responses are evicted (then 404 as an unknown id), never another
    tenant's nor one still running (queued, in progress, or a stream still being written);
    a tenant whose running responses alone hold it is answered 429 ``overloaded`` until one
    ends. A worker's store holds at most this once per key, and once for callers without
    one, plus what running responses grow past it."""

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

    upstream_keepalive_s: float = 30.0
    """How long an idle connection to a node is kept for reuse, in seconds. Must be shorter
    than the nodes keep theirs (``tandem_http.draining.KEEP_ALIVE_S``, 75 s), so that a
    request never goes out on a connection the node is closing."""

    connect_timeout_s: float = 5.0
    """Connection timeout per upstream attempt; a refused or timed-out connect is retried on
    another node (the request never reached the first)."""

    read_timeout_s: float = 600.0
    """Longest wait for an upstream's next bytes."""

    max_connections_per_upstream: int = 256

    health_interval_s: float = 2.0
    """How long a node's health answer is trusted by ``/health``."""

    node_cooldown_s: float = 5.0
    """How long a node that refused a connection comes last in routing."""

    fence_poll_s: float = 2.0
    """Seconds between asking every generate node its ``/weight_info``: a node that does not
    hold the fleet's weights is fenced (gets no requests) until it does (see
    ``tandem_client.fleet``). Each worker process asks on its own; the worker that ran an
    update's finish asks at once, and a worker that saw a node fenced asks again from 0.1 s
    on, doubling up to this period, so that a read made mid-update fences the slower node
    only until the update reaches it."""

    node_timeout_s: float = 10.0
    """A generate node unreachable for longer leaves the fleet: the others' weights decide
    which are the fleet's, updates go on without it, and it is fenced when it comes back
    unless it holds the fleet's weights."""

    control_timeout_s: float = 10.0
    """Longest wait for a node's answer to a control call that loads nothing (version polls,
    start, abort, pause, resume...); the loading ones (``/update_weights``,
    ``/finish_weight_update``, ``/init_weight_transfer_engine``) wait ``read_timeout_s``."""

    discovery_interval_s: float = 10.0
    """Seconds between lookups of the ``dns+http://`` names of ``render_urls`` and
    ``generate_urls`` (and checks of pending nodes' weight versions)."""

    inline_render: str | None = None
    """Render's settings (JSON) when the door renders in its own processes (``--render
    inline``; see ``inline_render``); None: render nodes at ``render_urls``."""

    discovery_hosts_file: str | None = None
    """A hosts-format file (``ADDRESS NAME...`` lines) that resolves the ``dns+http://`` names
    instead of DNS, read at each lookup (tests; hosts without DNS). None: the system resolver."""

    def __post_init__(self) -> None:
        for spec in (*self.render_urls, *self.generate_urls):
            parse_node_spec(spec)  # a ValueError names the bad entry
        if self.discovery_interval_s <= 0:
            raise ValueError(
                f"discovery_interval_s must be above 0, not {self.discovery_interval_s}"
            )
        for name in ("max_background_responses", "responses_store_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, not {getattr(self, name)}")
        for name in ("fence_poll_s", "node_timeout_s", "control_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be above 0, not {getattr(self, name)}")
        if not 0 < self.upstream_keepalive_s < KEEP_ALIVE_S:
            raise ValueError(
                f"upstream_keepalive_s must be above 0 and below the nodes' {KEEP_ALIVE_S} s "
                f"keep-alive, not {self.upstream_keepalive_s}"
            )

    def names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.model,)

    def to_json(self) -> str:
        return settings_to_json(self)

    @classmethod
    def from_json(cls, text: str) -> FrontSettings:
        return settings_from_json(cls, text)

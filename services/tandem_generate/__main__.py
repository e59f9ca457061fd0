"""``python -m tandem_generate --model DIR [vLLM options] [--host H --port P | --uds PATH ...]``"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.envs import enable_envs_cache
from vllm.utils.argparse_utils import FlexibleArgumentParser

from tandem_client.unix_nodes import UNIX_PREFIX, unix_socket_path
from tandem_http import (
    ADMIN_KEY_ENV,
    Drain,
    DrainingConfig,
    DrainingServer,
    add_body_deadline_flags,
    add_send_deadline_flags,
    add_uds_argument,
    keys_from_env,
    program_name,
    serve,
)

from .app import create_app
from .content_parts import RENDER_URL_FLAG
from .engine import Engine
from .settings import ENGINE_MM_PROCESSOR_CACHE_GB, ONEDNN_KERNEL_CACHE, GenerateSettings

ENGINE_DIED_EXIT_CODE = os.EX_SOFTWARE
"""The process's exit status when it stopped because the vLLM engine died."""

DOOR_KEY_ENV = "TANDEM_DOOR_API_KEY"
"""Environment variable with the front doors' keys when no ``--door-api-key`` is given."""

RENDER_KEY_ENV = "TANDEM_CONTENT_PARTS_RENDER_API_KEY"
"""Environment variable with the content-parts render node's key when no
``--content-parts-render-api-key`` is given."""


def _render_url(text: str) -> str:
    """A content-parts render URL: a malformed unix: one is refused here, before the engine
    loads (tandem_client, which reaches it, is built after)."""
    if text.startswith(UNIX_PREFIX):
        try:
            unix_socket_path(text.rstrip("/"))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: Sequence[str] | None = None) -> tuple[GenerateSettings, AsyncEngineArgs]:
    # vLLM's parser has no annotations.
    parser = FlexibleArgumentParser(  # type: ignore[no-untyped-call]
        prog=program_name("tandem_generate"), description=__doc__
    )
    ours = parser.add_argument_group(  # type: ignore[no-untyped-call]
        "tandem generate",
        "Tandem's HTTP side (list them with --help='tandem generate'); every other option "
        "is vLLM's engine option.",
    )
    ours.add_argument("--host", default="127.0.0.1", help="address to listen on")
    ours.add_argument("--port", type=int, default=8200, help="port to listen on")
    add_uds_argument(ours)
    ours.add_argument(
        "--api-key",
        nargs="+",
        default=None,  # the environment is read after parsing, so --help never shows the key
        help="inference keys: require `Authorization: Bearer KEY` with one of these keys (or "
        "an admin key) on every route but /health (held items are kept per key); "
        "$TANDEM_API_KEY sets the default",
    )
    ours.add_argument(
        "--admin-api-key",
        nargs="+",
        action="extend",
        default=None,
        help="admin keys (several: repeat the flag or list them): the only keys that may call "
        "the state-changing control routes (/pause, /resume, /abort_requests, weight updates, "
        "/reset_prefix_cache; an inference key gets 403 admin_required); they also pass "
        f"wherever an inference key does; ${ADMIN_KEY_ENV} (comma-separated) sets the default",
    )
    ours.add_argument(
        "--door-api-key",
        nargs="+",
        action="extend",
        default=None,
        help="keys of front doors (each also an --api-key or --admin-api-key): their "
        "x-tandem-tenant header names the caller whose items a request keeps, so tenants "
        f"behind one door stay apart; ${DOOR_KEY_ENV} (comma-separated) sets the default",
    )
    ours.add_argument(
        "--enable-control-routes",
        action="store_true",
        help="without --admin-api-key, serve the state-changing control routes to every "
        "caller the key check lets in (any --api-key, or anyone with no key: for a trusted "
        "network only); without it they answer 403. No effect with admin keys",
    )
    ours.add_argument(
        "--weight-transfer-dir",
        default=None,
        help="folder that tandem_file weight updates are read from (with "
        '--weight-transfer-config \'{"backend": "tandem_file"}\'); trainer and server '
        "must both see it",
    )
    ours.add_argument(
        "--update-idle-timeout-s",
        type=float,
        default=GenerateSettings.update_idle_timeout_s,
        help="end a weight update with no step (start, chunk) for this many seconds without "
        "loading it, as /abort_weight_update does: its trainer is gone (0: never)",
    )
    ours.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        help="largest request body, in bytes (default: what the model can take: its context "
        "filled with image tokens, as JSON)",
    )
    ours.add_argument(
        "--max-items-per-prompt",
        type=int,
        default=GenerateSettings.max_items_per_prompt,
        help="most multimodal items in one request",
    )
    ours.add_argument(
        "--max-pending",
        type=int,
        default=GenerateSettings.max_pending,
        help="requests admitted (decoding, queued or running) before answering 429",
    )
    ours.add_argument(
        "--max-held-bytes",
        type=int,
        default=None,
        help="bytes of request bodies (by Content-Length) and decoded items the admitted "
        "requests may hold before answering 429 (default: a quarter of the memory limit, "
        "cgroup or RAM; 0: no byte budget)",
    )
    add_body_deadline_flags(ours)
    add_send_deadline_flags(ours)
    ours.add_argument(
        "--allow-request-priority",
        action="store_true",
        help="honour the priority field of requests (otherwise every request runs at 0)",
    )
    ours.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="put the engine's prefix-cache hits in every answer's usage "
        "(prompt_tokens_details.cached_tokens), as upstream's flag does",
    )
    ours.add_argument(
        "--item-cache-bytes",
        type=int,
        default=GenerateSettings.item_cache_bytes,
        help="bytes of decoded items kept, per tenant and mm_hash, for requests that send "
        "null kwargs_data entries",
    )
    ours.add_argument(
        "--pretouch-item-cache",
        action=argparse.BooleanOptionalAction,
        default=GenerateSettings.pretouch_item_cache,
        help="keep freed memory and fault in the item cache budget at start-up",
    )
    ours.add_argument(
        "--disable-structured-outputs",
        action="store_true",
        help="refuse sampling_params.structured_outputs (JSON schema, regex, choice, grammar) "
        "with a 400; the backend that compiles them is vLLM's --structured-outputs-config",
    )
    ours.add_argument(
        "--max-structured-output-bytes",
        type=int,
        default=GenerateSettings.max_structured_output_bytes,
        help="largest sampling_params.structured_outputs accepted, in bytes of its JSON",
    )
    ours.add_argument(
        RENDER_URL_FLAG,
        type=_render_url,
        default=None,
        metavar="URL",
        help="a render node's base URL (e.g. http://render:8100, or unix:/PATH for one on a "
        "Unix-domain socket): requests with content_parts "
        "(raw image URLs and token ids carrying the model's placeholder token) are rendered "
        "there (/v1/completions/render; media fetched under its media policy) and generated "
        "from its token ids and features; without it such requests get 400",
    )
    ours.add_argument(
        "--content-parts-render-api-key",
        default=None,  # the environment is read after parsing, so --help never shows the key
        help="the key sent to that render node (one of its --api-key); "
        f"${RENDER_KEY_ENV} sets the default",
    )
    ours.add_argument(
        "--content-parts-render-timeout-s",
        type=float,
        default=GenerateSettings.content_parts_render_timeout_s,
        help="seconds that render node may take to answer (media fetches included) before "
        "the request is answered 503",
    )
    parser = AsyncEngineArgs.add_cli_args(parser)
    parser.set_defaults(mm_processor_cache_gb=ENGINE_MM_PROCESSOR_CACHE_GB)
    args = parser.parse_args(None if argv is None else list(argv))
    engine_args = AsyncEngineArgs.from_cli_args(args)
    names = tuple(engine_args.served_model_name or [engine_args.model])
    if isinstance(engine_args.served_model_name, str):
        names = (engine_args.served_model_name,)
    settings = GenerateSettings(
        served_model_names=names,
        host=args.host,
        port=args.port,
        uds=args.uds,
        api_key=tuple(args.api_key) if args.api_key else os.environ.get("TANDEM_API_KEY"),
        admin_api_key=tuple(args.admin_api_key or keys_from_env(os.environ.get(ADMIN_KEY_ENV))),
        door_api_key=tuple(args.door_api_key or keys_from_env(os.environ.get(DOOR_KEY_ENV))),
        enable_control_routes=args.enable_control_routes,
        weight_transfer_dir=args.weight_transfer_dir,
        update_idle_timeout_s=args.update_idle_timeout_s,
        # vLLM's own --log-level (engine args) sets ours too.
        log_level=str(getattr(args, "log_level", None) or "info").lower(),
        max_body_bytes=args.max_body_bytes,
        max_items_per_prompt=args.max_items_per_prompt,
        max_pending=args.max_pending,
        max_held_bytes=args.max_held_bytes,
        body_timeout_s=args.body_timeout_s,
        body_min_rate=args.body_min_rate,
        send_timeout_s=args.send_timeout_s,
        send_min_rate=args.send_min_rate,
        item_cache_bytes=args.item_cache_bytes,
        allow_request_priority=args.allow_request_priority,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        pretouch_item_cache=args.pretouch_item_cache,
        structured_outputs=not args.disable_structured_outputs,
        max_structured_output_bytes=args.max_structured_output_bytes,
        content_parts_render_url=args.content_parts_render_url,
        content_parts_render_api_key=(
            args.content_parts_render_api_key or os.environ.get(RENDER_KEY_ENV)
        ),
        content_parts_render_timeout_s=args.content_parts_render_timeout_s,
    )
    return settings, engine_args


def bound_kernel_cache() -> None:
    """Bound oneDNN's kernel cache in the engine's processes (they inherit this environment),
    unless the operator set it (see ``ONEDNN_KERNEL_CACHE``)."""
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(ONEDNN_KERNEL_CACHE))


def main(argv: Sequence[str] | None = None) -> None:
    settings, engine_args = parse_args(argv)
    bound_kernel_cache()
    engine_died = threading.Event()
    server: DrainingServer | None = None

    def stop_on_engine_death() -> None:
        engine_died.set()
        if server is not None:
            server.should_exit = True

    def engine() -> Engine:
        built = Engine(engine_args)
        # Once started, as vLLM's engine core and workers do: its output loop here reads its
        # environment variables on every engine step otherwise (measured: ~4% of this
        # process's CPU per request). Here and not in Engine: tests build engines in a process
        # whose environment they change later.
        enable_envs_cache()
        return built

    app = create_app(settings, engine, on_engine_dead=stop_on_engine_death)
    # One process: the engine lives here; vLLM's engine core runs in its own child process.
    # On SIGTERM: new requests get 503 while the running ones finish (tandem_http.draining).
    server = DrainingServer(
        DrainingConfig(
            app,
            drain=Drain(),
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            proxy_headers=False,
        )
    )
    serve(server, settings.uds)
    if engine_died.is_set():
        sys.exit(ENGINE_DIED_EXIT_CODE)


if __name__ == "__main__":
    main()

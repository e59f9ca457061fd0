"""``python -m tandem_front --render URL[,URL] --generate URL[,URL] --model DIR [...]``"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace

from tandem_http import (
    ADMIN_KEY_ENV,
    add_body_deadline_flags,
    add_send_deadline_flags,
    add_uds_argument,
    keys_from_env,
    program_name,
    serve_settings,
    settings_from_cli,
)
from tandem_http.draining import KEEP_ALIVE_S
from tandem_vllm.parser_flags import add_parser_flags, check_parser_flags

from .inline_render import INLINE, INLINE_RENDER_URL, inline_render_settings
from .settings import SETTINGS_ENV, FrontSettings


def _urls(text: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    if not urls:
        raise argparse.ArgumentTypeError("at least one URL is needed")
    return urls


def parse_args(argv: Sequence[str] | None = None) -> FrontSettings:
    p = argparse.ArgumentParser(prog=program_name("tandem_front"), description=__doc__)
    env = os.environ.get
    p.add_argument(
        "--render",
        dest="render_urls",
        type=_urls,
        default=_urls(env("TANDEM_RENDER_URLS", "")) if env("TANDEM_RENDER_URLS") else None,
        required=not env("TANDEM_RENDER_URLS"),
        help="render node base URLs, comma-separated; unix:/PATH is a node on that "
        "Unix-domain socket (its --uds); dns+http://NAME:PORT is every address "
        "NAME resolves to, looked up again every --discovery-interval-s; `inline`: render in "
        "the door's own processes (one box; see --render-args) (default: $TANDEM_RENDER_URLS)",
    )
    p.add_argument(
        "--render-args",
        default="",
        help="with --render inline: render's own options, as one string (python -m "
        "tandem_render --help); the model, its tokenizer, chat template and parsers are the "
        "door's",
    )
    p.add_argument(
        "--generate",
        dest="generate_urls",
        type=_urls,
        default=_urls(env("TANDEM_GENERATE_URLS", "")) if env("TANDEM_GENERATE_URLS") else None,
        required=not env("TANDEM_GENERATE_URLS"),
        help="generate node base URLs, comma-separated; unix:/PATH is a node on that "
        "Unix-domain socket (its --uds); dns+http://NAME:PORT is every address "
        "NAME resolves to (a Kubernetes headless Service), looked up again every "
        "--discovery-interval-s; a node gets no inference work unless it holds the fleet's "
        "weights (default: $TANDEM_GENERATE_URLS)",
    )
    p.add_argument(
        "--discovery-interval-s",
        type=float,
        help="seconds between lookups of dns+http:// node names "
        f"(default: {FrontSettings.discovery_interval_s})",
    )
    p.add_argument(
        "--discovery-hosts-file",
        help="resolve dns+http:// node names from this hosts-format file (ADDRESS NAME... "
        "lines, read at each lookup) instead of DNS",
    )
    p.add_argument(
        "--model",
        default=env("TANDEM_MODEL"),
        required=env("TANDEM_MODEL") is None,
        help="model folder or hub name: its tokenizer detokenizes the OpenAI routes' answers "
        "(no weights; default: $TANDEM_MODEL)",
    )
    p.add_argument(
        "--served-model-name",
        nargs="*",
        default=[],
        help="names clients may use in `model` (default: --model)",
    )
    p.add_argument("--tokenizer", help="tokenizer folder or name, if not the model's")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=None,
        help="run model-provided tokenizer code (only for models you trust)",
    )
    add_parser_flags(p, FrontSettings.tool_strict_level, FrontSettings.cohere_format)
    p.add_argument(
        "--host",
        default=env("TANDEM_HOST", "127.0.0.1"),
        help="address to listen on (default: $TANDEM_HOST, else 127.0.0.1)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(env("TANDEM_FRONT_PORT", "8000")),
        help="port to listen on (default: $TANDEM_FRONT_PORT, else 8000)",
    )
    add_uds_argument(p)
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("TANDEM_FRONT_WORKERS", "0")) or None,
        help="worker processes (default: $TANDEM_FRONT_WORKERS, else 1, as vllm serve's one "
        "API process)",
    )
    p.add_argument(
        "--api-key",
        default=None,  # the environment is read after parsing, so --help never shows the key
        help="the inference key: require `Authorization: Bearer KEY` (or an admin key) on "
        "every route but /health (default: $TANDEM_API_KEY, else no key)",
    )
    p.add_argument(
        "--admin-api-key",
        nargs="+",
        action="extend",
        default=None,
        help="admin keys (several: repeat the flag or list them): the only keys whose "
        "state-changing control calls (/pause, /resume, /abort_requests, weight updates, "
        "/reset_prefix_cache) are sent on to the generate nodes (an inference key gets 403 "
        "admin_required); they also pass wherever the inference key does "
        f"(default: ${ADMIN_KEY_ENV}, comma-separated, else none)",
    )
    p.add_argument(
        "--upstream-api-key",
        default=None,
        help="the key sent to the render and generate nodes "
        "(default: $TANDEM_UPSTREAM_API_KEY, else none)",
    )
    p.add_argument(
        "--upstream-admin-api-key",
        default=None,
        help="the key sent to the generate nodes on state-changing control routes, one of "
        "their --admin-api-key (default: $TANDEM_UPSTREAM_ADMIN_API_KEY, else the "
        "--upstream-api-key)",
    )
    p.add_argument(
        "--enable-control-routes",
        action="store_true",
        default=None,
        help="without --admin-api-key, serve the state-changing control routes to every "
        "caller the key check lets in (the --api-key's holders, or anyone with no key: for a "
        "trusted network only); without it they answer 403. No effect with admin keys",
    )
    p.add_argument(
        "--logprobs-format",
        choices=["vllm-0.32", "trl"],
        help="shape of /inference/v1/generate logprob entries: vLLM 0.32's integer token_id, "
        'or `trl`: also `token: "token_id:<id>"`, which TRL 1.16\'s client parses; a request '
        "may pick with the header X-Tandem-Logprobs-Format (default: vllm-0.32)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn log level (default: %(default)s)")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        help="largest /inference/v1/generate body, in bytes (default: the largest cap the "
        "generate nodes tell, their model's; until one has told, "
        f"{FrontSettings.max_body_bytes})",
    )
    p.add_argument(
        "--render-max-body-bytes",
        type=int,
        help="largest body of the routes that go to render (render pass-through, chat and "
        f"completions), in bytes (default: render's own, {FrontSettings.render_max_body_bytes})",
    )
    p.add_argument(
        "--max-pending",
        type=int,
        help="requests one worker holds before answering 429 "
        f"(default: {FrontSettings.max_pending})",
    )
    p.add_argument(
        "--max-held-bytes",
        type=int,
        help="bytes of request bodies one worker holds before answering 429 (default: a "
        "quarter of the memory limit, cgroup or RAM, shared among the workers; 0: no budget)",
    )
    p.add_argument(
        "--max-background-responses",
        type=int,
        help="background Responses one worker runs at once; past it, 429 (each also holds a "
        "place and its bytes against --max-pending and --max-held-bytes until it ends) "
        f"(default: {FrontSettings.max_background_responses})",
    )
    p.add_argument(
        "--responses-store-bytes",
        type=int,
        help="bytes of the Responses store each API key keeps in one worker "
        "(VLLM_ENABLE_RESPONSES_API_STORE=1): inputs, answers and background events, as held "
        "in memory; past it that key's oldest finished responses are evicted, never one still "
        "running (429 while its running ones hold it all) "
        f"(default: {FrontSettings.responses_store_bytes})",
    )
    add_body_deadline_flags(p)
    add_send_deadline_flags(p)
    p.add_argument(
        "--upstream-keepalive-s",
        type=float,
        help="seconds an idle connection to a node is kept, below the nodes' own "
        f"{KEEP_ALIVE_S} s (default: {FrontSettings.upstream_keepalive_s})",
    )
    p.add_argument(
        "--connect-timeout-s",
        type=float,
        help="connect timeout per upstream attempt; a failed connect moves the request to the "
        f"next node (default: {FrontSettings.connect_timeout_s})",
    )
    p.add_argument(
        "--read-timeout-s",
        type=float,
        help=f"longest wait for an upstream's next bytes (default: {FrontSettings.read_timeout_s})",
    )
    p.add_argument(
        "--fence-poll-s",
        type=float,
        help="seconds between asking every generate node what weights it holds; a node that "
        "does not hold the fleet's weights is fenced, gets no requests, until it does; while "
        "one is fenced they are asked again sooner (from 0.1 s, doubling up to this) "
        f"(default: {FrontSettings.fence_poll_s})",
    )
    p.add_argument(
        "--node-timeout-s",
        type=float,
        help="a generate node unreachable for longer leaves the fleet: the others' weights "
        "decide, updates go on without it, and it is fenced when it comes back unless it "
        f"holds the fleet's weights (default: {FrontSettings.node_timeout_s})",
    )
    p.add_argument(
        "--control-timeout-s",
        type=float,
        help="longest wait for a node's answer to a control call that loads nothing (version "
        "polls, start, abort, pause, resume); /update_weights, /finish_weight_update and "
        "/init_weight_transfer_engine wait --read-timeout-s "
        f"(default: {FrontSettings.control_timeout_s})",
    )
    args = vars(p.parse_args(argv))
    args["served_model_name"] = tuple(args["served_model_name"] or ())
    args["api_key"] = args["api_key"] or env("TANDEM_API_KEY")
    args["upstream_api_key"] = args["upstream_api_key"] or env("TANDEM_UPSTREAM_API_KEY")
    args["admin_api_key"] = tuple(args["admin_api_key"] or keys_from_env(env(ADMIN_KEY_ENV)))
    args["upstream_admin_api_key"] = args["upstream_admin_api_key"] or env(
        "TANDEM_UPSTREAM_ADMIN_API_KEY"
    )
    check_parser_flags(p, args)
    # An operator's cap is the cap; otherwise the door follows what the generate nodes take.
    args["follow_generate_body_cap"] = args["max_body_bytes"] is None
    render_args = args.pop("render_args")
    inline = args["render_urls"] == (INLINE,)
    if inline:
        args["render_urls"] = (INLINE_RENDER_URL,)
    elif render_args:
        p.error("--render-args is for --render inline")
    try:
        settings = settings_from_cli(FrontSettings, args)
    except ValueError as exc:
        p.error(str(exc))
    if inline:
        settings = replace(settings, inline_render=inline_render_settings(settings, render_args))
    return settings


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    serve_settings("tandem_front.app:app_from_env", settings, SETTINGS_ENV)


if __name__ == "__main__":
    main()

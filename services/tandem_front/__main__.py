"""``python -m tandem_front --render URL[,URL] --generate URL[,URL] --model DIR [...]``"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from tandem_http import serve_settings, settings_from_cli

from .settings import SETTINGS_ENV, FrontSettings


def _urls(text: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in text.split(",") if u.strip())
    if not urls:
        raise argparse.ArgumentTypeError("at least one URL is needed")
    return urls


def parse_args(argv: Sequence[str] | None = None) -> FrontSettings:
    p = argparse.ArgumentParser(prog="python -m tandem_front", description=__doc__)
    env = os.environ.get
    p.add_argument(
        "--render",
        dest="render_urls",
        type=_urls,
        default=_urls(env("TANDEM_RENDER_URLS", "")) if env("TANDEM_RENDER_URLS") else None,
        required=not env("TANDEM_RENDER_URLS"),
        help="render node base URLs, comma-separated (default: $TANDEM_RENDER_URLS)",
    )
    p.add_argument(
        "--generate",
        dest="generate_urls",
        type=_urls,
        default=_urls(env("TANDEM_GENERATE_URLS", "")) if env("TANDEM_GENERATE_URLS") else None,
        required=not env("TANDEM_GENERATE_URLS"),
        help="generate node base URLs, comma-separated (default: $TANDEM_GENERATE_URLS)",
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
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("TANDEM_FRONT_WORKERS", "0")) or None,
        help="worker processes (default: $TANDEM_FRONT_WORKERS, else the number of cores, "
        "at most 4)",
    )
    p.add_argument(
        "--api-key",
        default=None,  # the environment is read after parsing, so --help never shows the key
        help="require `Authorization: Bearer KEY` on every route but /health "
        "(default: $TANDEM_API_KEY, else no key)",
    )
    p.add_argument(
        "--upstream-api-key",
        default=None,
        help="the key sent to the render and generate nodes "
        "(default: $TANDEM_UPSTREAM_API_KEY, else none)",
    )
    p.add_argument(
        "--enable-control-routes",
        action="store_true",
        default=None,
        help="serve the state-changing control routes (/reset_prefix_cache, /pause, weight "
        "updates...) without an API key (with --api-key they are always served)",
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
        help=f"largest request body, in bytes (default: {FrontSettings.max_body_bytes})",
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
    args = vars(p.parse_args(argv))
    args["served_model_name"] = tuple(args["served_model_name"] or ())
    args["api_key"] = args["api_key"] or env("TANDEM_API_KEY")
    args["upstream_api_key"] = args["upstream_api_key"] or env("TANDEM_UPSTREAM_API_KEY")
    return settings_from_cli(FrontSettings, args)


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    serve_settings("tandem_front.app:app_from_env", settings, SETTINGS_ENV)


if __name__ == "__main__":
    main()

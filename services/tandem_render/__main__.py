"""``python -m tandem_render --model DIR [--workers N] [--host H] [--port P] ...``"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from tandem_http import run_server

from .settings import SETTINGS_ENV, RenderSettings


def parse_args(argv: Sequence[str] | None = None) -> RenderSettings:
    p = argparse.ArgumentParser(prog="python -m tandem_render", description=__doc__)
    env = os.environ.get
    p.add_argument("--model", default=env("TANDEM_MODEL"), required=env("TANDEM_MODEL") is None)
    p.add_argument("--served-model-name", nargs="*", default=[])
    p.add_argument("--tokenizer")
    p.add_argument("--revision")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--chat-template")
    p.add_argument("--host", default=env("TANDEM_HOST", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(env("TANDEM_RENDER_PORT", "8100")))
    p.add_argument(
        "--workers",
        type=int,
        default=int(env("TANDEM_RENDER_WORKERS", "0")) or None,
        help="worker processes (default: the number of cores)",
    )
    p.add_argument(
        "--inline-processing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="render on each worker's loop thread instead of thread pools (default: on)",
    )
    p.add_argument("--api-key", default=env("TANDEM_API_KEY"))
    p.add_argument("--log-level", default="info")
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--max-images-per-prompt", type=int)
    p.add_argument("--max-videos-per-prompt", type=int)
    p.add_argument("--max-pending", type=int)
    p.add_argument("--item-cache-bytes", type=int)
    p.add_argument("--decoded-cache-bytes", type=int)
    p.add_argument("--answer-cache-bytes", type=int)
    p.add_argument("--answer-cache-ttl-s", type=float)
    p.add_argument("--mm-processor-cache-gb", type=float)
    p.add_argument(
        "--pretouch-cache-memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep freed memory and fault in the cache budgets at start-up (default: on)",
    )
    p.add_argument("--mm-processor-kwargs-allowlist", nargs="*")
    p.add_argument("--allowed-media-domains", nargs="*")
    p.add_argument("--allow-private-networks", action="store_true", default=None)
    p.add_argument("--allowed-private-hosts", nargs="*")
    p.add_argument("--allowed-local-media-path")
    p.add_argument("--media-fetch-timeout-s", type=float)
    p.add_argument("--max-media-bytes", type=int)
    p.add_argument("--max-image-pixels", type=int)
    args = vars(p.parse_args(argv))
    args["served_model_name"] = tuple(args["served_model_name"] or ())
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items() if v is not None}
    return RenderSettings(**given)


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    run_server(
        "tandem_render.app:app_from_env",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        env={SETTINGS_ENV: settings.to_json()},
        log_level=settings.log_level,
    )


if __name__ == "__main__":
    main()

"""`make run` / `make demo`: start render and generate on 127.0.0.1, run the example, serve on.

Without ``--model`` the tiny Qwen2-VL test model is built (seconds) and served. ``--demo`` runs
the example and stops everything; otherwise the pair keeps serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from tools.servers import ServerProcess, python_module

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="", help="model folder or hub name (default: tiny)")
    parser.add_argument("--render-port", type=int, default=8100)
    parser.add_argument("--generate-port", type=int, default=8200)
    parser.add_argument("--render-workers", type=int, default=0, help="default: one per core")
    parser.add_argument("--engine-args", default="--enforce-eager --max-model-len 4096")
    parser.add_argument("--demo", action="store_true", help="run the example, then stop")
    args = parser.parse_args(argv)
    model = args.model
    if not model:
        from tools.tiny_models import ensure_model

        model = str(ensure_model("qwen2-vl"))
    render_args = ["--model", model, "--port", str(args.render_port)]
    if args.render_workers:
        render_args += ["--workers", str(args.render_workers)]
    render = ServerProcess("render", python_module("tandem_render", *render_args), args.render_port)
    generate = ServerProcess(
        "generate",
        python_module(
            "tandem_generate",
            "--model",
            model,
            "--port",
            str(args.generate_port),
            *shlex.split(args.engine_args),
        ),
        args.generate_port,
    )
    try:
        print(f"starting render on {render.url} and generate on {generate.url} ({model})")
        render.wait_healthy(timeout=300)
        generate.wait_healthy(timeout=600)
        print("both healthy; running examples/example_mm_serve.py", flush=True)
        example = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "example_mm_serve.py"),
                "--render-url",
                render.url,
                "--generate-url",
                generate.url,
            ],
            check=False,
        )
        if example.returncode != 0:
            print(f"the example failed ({example.returncode})", file=sys.stderr)
            return example.returncode
        if args.demo:
            return 0
        print(f"serving: render {render.url}, generate {generate.url}; Ctrl-C to stop", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.pause()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        render.stop()
        generate.stop()
        print(f"logs: {render.log} {generate.log}")


if __name__ == "__main__":
    raise SystemExit(main())

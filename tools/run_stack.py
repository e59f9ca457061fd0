"""`make run` / `make demo`: start render, two generate nodes and the front door on 127.0.0.1,
run the examples against the front door (the one URL users get), serve on.

Without ``--model`` the tiny Qwen2-VL test model is built (seconds) and served; a tiny model's
name (``qwen2-audio``, ``qwen3-vl``, ...) serves that one. ``--demo`` runs the examples and stops
everything; otherwise the stack keeps serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.servers import ServerProcess, service_command, weight_transfer_args

ROOT = Path(__file__).resolve().parent.parent
MEDIA = ("image", "video", "audio")
WEIGHT_DIR = ROOT / ".cache" / "weight-transfer"
"""Where trainers write weight updates for the generate server (examples/grpo_rollout.py)."""
MAX_RESTARTS = 5
RESTART_WINDOW_S = 600.0


EMBEDS_EXAMPLE_MODELS = ("qwen2-vl", "qwen2.5-vl")
GRPO_EXAMPLE_MODELS = ("qwen2-vl",)
"""Tiny models examples/grpo_rollout.py trains (in transformers, on the CPU, with AdamW: a
real model would not fit a CPU trainer)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--model",
        default="",
        help="model folder, hub name or tiny model name (default: the tiny qwen2-vl)",
    )
    parser.add_argument(
        "--media",
        nargs="+",
        choices=MEDIA,
        help="what the examples send (default: audio for an audio model, else image and video)",
    )
    parser.add_argument("--render-port", type=int, default=8100)
    parser.add_argument(
        "--generate-port", type=int, default=8200, help="the first generate node's port"
    )
    parser.add_argument(
        "--generate-nodes",
        type=int,
        default=2,
        help="generate nodes behind the front door, on consecutive ports (weight updates "
        "reach them all)",
    )
    parser.add_argument("--front-port", type=int, default=8000)
    parser.add_argument(
        "--render-workers",
        type=int,
        default=0,
        help="default: render's own (the usable cores but one)",
    )
    parser.add_argument("--engine-args", default="--enforce-eager --max-model-len 4096")
    parser.add_argument("--demo", action="store_true", help="run the example, then stop")
    parser.add_argument(
        "--weight-dir", default=str(WEIGHT_DIR), help="folder weight updates are read from"
    )
    args = parser.parse_args(argv)
    if args.generate_nodes < 1:
        parser.error("--generate-nodes must be at least 1")
    from tools.tiny_models import AUDIO_MODELS, MODELS, ensure_model

    model = args.model or "qwen2-vl"
    media = args.media or (["audio"] if model in AUDIO_MODELS else ["image", "video"])
    # Precomputed image embeddings (an opt-in) on for the tiny models its example is known to
    # work with: their vision tower in transformers gives what vLLM's engine takes.
    embeds = ["--enable-mm-embeds"] if model in EMBEDS_EXAMPLE_MODELS else []
    if model in MODELS:
        model = str(ensure_model(model))
    render_args = ["--model", model, "--port", str(args.render_port), *embeds]
    if args.render_workers:
        render_args += ["--workers", str(args.render_workers)]
    render = ServerProcess(
        "render", service_command("tandem_render", *render_args), args.render_port
    )
    servers: dict[str, ServerProcess] = {}
    Path(args.weight_dir).mkdir(parents=True, exist_ok=True)
    generates = [
        ServerProcess(
            f"generate-{i}",
            service_command(
                "tandem_generate",
                "--model",
                model,
                "--port",
                str(args.generate_port + i),
                # Bound to 127.0.0.1 with no key: the control routes are for the local trainer.
                "--enable-control-routes",
                *weight_transfer_args(args.weight_dir),
                *embeds,
                *shlex.split(args.engine_args),
            ),
            args.generate_port + i,
        )
        for i in range(args.generate_nodes)
    ]
    front: ServerProcess | None = None
    try:
        print(
            f"starting render on {render.url} and generate on "
            f"{', '.join(g.url for g in generates)} ({model})"
        )
        # The door starts with them (its imports overlap their start-up); its /health answers
        # once render's and generate's do.
        front = ServerProcess(
            "front",
            service_command(
                "tandem_front",
                "--model",
                model,
                "--render",
                render.url,
                "--generate",
                ",".join(g.url for g in generates),
                "--port",
                str(args.front_port),
                "--workers",
                "1",
                # Fans the control routes out to generate, for the local trainer (as above).
                "--enable-control-routes",
            ),
            args.front_port,
        )
        render.wait_healthy(timeout=300)
        for generate in generates:
            generate.wait_healthy(timeout=600)
        front.wait_healthy(timeout=120)
        print(f"front door on {front.url}; running the examples against it", flush=True)
        examples = [
            # vLLM's render -> generate flow by hand (the door serves both routes), per medium.
            *(
                ["example_mm_serve.py", "--media", m, "--render-url", front.url]
                + ["--generate-url", front.url]
                for m in media
            ),
            ["openai_chat.py", "--media", media[0], "--url", front.url],
        ]
        if embeds:
            examples.append(
                ["image_embeds.py", "--render-url", front.url, "--generate-url", front.url]
            )
        if args.model in ("", *GRPO_EXAMPLE_MODELS):
            # A training step on the tiny model, its weights sent to every generate node.
            examples.append(
                ["grpo_rollout.py", "--url", front.url, "--weight-dir", args.weight_dir]
            )
        for example in examples:
            done = subprocess.run(
                [sys.executable, str(ROOT / "examples" / example[0]), *example[1:]], check=False
            )
            if done.returncode != 0:
                print(f"{example[0]} failed ({done.returncode})", file=sys.stderr)
                return done.returncode
        if args.demo:
            return 0
        print(
            f"serving: front door {front.url} (render {render.url}, generate "
            f"{', '.join(g.url for g in generates)}; weight updates from {args.weight_dir}); "
            "Ctrl-C to stop",
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        servers = {"render": render, **{g.name: g for g in generates}, "front": front}
        return supervise(servers)
    except KeyboardInterrupt:
        return 0
    finally:
        started = [render, *generates, *([front] if front else [])]
        for server in (*started, *servers.values()):
            server.stop()
        print(f"logs: {' '.join(str(s.log) for s in started)}")


def supervise(servers: dict[str, ServerProcess]) -> int:
    """Restart a server that exits (e.g. generate after its engine died), as compose or
    Kubernetes would; give up after ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW_S``."""
    restarts: list[float] = []
    while True:
        time.sleep(1)
        for name, server in list(servers.items()):
            code = server.proc.poll()
            if code is None:
                continue
            now = time.monotonic()
            restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
            print(f"{name} exited ({code}):\n{server.log_text(3000)}", file=sys.stderr)
            server.stop()
            if len(restarts) > MAX_RESTARTS:
                print(f"{len(restarts)} restarts in {RESTART_WINDOW_S:.0f} s: giving up")
                return 1
            print(f"restarting {name} on {server.url}", flush=True)
            servers[name] = server.restarted()
            servers[name].wait_healthy(timeout=600)
            print(f"{name} is healthy again", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())

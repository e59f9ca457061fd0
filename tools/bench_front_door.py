"""Front door benchmark: what one URL costs.

(a) ``/inference/v1/generate`` proxied through the front door vs posted to generate directly,
with render's msgpack output as the body (one noise image per chat, small and large, max_tokens
1 so that the engine's share stays small): the front door's CPU per request and per MB of body,
and the p50 latency it adds. Targets: <= 1 ms CPU per MB, <= 2 ms added p50.
(b) ``/v1/chat/completions`` through the front door (render -> generate -> detokenize) vs
upstream's monolithic ``vllm serve`` (greedy, max_tokens 8, one image per chat): throughput,
latency, and the CPU per request of each API process (the engine cores are not counted: they do
the same work on both paths).
All on the tiny Qwen2-VL model, one worker per service, on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx

from tests.support.images import chat_body, data_url, png_bytes
from tools.bench_generate import MSGPACK, Result, Step, api_cpu, check, drive
from tools.servers import (
    ServerProcess,
    tandem_front,
    tandem_generate,
    tandem_render,
    upstream_serve,
)
from tools.tiny_models import ensure_model

TARGET_CPU_MS_PER_MB = 1.0
TARGET_ADDED_P50_MS = 2.0


def generate_bodies(render_url: str, model: str, size: int, count: int) -> list[bytes]:
    bodies = []
    for seed in range(count):
        body = chat_body(
            model,
            [data_url(png_bytes(size, size, seed=1000 + seed))],
            temperature=0.0,
            max_tokens=1,
        )
        r = httpx.post(
            f"{render_url}/v1/chat/completions/render",
            json=body,
            headers={"accept": MSGPACK},
            timeout=120,
        )
        bodies.append(check(r).content)
    return bodies


def generate_step(url: str, bodies: list[bytes]) -> Step:
    headers = {"content-type": MSGPACK, "accept": MSGPACK}

    async def step(client: httpx.AsyncClient, i: int) -> None:
        check(await client.post(f"{url}/inference/v1/generate", content=bodies[i], headers=headers))

    return step


def chat_step(url: str, model: str, images: list[str]) -> Step:
    async def step(client: httpx.AsyncClient, i: int) -> None:
        body = chat_body(model, [images[i % len(images)]], temperature=0.0, max_tokens=8)
        r = check(await client.post(f"{url}/v1/chat/completions", json=body))
        assert json.loads(r.content)["choices"][0]["message"]["content"] is not None

    return step


async def proxied_vs_direct(
    front: ServerProcess, generate: ServerProcess, bodies: list[bytes], label: str
) -> list[str]:
    n = len(bodies)
    step_direct = generate_step(generate.url, bodies)
    step_proxied = generate_step(front.url, bodies)
    await drive("warm-up", step_direct, generate.proc.pid, min(4, n), 1)
    await drive("warm-up", step_proxied, front.proc.pid, min(4, n), 1)
    direct = await drive("direct", step_direct, generate.proc.pid, n, 1)
    front_cpu0 = api_cpu(front.proc.pid)
    proxied = await drive("proxied", step_proxied, generate.proc.pid, n, 1)
    front_cpu = api_cpu(front.proc.pid) - front_cpu0
    mb = sum(len(b) for b in bodies) / 1e6
    cpu_ms = front_cpu / n * 1000
    per_mb = front_cpu * 1000 / mb
    added = proxied.pct(50) - direct.pct(50)
    return [
        f"| {label} | {mb / n:.2f} | {direct.pct(50):.1f} | {proxied.pct(50):.1f} | "
        f"{added:+.2f} {'ok' if added <= TARGET_ADDED_P50_MS else 'OVER'} | {cpu_ms:.2f} | "
        f"{per_mb:.2f} {'ok' if per_mb <= TARGET_CPU_MS_PER_MB else 'OVER'} | "
        f"{len(direct.errors) + len(proxied.errors)} |"
    ]


def chat_row(r: Result, cpu: dict[str, float]) -> str:
    n = max(1, len(r.latencies) + len(r.errors))
    parts = ", ".join(f"{k} {v / n * 1000:.1f}" for k, v in cpu.items())
    total = sum(cpu.values()) / n * 1000
    return (
        f"| {r.label} | {r.concurrency} | {r.throughput:.2f} | {r.pct(50):.0f} | {r.pct(95):.0f} "
        f"| {total:.1f} ({parts}) | {len(r.errors)} |"
    )


async def chat_side_by_side(
    front: ServerProcess,
    render: ServerProcess,
    generate: ServerProcess,
    serve: ServerProcess,
    model: str,
    n: int,
) -> list[str]:
    images = [data_url(png_bytes(448, 448, seed=2000 + i)) for i in range(n)]
    rows = []
    for concurrency in (1, 4):
        for label, url, procs in (
            ("front door", front.url, {"front": front, "render": render, "generate": generate}),
            ("vllm serve", serve.url, {"serve": serve}),
        ):
            step = chat_step(url, model, images)
            await drive("warm-up", step, serve.proc.pid, 2, 1)
            before = {k: api_cpu(p.proc.pid) for k, p in procs.items()}
            result = await drive(label, step, serve.proc.pid, n, concurrency)
            cpu = {k: api_cpu(p.proc.pid) - before[k] for k, p in procs.items()}
            rows.append(chat_row(result, cpu))
    return rows


async def run(n: int, parts: str) -> None:
    model = str(ensure_model("qwen2-vl"))
    render = tandem_render(model, workers=1)
    generate = tandem_generate(model)
    servers = [render, generate]
    try:
        render.wait_healthy(300)
        generate.wait_healthy(600)
        front = tandem_front(model, render.url, generate.url, workers=1)
        servers.append(front)
        front.wait_healthy(120)
        if parts in ("all", "proxy"):
            print(
                "\n(a) /inference/v1/generate, render's msgpack body, max_tokens 1, concurrency 1"
            )
            print(
                "| body | MB/request | direct p50 ms | proxied p50 ms | added p50 ms (<= 2) "
                "| front CPU ms/request | front CPU ms/MB (<= 1) | errors |"
            )
            print("|---|---|---|---|---|---|---|---|")
            for label, size in (("448 px image", 448), ("1344 px image", 1344)):
                bodies = generate_bodies(render.url, model, size, n)
                for row in await proxied_vs_direct(front, generate, bodies, label):
                    print(row, flush=True)
        if parts in ("all", "chat"):
            serve = upstream_serve(model)
            servers.append(serve)
            serve.wait_healthy(600)
            print("\n(b) /v1/chat/completions, one 448 px image, greedy, max_tokens 8")
            print(
                "| path | concurrency | req/s | p50 ms | p95 ms "
                "| API CPU ms/request (per process) | errors |"
            )
            print("|---|---|---|---|---|---|---|")
            for row in await chat_side_by_side(front, render, generate, serve, model, n):
                print(row, flush=True)
    finally:
        for s in servers:
            s.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="requests per measurement")
    parser.add_argument("--parts", choices=["all", "proxy", "chat"], default="all")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.parts))


if __name__ == "__main__":
    main()

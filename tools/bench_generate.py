"""Generate benchmark: our render -> generate against upstream's pair and its monolithic server.

Side by side on the tiny Qwen2-VL model (one 448x448 noise image per chat, greedy, max_tokens 8):
(a) our render -> our generate (binary and JSON bodies), (b) upstream render -> upstream
generate, (c) upstream monolithic /v1/chat/completions. Reports latency p50/p95 at concurrency 1
and 4, throughput, and the generate-side API process's CPU per request (the engine core and its
worker are separate processes and not counted: they do the same work on every path). Then the
GRPO-shaped rollout batch of ``tools/bench_rollout.py`` on the same servers.
``--parts single`` or ``--parts rollout`` runs one half.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict

import httpx
import numpy as np
import psutil

from tests.support.images import chat_body, data_url, png_bytes
from tools import bench_rollout
from tools.servers import (
    ServerProcess,
    tandem_generate,
    tandem_render,
    upstream_render,
    upstream_serve,
)
from tools.tiny_models import ensure_model

MSGPACK = "application/vnd.msgpack"


class Sampling(TypedDict):
    temperature: float
    max_tokens: int


SAMPLING: Sampling = {"temperature": 0.0, "max_tokens": 8}
TIMEOUT = httpx.Timeout(120.0)
TARGET_CPU_VS_MONOLITHIC = 0.5
# The reading of the same target against upstream's generate: 0.5 x 12.9 / 17.6 ms.
EXPECTED_CPU_VS_UPSTREAM_GENERATE = 0.35


@dataclass
class Result:
    label: str
    concurrency: int
    latencies: list[float]
    seconds: float
    api_cpu_s: float
    errors: list[str]

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds

    def pct(self, p: float) -> float:
        return float(np.percentile(self.latencies, p)) * 1000

    @property
    def cpu_ms(self) -> float:
        return self.api_cpu_s / max(1, len(self.latencies) + len(self.errors)) * 1000


def api_cpu(pid: int) -> float:
    """CPU seconds of the API process alone (not its engine-core children)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


Step = Callable[[httpx.AsyncClient, int], Awaitable[None]]


async def drive(label: str, step: Step, api_pid: int, n: int, concurrency: int) -> Result:
    latencies: list[float] = []
    errors: list[str] = []
    todo = iter(range(n))
    limits = httpx.Limits(max_connections=2 * concurrency)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits, trust_env=False) as client:

        async def worker() -> None:
            for i in todo:
                t0 = time.perf_counter()
                try:
                    await step(client, i)
                except (httpx.HTTPError, AssertionError) as exc:
                    errors.append(str(exc)[:300])
                    continue
                latencies.append(time.perf_counter() - t0)

        cpu0 = api_cpu(api_pid)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
        cpu = api_cpu(api_pid) - cpu0
    return Result(label, concurrency, latencies, seconds, cpu, errors)


def check(r: httpx.Response) -> httpx.Response:
    assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:300]}"
    return r


def pair_step(render_url: str, generate_url: str, bodies: list[bytes], binary: bool) -> Step:
    render_headers = {"content-type": "application/json"}
    generate_headers = {"content-type": "application/json"}
    if binary:
        render_headers["accept"] = MSGPACK
        generate_headers["content-type"] = MSGPACK

    async def step(client: httpx.AsyncClient, i: int) -> None:
        rendered = check(
            await client.post(
                f"{render_url}/v1/chat/completions/render",
                content=bodies[i],
                headers=render_headers,
            )
        )
        # The render output goes to generate exactly as it came: zero conversion.
        check(
            await client.post(
                f"{generate_url}/inference/v1/generate",
                content=rendered.content,
                headers=generate_headers,
            )
        )

    return step


def monolithic_step(url: str, bodies: list[bytes]) -> Step:
    async def step(client: httpx.AsyncClient, i: int) -> None:
        check(
            await client.post(
                f"{url}/v1/chat/completions",
                content=bodies[i],
                headers={"content-type": "application/json"},
            )
        )

    return step


def start(server: ServerProcess) -> ServerProcess:
    server.wait_healthy(timeout=300)
    return server


def quiet(server: ServerProcess, seconds: float = 30) -> None:
    """Wait until the server tree's start-up CPU work is over."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(True)]
        before = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        time.sleep(1)
        after = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        if after - before < 0.05:
            return


def api_pid(server: ServerProcess) -> int:
    return server.proc.pid


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per cell")
    parser.add_argument(
        "--parts",
        default="single,rollout",
        help="comma-separated: single (one chat at a time), rollout (the GRPO-shaped batch)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    model = str(ensure_model("qwen2-vl"))
    n = args.requests
    warm = 6
    seed = iter(range(10_000, 10**6))

    def bodies(count: int) -> list[bytes]:
        return [
            json.dumps(
                chat_body(model, [data_url(png_bytes(448, 448, seed=next(seed)))], **SAMPLING)
            ).encode()
            for _ in range(count)
        ]

    results: list[Result] = []
    rollouts: list[bench_rollout.RolloutRun] = []
    ids, pad = bench_rollout.prompt_ids(model)
    # The same images for ours and the upstream pair (separate processes: no shared caches);
    # the monolithic server runs after the pair on the same engine, so it gets new ones.
    images = bench_rollout.batch_images(1)

    def rollout(
        one: Callable[[str, list[list[bytes]]], bench_rollout.RolloutRun], new: list[list[bytes]]
    ) -> None:
        if "rollout" not in parts:
            return
        for batch, images in (("fresh", new), ("repeated", new)):
            r = one(batch, images)
            rollouts.append(r)
            print(f"  {r.label} {batch}: {r.seconds:.2f} s, sent {r.bytes_sent / 1e6:.1f} MB")

    def run(label: str, make_step: Callable[[list[bytes]], Step], pid: int) -> None:
        asyncio.run(drive("warm-up", make_step(bodies(warm)), pid, warm, 2))
        for concurrency in (1, 4):
            r = asyncio.run(drive(label, make_step(bodies(n)), pid, n, concurrency))
            results.append(r)
            summary = f"{r.throughput:.1f} req/s, API CPU {r.cpu_ms:.1f} ms/req"
            print(f"  {label} c={concurrency}: {summary}, errors {len(r.errors)}", flush=True)
            for e in r.errors[:3]:
                print("   ", e)

    print("[ours] starting render (1 worker) and generate", flush=True)
    render, generate = start(tandem_render(model)), start(tandem_generate(model))
    try:
        quiet(generate)
        for binary, name in ((True, "binary"), (False, "JSON")):
            if "single" in parts:
                run(
                    f"(a) ours render -> generate, {name}",
                    functools.partial(pair_step, render.url, generate.url, binary=binary),
                    api_pid(generate),
                )
        rollout(bench_rollout.ours(model, render, generate, ids), images)
    finally:
        render.stop()
        generate.stop()

    print("[upstream] starting vllm launch render and vllm serve --enable-scale-out", flush=True)
    up_render, serve = start(upstream_render(model)), start(upstream_serve(model))
    try:
        quiet(serve)
        if "single" in parts:
            run(
                "(b) upstream render -> generate",
                lambda b: pair_step(up_render.url, serve.url, b, False),
                api_pid(serve),
            )
            run(
                "(c) upstream monolithic chat",
                lambda b: monolithic_step(serve.url, b),
                api_pid(serve),
            )
        rollout(bench_rollout.upstream_pair(model, up_render, serve, ids, pad), images)
        rollout(bench_rollout.upstream_monolithic(model, serve), bench_rollout.batch_images(20_001))
    finally:
        up_render.stop()
        serve.stop()

    if rollouts:
        bench_rollout.print_table(rollouts)
    if "single" not in parts:
        return 0
    print(
        "\nGenerate benchmark: tiny Qwen2-VL, one 448x448 noise PNG per chat, greedy, max_tokens 8,"
    )
    print(
        f"{n} requests per cell; CPU engine (vLLM 0.32 CPU build), 2 cores shared by all processes"
    )
    row = "{:<40} {:>4} {:>7} {:>8} {:>8} {:>15} {:>6}"
    print(row.format("path", "conc", "req/s", "p50 ms", "p95 ms", "API CPU ms/req", "errors"))
    for r in results:
        cells = (f"{r.throughput:.1f}", f"{r.pct(50):.1f}", f"{r.pct(95):.1f}", f"{r.cpu_ms:.2f}")
        print(row.format(r.label, r.concurrency, *cells, len(r.errors)))
    by = {(r.label[:3], r.concurrency, "binary" in r.label): r for r in results}
    for c in (1, 4):
        a, b, mono = by[("(a)", c, True)], by[("(b)", c, False)], by[("(c)", c, False)]
        ratio = a.cpu_ms / mono.cpu_ms
        cpu_met = "met" if ratio <= TARGET_CPU_VS_MONOLITHIC else "NOT met"
        tput_met = "met" if a.throughput >= b.throughput else "NOT met"
        print(
            f"c={c}: (a) API CPU / (c) = {ratio:.2f}x (target <= {TARGET_CPU_VS_MONOLITHIC}x: "
            f"{cpu_met}); (a)/(b) = {a.cpu_ms / b.cpu_ms:.2f}x (expected about "
            f"{EXPECTED_CPU_VS_UPSTREAM_GENERATE}x or less); throughput (a)/(b) = "
            f"{a.throughput / b.throughput:.2f}x (target >= 1x: {tput_met})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

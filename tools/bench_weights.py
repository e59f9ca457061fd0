"""Weight-update benchmark: the tandem_file backend against a plain copy of the same bytes.

(a) The tiny Qwen2-VL model, every tensor, on real servers (render, two generate nodes sharing
one ``--weight-transfer-dir``, the front door over them): the client's ``update_weights`` end to
end (file written, header checks in the API process and the engine worker, tensors staged,
layerwise reload, caches reset) to one node directly and through the door to both, median of
``--reps``; and the door's update by phase: the file write, each control call the door fans out
to both nodes (start, update, finish), then the first chat request after it (greedy, 8 tokens,
one new image: the finish reset the nodes' encoder and prefix caches) against the same request
once more.
(b) A synthetic 1 GB set of bf16 tensors: no model here holds 1 GB of parameters, so this
times the same transfer path outside an engine: the client's file write, the header read and
check against a matching spec, the worker's ``load_file`` into CPU tensors and the copy into
preallocated parameter tensors (what ``load_weights`` does for a plain layer). Its layerwise
re-processing (CPU weight pre-packing) is not in (b); (a) shows its cost on a real model.
The baseline for both is ``shutil.copyfile`` of the file the update wrote (page cache hot on
both sides: this is memory bandwidth, not disk).
(c) The trainer's peak RSS growth while the client writes a synthetic state dict of device
tensors (32 bf16 tensors; ``.cpu()`` makes each host copy, as on a GPU), streamed as the
client does against a host copy of the whole state dict first (the writer before streaming).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np

from tandem_client import TandemClient
from tandem_client.weights import write_safetensors
from tandem_generate.weight_files import TensorSpec, check_update, read_header
from tests.support.images import chat_body, data_url, png_bytes
from tools.bench_report_docs import table
from tools.servers import tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

Row = tuple[str, int, float, float]
"""(case, bytes, update seconds, plain-copy seconds)"""

PHASES = ("write", "start", "update", "finish", "first request", "same request again")


def timed(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of ``reps`` runs."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_seconds(src: Path, reps: int) -> float:
    dst = src.with_suffix(".copy")
    try:
        return timed(lambda: shutil.copyfile(src, dst), reps)
    finally:
        dst.unlink(missing_ok=True)


def door_phases(door: str, model: str, weights: Any, folder: Path, rep: int) -> list[float]:
    """Seconds of each of ``PHASES`` for one update through the door (as ``update_weights``
    runs it, call by call)."""
    times = []
    start = time.perf_counter()
    path = write_safetensors(weights, folder)
    times.append(time.perf_counter() - start)
    calls: tuple[tuple[str, dict[str, Any]], ...] = (
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": {"path": path.name}}),
        ("/finish_weight_update", {"weight_version": f"phases-{rep}"}),
    )
    try:
        for route, body in calls:
            start = time.perf_counter()
            httpx.post(f"{door}{route}", json=body, timeout=600).raise_for_status()
            times.append(time.perf_counter() - start)
    finally:
        path.unlink(missing_ok=True)
    chat = chat_body(model, [data_url(png_bytes(seed=rep))], temperature=0.0, max_tokens=8)
    for _ in range(2):
        start = time.perf_counter()
        httpx.post(f"{door}/v1/chat/completions", json=chat, timeout=600).raise_for_status()
        times.append(time.perf_counter() - start)
    return times


def tiny_model(reps: int) -> tuple[list[Row], list[list[float]]]:
    """The rows of (a), and each phase's seconds per rep."""
    from safetensors.torch import load_file

    model = str(ensure_model("qwen2-vl"))
    weights = load_file(str(Path(model) / "model.safetensors"))
    folder = Path(tempfile.mkdtemp(prefix="tandem-bench-weights-"))
    render = tandem_render(model)
    nodes = [tandem_generate(model, str(folder)) for _ in range(2)]
    front = None
    try:
        render.wait_healthy(300)
        for node in nodes:
            node.wait_healthy(600)
        front = tandem_front(model, render.url, [n.url for n in nodes], "--enable-control-routes")
        front.wait_healthy(120)
        seconds = []
        # One node, both nodes from the client itself, both through the door.
        for render_url, generate in (
            (render.url, nodes[0].url),
            (render.url, [n.url for n in nodes]),
            (front.url, front.url),
        ):
            with TandemClient(render_url, generate, weight_dir=folder) as client:
                client.update_weights(weights, version="warm-up")
                seconds.append(timed(lambda: client.update_weights(weights, version="b"), reps))
        phases = [door_phases(front.url, model, weights, folder, rep) for rep in range(reps)]
        sample = write_safetensors(weights, folder)
        size = sample.stat().st_size
        baseline = copy_seconds(sample, reps)
    finally:
        for server in (render, *nodes, *([front] if front else [])):
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    cases = ("one generate node", "client -> 2 generate nodes", "door -> 2 generate nodes")
    rows = [
        (f"tiny Qwen2-VL, every tensor, {case}", size, t, baseline)
        for case, t in zip(cases, seconds, strict=True)
    ]
    return rows, phases


def synthetic(total_bytes: int, reps: int) -> tuple[int, float, float]:
    import torch
    from safetensors.torch import load_file

    n_tensors = 32
    per = total_bytes // n_tensors // 2  # bf16 elements per tensor
    rows = 4096
    shape = (rows, per // rows)
    rng = np.random.default_rng(0)
    weights = {
        f"model.layers.{i}.mlp.weight": rng.standard_normal(shape, dtype=np.float32).astype(
            ml_dtypes.bfloat16
        )
        for i in range(n_tensors)
    }
    spec = {name: TensorSpec("bfloat16", shape) for name in weights}
    params = {name: torch.empty(shape, dtype=torch.bfloat16) for name in weights}
    folder = Path(tempfile.mkdtemp(prefix="tandem-bench-weights-"))

    def update() -> None:
        path = write_safetensors(weights, folder)  # trainer side
        check_update(read_header(path), spec, ("bfloat16",))  # API process
        check_update(read_header(path), spec, ("bfloat16",))  # engine worker, again
        staged = load_file(str(path))  # staged in the worker
        path.unlink()
        with torch.no_grad():
            for name, tensor in staged.items():  # load_weights' copy into the parameters
                params[name].copy_(tensor)

    try:
        seconds = timed(update, reps)
        sample = write_safetensors(weights, folder)
        size = sample.stat().st_size
        baseline = copy_seconds(sample, reps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return size, seconds, baseline


def writer_memory(total_bytes: int) -> list[tuple[str, int]]:
    """(mode, peak RSS growth in bytes) for the streamed writer and the host-copy baseline."""
    mib = max(1, total_bytes // 32 // 2**20)
    out = []
    with tempfile.TemporaryDirectory(prefix="tandem-bench-weights-") as folder:
        for mode in ("mapping", "iterable", "host-copy"):
            cmd = [sys.executable, "-m", "tests.support.writer_memory", "32", str(mib), folder]
            done = subprocess.run([*cmd, mode], capture_output=True, text=True, check=True)
            out.append((mode, int(done.stdout.split()[-1])))
    return out


def markdown(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(table(head, rows)).rstrip()


def transfer_table(rows: list[Row]) -> str:
    cells = []
    for name, size, seconds, baseline in rows:
        mb = size / 1e6
        cells.append(
            [
                name,
                f"{mb:.1f}",
                f"{seconds * 1e3:.0f} ms",
                f"{mb / seconds:.0f}",
                f"{baseline * 1e3:.1f} ms",
                f"{mb / baseline:.0f}",
                f"{seconds / baseline:.1f}x",
            ]
        )
    head = ["case", "MB", "update", "MB/s", "plain copy", "copy MB/s", "ratio"]
    return markdown(head, cells)


def phase_table(phases: list[list[float]]) -> str:
    cells = []
    for i, phase in enumerate(PHASES):
        ms = [rep[i] * 1e3 for rep in phases]
        cells.append([phase, f"{statistics.median(ms):.1f}", f"{min(ms):.1f}-{max(ms):.1f}"])
    return markdown(["phase (door -> 2 nodes)", "median ms", "range ms"], cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument(
        "--parts", choices=("all", "tiny", "synthetic", "writer-memory"), default="all"
    )
    args = parser.parse_args()
    rows: list[Row] = []
    phases: list[list[float]] = []
    if args.parts in ("all", "tiny"):
        tiny_rows, phases = tiny_model(args.reps)
        rows += tiny_rows
    if args.parts in ("all", "synthetic"):
        size = int(args.synthetic_gb * (1 << 30))
        rows.append(
            (f"synthetic {args.synthetic_gb:g} GB bf16, transfer path", *synthetic(size, args.reps))
        )
    if rows:
        print(f"Median of {args.reps}; ratio = update time / plain copy of the same file.\n")
        print(transfer_table(rows))
    if phases:
        print("\nOne update through the front door to two generate nodes, by phase:\n")
        print(phase_table(phases))
    if args.parts in ("all", "writer-memory"):
        size = int(args.synthetic_gb * (1 << 30))
        print(f"\nTrainer peak RSS growth writing {size / 2**30:g} GiB of device tensors:\n")
        grown = [[mode, f"{b / 2**20:.0f}"] for mode, b in writer_memory(size)]
        print(markdown(["writer", "peak RSS growth MiB"], grown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

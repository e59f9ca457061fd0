"""Weight-update benchmark: the tandem_file backend against a plain copy of the same bytes.

(a) The tiny Qwen2-VL model, every tensor, through a real generate server: the client's
``update_weights`` end to end (file written, header checks in the API process and the engine
worker, tensors staged, layerwise reload, caches reset), median of ``--reps``.
(b) A synthetic 1 GB set of bf16 tensors: no model here holds 1 GB of parameters, so this
times the same transfer path outside an engine: the client's file write, the header read and
check against a matching spec, the worker's ``load_file`` into CPU tensors and the copy into
preallocated parameter tensors (what ``load_weights`` does for a plain layer). Its layerwise
re-processing (CPU weight pre-packing) is not in (b); (a) shows its cost on a real model.
The baseline for both is ``shutil.copyfile`` of the file the update wrote (page cache hot on
both sides: this is memory bandwidth, not disk).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

from tandem_client import TandemClient
from tandem_client.weights import write_safetensors
from tandem_generate.weight_files import TensorSpec, check_update, read_header
from tools.servers import tandem_generate, tandem_render
from tools.tiny_models import ensure_model


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


def tiny_model(reps: int) -> tuple[int, float, float]:
    from safetensors.torch import load_file

    model = str(ensure_model("qwen2-vl"))
    weights = load_file(str(Path(model) / "model.safetensors"))
    folder = Path(tempfile.mkdtemp(prefix="tandem-bench-weights-"))
    render, generate = tandem_render(model), tandem_generate(model, str(folder))
    try:
        render.wait_healthy(300)
        generate.wait_healthy(600)
        with TandemClient(render.url, generate.url, weight_dir=folder) as client:
            client.update_weights(weights, version="warm-up")
            seconds = timed(lambda: client.update_weights(weights, version="bench"), reps)
        sample = write_safetensors(weights, folder)
        size = sample.stat().st_size
        baseline = copy_seconds(sample, reps)
    finally:
        render.stop()
        generate.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return size, seconds, baseline


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


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--parts", choices=("all", "tiny", "synthetic"), default="all")
    args = parser.parse_args()
    rows = []
    if args.parts in ("all", "tiny"):
        rows.append(("tiny Qwen2-VL, full update via server", *tiny_model(args.reps)))
    if args.parts in ("all", "synthetic"):
        size = int(args.synthetic_gb * (1 << 30))
        rows.append(
            (f"synthetic {args.synthetic_gb:g} GB bf16, transfer path", *synthetic(size, args.reps))
        )
    head = ("MB", "update s", "MB/s", "copy s", "copy MB/s", "ratio")
    print(f"{'case':44} " + " ".join(f"{h:>9}" for h in head))
    for name, size, seconds, baseline in rows:
        mb = size / 1e6
        print(
            f"{name:44} {mb:9.1f} {seconds:9.3f} {mb / seconds:9.0f} {baseline:9.3f} "
            f"{mb / baseline:9.0f} {seconds / baseline:9.1f}"
        )
    print("ratio = update time / plain copy time of the same file (lower is better)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

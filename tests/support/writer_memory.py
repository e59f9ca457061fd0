"""Peak extra host memory of ``write_safetensors`` over tensors that live on a device.

Run as ``python -m tests.support.writer_memory COUNT MIB FOLDER MODE``: prints the bytes by
which the process's peak RSS grew while writing COUNT bf16 tensors of MIB MiB each, given as a
``mapping`` (a state dict), a one-pass ``iterable``, or (``host-copy``, the baseline) first
copied to host memory whole, as the writer did before it streamed. A device tensor is played by
an object whose dtype and shape are known without a copy and whose ``.cpu()`` makes the host
copy, as a CUDA tensor's does (no GPU here).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tandem_client.weights import as_array, write_safetensors


class DeviceTensor:
    def __init__(self, numel: int, value: float) -> None:
        self.shape, self.dtype, self.value = torch.Size((numel,)), torch.bfloat16, value

    def detach(self) -> DeviceTensor:
        return self

    def cpu(self) -> torch.Tensor:
        return torch.full(self.shape, self.value, dtype=self.dtype)


def peak_rss() -> int:
    """This process's peak RSS in bytes: the kernel's high-water mark of its own memory map.

    Not ``getrusage``'s ``ru_maxrss``: Linux carries that over from the parent through fork and
    exec, so under a parent that once held more (a test session, a benchmark), the growth read
    0 whatever the writer did."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def peak_growth(count: int, mib: int, folder: str, mode: str) -> int:
    weights: Any = {f"layer.{i}.weight": DeviceTensor(mib * 2**19, i) for i in range(count)}
    torch.full((1,), 0.0, dtype=torch.bfloat16)  # torch's own first-use allocations, before
    base = peak_rss()
    if mode == "iterable":
        weights = iter(weights.items())
    elif mode == "host-copy":
        weights = {name: as_array(t) for name, t in weights.items()}
    path = write_safetensors(weights, folder)
    path.unlink()
    return peak_rss() - base


if __name__ == "__main__":
    count, mib, folder, mode = sys.argv[1:5]
    print(peak_growth(int(count), int(mib), folder, mode))

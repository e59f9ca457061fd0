"""The client's safetensors writer: what it writes is what safetensors (the engine) reads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tandem_client.weights import write_safetensors

ROOT = Path(__file__).resolve().parents[3]


def test_numpy_and_torch_tensors_bf16_included_read_back_exactly(tmp_path):
    g = torch.Generator().manual_seed(3)
    weights = {
        "a.bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "b.f32": torch.randn(4, generator=g),
        "c.np_bf16": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
        "d.i64": np.arange(7, dtype=np.int64),
        "e.empty": np.zeros((0, 4), dtype=np.float16),
        "f.strided": torch.randn(4, 6, generator=g).t(),  # not contiguous
        "g.bool": np.array([True, False, True]),
    }
    path = write_safetensors(weights, tmp_path)
    assert path.parent == tmp_path and not list(tmp_path.glob("*.partial"))
    got = load_file(str(path))
    assert got["a.bf16"].dtype == torch.bfloat16 and torch.equal(got["a.bf16"], weights["a.bf16"])
    assert torch.equal(got["b.f32"], weights["b.f32"])
    assert got["c.np_bf16"].dtype == torch.bfloat16
    assert got["c.np_bf16"].float().tolist() == [[0, 1, 2], [3, 4, 5]]
    assert got["d.i64"].tolist() == list(range(7))
    assert got["e.empty"].shape == (0, 4)
    assert torch.equal(got["f.strided"], weights["f.strided"])
    assert got["g.bool"].tolist() == [True, False, True]


def test_unsendable_dtypes_and_empty_updates_are_refused(tmp_path):
    with pytest.raises(ValueError):
        write_safetensors({"x": np.zeros(2, dtype=np.complex64)}, tmp_path)
    with pytest.raises(ValueError):
        write_safetensors({}, tmp_path)


def test_fp8_and_unsigned_tensors_read_back_exactly(tmp_path):
    g = torch.Generator().manual_seed(5)
    weights = {
        "a.e4m3": torch.randn(6, 4, generator=g).to(torch.float8_e4m3fn),
        "b.e5m2": torch.randn(3, generator=g).to(torch.float8_e5m2),
        "c.np_e4m3": np.linspace(-2, 2, 8, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
        "d.u16": torch.arange(5, dtype=torch.int32).to(torch.uint16),
        "e.u32": np.arange(4, dtype=np.uint32),
    }
    got = load_file(str(write_safetensors(weights, tmp_path)))
    for name in ("a.e4m3", "b.e5m2", "d.u16"):
        assert got[name].dtype == weights[name].dtype
        assert torch.equal(got[name].view(torch.uint8), weights[name].view(torch.uint8)), name
    assert got["c.np_e4m3"].dtype == torch.float8_e4m3fn
    assert got["c.np_e4m3"].float().tolist() == weights["c.np_e4m3"].astype(np.float32).tolist()
    assert got["e.u32"].tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("count", [3, 3000])  # 3000 entries outgrow the header's kept space
def test_a_one_pass_iterable_is_written_whole(tmp_path, count):
    def tensors():
        for i in range(count):
            yield (
                f"model.layers.{i}.a_rather_long_parameter_name.weight",
                torch.full((2,), float(i)),
            )

    got = load_file(str(write_safetensors(tensors(), tmp_path)))
    assert len(got) == count
    assert (
        got[f"model.layers.{count - 1}.a_rather_long_parameter_name.weight"].tolist()
        == [count - 1] * 2
    )
    assert [p.suffix for p in tmp_path.iterdir()] == [".safetensors"]


@pytest.mark.parametrize("mode", ["mapping", "iterable"])
def test_device_tensors_come_to_host_memory_one_at_a_time(tmp_path, mode):
    """Writing 16 device tensors of 32 MiB grows the trainer's peak RSS by about one of them
    (a host copy of all of them would be 512 MiB)."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.writer_memory", "16", "32", str(tmp_path), mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert int(out.stdout.split()[-1]) < 4 * 32 * 2**20, out.stdout


def test_the_memory_measure_sees_a_host_copy_under_a_parent_that_held_more(tmp_path):
    """The measure behind the test above and `make bench-weights` counts the writer's own
    peak: a host copy of 16 x 32 MiB shows as about 512 MiB even when the process that started
    it once held 768 MiB (the kernel's ``ru_maxrss`` carries the parent's peak into the child,
    which read as no growth at all)."""
    parent = (
        "import subprocess, sys; held = b'x' * (768 << 20); "
        "print(subprocess.run([sys.executable, '-m', 'tests.support.writer_memory', '16', "
        f"'32', {str(tmp_path)!r}, 'host-copy'], capture_output=True, text=True, "
        "check=True).stdout)"
    )
    out = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert int(out.stdout.split()[-1]) > 15 * 32 * 2**20, out.stdout

"""The client's safetensors writer: what it writes is what safetensors (the engine) reads."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tandem_client.weights import write_safetensors


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

"""Weight-update files checked without an engine: hostile headers, paths, the layer rule."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tandem_client.weights import write_safetensors
from tandem_generate.weight_files import (
    TensorSpec,
    WeightFileRefused,
    check_update,
    confine,
    layer_group,
    read_header,
)

MODEL = {
    "lm_head.weight": TensorSpec("bfloat16", (8, 4)),
    "model.layers.0.self_attn.q_proj.weight": TensorSpec("bfloat16", (4, 4)),
    "model.layers.0.self_attn.k_proj.weight": TensorSpec("bfloat16", (2, 4)),
    "model.layers.1.mlp.up_proj.weight": TensorSpec("bfloat16", (4, 4)),
}


def raw(path, header: dict, data: bytes = b"", length: int | None = None):
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head) if length is None else length) + head + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        ({}, b"", 10**12, "header length"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"1234", None, "offsets"),
        ({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"12345678", None, "byte"),
        ({"t": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"12345678", None, "dtype"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"", None, "shape"),
        ({"t": [1, 2]}, b"", None, "malformed"),
    ],
)
def test_hostile_headers_are_refused(tmp_path, header, data, length, message):
    path = raw(tmp_path / "x.safetensors", header, data, length)
    with pytest.raises(WeightFileRefused, match=message):
        read_header(path)


def test_short_and_non_json_files_are_refused(tmp_path):
    (tmp_path / "short").write_bytes(b"abc")
    with pytest.raises(WeightFileRefused):
        read_header(tmp_path / "short")
    (tmp_path / "junk").write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(WeightFileRefused, match="JSON"):
        read_header(tmp_path / "junk")


def test_the_clients_file_reads_back(tmp_path):
    path = write_safetensors({"a": np.zeros((2, 3), np.float32)}, tmp_path)
    assert read_header(path) == {"a": TensorSpec("float32", (2, 3))}


def test_paths_are_confined_to_the_folder(tmp_path):
    folder = tmp_path / "w"
    folder.mkdir()
    (folder / "ok.safetensors").write_bytes(b"x")
    (tmp_path / "out.safetensors").write_bytes(b"x")
    (folder / "link").symlink_to(tmp_path / "out.safetensors")
    assert confine("ok.safetensors", folder) == folder / "ok.safetensors"
    assert confine(str(folder / "ok.safetensors"), folder) == folder / "ok.safetensors"
    for bad in ("../out.safetensors", str(tmp_path / "out.safetensors"), "link", ".", ""):
        with pytest.raises(WeightFileRefused) as refused:
            confine(bad, folder)
        assert refused.value.kind == "path"
    with pytest.raises(WeightFileRefused) as refused:
        confine("ok.safetensors", None)
    assert refused.value.kind == "path"
    with pytest.raises(WeightFileRefused) as refused:
        confine("missing.safetensors", folder)
    assert refused.value.kind == "content"


def test_layer_groups():
    assert layer_group("model.layers.3.self_attn.q_proj.weight") == "model.layers.3"
    assert layer_group("visual.merger.mlp.0.bias") == "visual.merger.mlp.0"
    assert layer_group("lm_head.weight") == "lm_head"
    assert layer_group("weight") == "weight"


def test_updates_are_checked_against_the_model():
    check_update({"lm_head.weight": TensorSpec("bfloat16", (8, 4))}, MODEL)
    check_update({"lm_head.weight": TensorSpec("float32", (8, 4))}, MODEL, ("float32",))
    layer0 = {n: s for n, s in MODEL.items() if n.startswith("model.layers.0.")}
    check_update(layer0, MODEL)
    refused = {
        "unknown": {"lm_head.bias": TensorSpec("bfloat16", (8,))},
        "shape": {"lm_head.weight": TensorSpec("bfloat16", (4, 8))},
        "dtype": {"lm_head.weight": TensorSpec("float16", (8, 4))},
        "whole": {"model.layers.0.self_attn.q_proj.weight": TensorSpec("bfloat16", (4, 4))},
        "empty": {},
    }
    for update in refused.values():
        with pytest.raises(WeightFileRefused):
            check_update(update, MODEL)

"""Weight-update files checked without an engine: hostile headers, paths, the layer rule."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from tandem_client.weights import write_safetensors
from tandem_generate.weight_files import (
    WEIGHT_DTYPES,
    TensorSpec,
    WeightFileRefused,
    check_update,
    checkpoint_spec,
    confine,
    layer_group,
    model_folder,
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
        ({"t": {"dtype": "X9", "shape": [1], "data_offsets": [0, 8]}}, b"12345678", None, "X9"),
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


def test_every_dtype_the_engine_loads_is_read_with_its_size():
    """The table is safetensors' own (the engine loads update files with it), FP8 included."""
    import torch
    from safetensors.torch import _TYPES

    assert set(WEIGHT_DTYPES) == set(_TYPES)
    for tag, dtype in _TYPES.items():
        assert WEIGHT_DTYPES[tag] == (str(dtype).removeprefix("torch."), dtype.itemsize), tag
    assert torch.float8_e4m3fn in _TYPES.values()


def test_an_fp8_checkpoint_is_read_and_checked(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file(
        {"w": torch.zeros(4, 8).to(torch.float8_e4m3fn), "s": torch.ones(4)},
        str(tmp_path / "model.safetensors"),
    )
    spec = checkpoint_spec(tmp_path)
    assert spec == {"w": TensorSpec("float8_e4m3fn", (4, 8)), "s": TensorSpec("float32", (4,))}
    check_update({"w": TensorSpec("float8_e4m3fn", (4, 8))}, {"w": spec["w"]})


def test_a_model_that_cannot_be_read_is_refused_as_the_models_fault(tmp_path):
    with pytest.raises(WeightFileRefused) as refused:
        checkpoint_spec(tmp_path)  # no checkpoint at all
    assert refused.value.kind == "model"
    raw(
        tmp_path / "model.safetensors",
        {"t": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}},
        b"1",
    )
    with pytest.raises(WeightFileRefused, match="X9") as refused:
        checkpoint_spec(tmp_path)
    assert refused.value.kind == "model"
    with pytest.raises(WeightFileRefused) as refused:
        model_folder("no-such-org/no-such-model")  # no local copy (the hub is offline here)
    assert refused.value.kind == "model"


@pytest.mark.vllm
@pytest.mark.anyio
async def test_updates_on_a_node_without_its_checkpoint_are_a_typed_409(tmp_path):
    from types import SimpleNamespace

    from tandem_generate.control import EngineControl
    from tandem_generate.errors import WeightCheckpointUnavailable

    folder = tmp_path / "w"
    folder.mkdir()
    write_safetensors({"lm_head.weight": np.zeros((8, 4), np.float32)}, folder)
    (name,) = [p.name for p in folder.iterdir()]
    model_config = SimpleNamespace(
        model="no-such-org/no-such-model",
        served_model_name="no-such-org/no-such-model",
        revision=None,
        dtype="float32",
    )
    engine = SimpleNamespace(
        llm=None,
        model_config=model_config,
        vllm_config=SimpleNamespace(weight_transfer_config=SimpleNamespace(backend="tandem_file")),
    )
    control = EngineControl(engine, str(folder))  # type: ignore[arg-type]
    with pytest.raises(WeightCheckpointUnavailable) as refused:
        control._checked_files({"path": name})
    assert refused.value.status_code == 409

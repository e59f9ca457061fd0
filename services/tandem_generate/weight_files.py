"""Weight-update files: safetensors headers read without loading, checked against the model.

Used on both sides of the file weight-transfer backend: by the API process before it asks the
engine for anything (so that a bad update is a typed 4xx), and by the engine worker again
before it stages a single tensor (the file may have changed in between). Imports neither
vLLM nor torch: a header is 8 bytes of length and a JSON object.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ABORT_UPDATE",
    "BACKEND",
    "MAX_HEADER_BYTES",
    "TensorSpec",
    "WeightFileRefused",
    "checkpoint_spec",
    "check_update",
    "confine",
    "layer_group",
    "model_folder",
    "read_header",
]

BACKEND = "tandem_file"
"""The weight-transfer backend name (``--weight-transfer-config '{"backend": "tandem_file"}'``)."""

ABORT_UPDATE = {"tandem_abort": True}
"""The ``update_info`` that ends an update under way without loading anything: every backend
refuses it as a chunk, and vLLM's worker ends its update when a chunk fails (``tandem_file``
also drops what it staged)."""

MAX_HEADER_BYTES = 64 * 1024 * 1024
"""Largest safetensors header read (a header only lists names, dtypes, shapes and offsets)."""

WEIGHT_DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1),
    "U8": ("uint8", 1),
    "I8": ("int8", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "U16": ("uint16", 2),
    "I16": ("int16", 2),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "U32": ("uint32", 4),
    "I32": ("int32", 4),
    "F32": ("float32", 4),
    "U64": ("uint64", 8),
    "I64": ("int64", 8),
    "F64": ("float64", 8),
    "C64": ("complex64", 8),
}
"""safetensors dtype tags a checkpoint may hold -> (the name torch and vLLM use, bytes per
element): every tag the safetensors package loads into torch (FP8 included, which
quantized checkpoints use); any other tag is refused, naming it."""

_INDEX = re.compile(r"^\d+$")


class WeightFileRefused(Exception):
    """An update file that must not be loaded; ``kind`` is ``path``, ``content``, or ``model``
    (the served model's own checkpoint, which updates are checked against, cannot be read)."""

    def __init__(self, message: str, kind: str = "content") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a safetensors file, as its header declares it."""

    dtype: str
    """The torch name of its dtype (``bfloat16``, ``float32``...)."""

    shape: tuple[int, ...]


def read_header(path: str | os.PathLike[str]) -> dict[str, TensorSpec]:
    """Name -> dtype and shape of every tensor in a safetensors file, checked for consistency
    (offsets inside the file, byte counts matching shapes); nothing but the header is read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) != 8:
                raise WeightFileRefused("not a safetensors file: shorter than its header length")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise WeightFileRefused("not a safetensors file: header length out of range")
            raw = f.read(n)
    except OSError as exc:
        raise WeightFileRefused(f"cannot read the update file: {exc.strerror}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightFileRefused("not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise WeightFileRefused("not a safetensors file: its header is not an object")
    data_bytes = size - 8 - n
    out: dict[str, TensorSpec] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry_spec(name, entry, data_bytes)
    return out


def _entry_spec(name: str, entry: object, data_bytes: int) -> TensorSpec:
    if not isinstance(entry, dict):
        raise WeightFileRefused(f"tensor {name[:200]!r}: malformed header entry")
    tag, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(tag, str) or tag not in WEIGHT_DTYPES:
        raise WeightFileRefused(
            f"tensor {name[:200]!r}: dtype {str(tag)[:20]!r} is not one safetensors loads "
            f"({', '.join(WEIGHT_DTYPES)})"
        )
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise WeightFileRefused(f"tensor {name[:200]!r}: malformed shape")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise WeightFileRefused(f"tensor {name[:200]!r}: data offsets outside the file")
    dtype, itemsize = WEIGHT_DTYPES[tag]
    numel = 1
    for d in shape:
        numel *= d
    if numel * itemsize != offsets[1] - offsets[0]:
        raise WeightFileRefused(f"tensor {name[:200]!r}: byte count does not match its shape")
    return TensorSpec(dtype, tuple(shape))


def checkpoint_spec(model_dir: str | os.PathLike[str]) -> dict[str, TensorSpec]:
    """Every tensor of the model's own safetensors checkpoint: the names, dtypes and shapes
    its ``load_weights`` is known to accept (it loaded exactly these at start-up). Refused
    with kind ``model`` when the checkpoint cannot be read."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightFileRefused(f"no safetensors checkpoint in {model_dir}", kind="model")
    spec: dict[str, TensorSpec] = {}
    for file in files:
        try:
            spec.update(read_header(file))
        except WeightFileRefused as exc:
            raise WeightFileRefused(
                f"the model's checkpoint {file.name}: {exc.message}", kind="model"
            ) from None
    return spec


def model_folder(model: str, revision: str | None = None) -> str:
    """The local folder of the served model: the model argument itself, or its copy in the
    Hugging Face cache (never downloaded here; vLLM fetched it at start-up). Refused with kind
    ``model`` when there is no local copy."""
    if os.path.isdir(model):
        return model
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception as exc:  # the hub client's errors differ by version; none is the caller's
        raise WeightFileRefused(
            f"the model {model[:200]!r} has no local copy to check updates against "
            f"({type(exc).__name__})",
            kind="model",
        ) from None


def confine(path: str, root: str | os.PathLike[str] | None) -> Path:
    """``path`` (relative to ``root``, or absolute) resolved, if it is a file inside ``root``;
    symbolic links are resolved first, so a link cannot lead out of the folder."""
    if root is None:
        raise WeightFileRefused("this server has no --weight-transfer-dir", kind="path")
    if not isinstance(path, str) or not path or "\x00" in path:
        raise WeightFileRefused("update_info.path must be a non-empty string", kind="path")
    base = Path(root).resolve()
    target = (base / path).resolve()
    if not target.is_relative_to(base) or target == base:
        raise WeightFileRefused(
            "update_info.path must name a file inside the weight-transfer folder", kind="path"
        )
    if not target.is_file():
        raise WeightFileRefused("update_info.path names no file in the weight-transfer folder")
    return target


def layer_group(name: str) -> str:
    """The unit an update must cover whole: everything up to the first numeric segment (one
    decoder layer or vision block), else the module (the name without its last segment).

    vLLM fuses checkpoint tensors of one layer (q/k/v into qkv_proj, gate/up into gate_up_proj)
    and re-processes a reloaded layer as a whole, so a layer sent in part would be rebuilt from
    missing data; whole layers never are."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if _INDEX.match(part):
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def check_update(
    update: Mapping[str, TensorSpec],
    model: Mapping[str, TensorSpec],
    serving_dtypes: Iterable[str] = (),
) -> None:
    """Refuse an update unless every tensor is one of the model's, with its shape and with the
    checkpoint's dtype (or a dtype the engine serves in), and every layer it touches is whole."""
    if not update:
        raise WeightFileRefused("the update file holds no tensors")
    dtypes_ok = set(serving_dtypes)
    unknown = [n for n in update if n not in model]
    if unknown:
        raise WeightFileRefused(
            f"{len(unknown)} tensor(s) the model does not have, e.g. {unknown[0][:200]!r}"
        )
    for name, got in update.items():
        want = model[name]
        if got.shape != want.shape:
            raise WeightFileRefused(
                f"tensor {name!r}: shape {list(got.shape)} but the model's is {list(want.shape)}"
            )
        if got.dtype != want.dtype and got.dtype not in dtypes_ok:
            raise WeightFileRefused(
                f"tensor {name!r}: dtype {got.dtype} but the model's is {want.dtype}"
            )
    touched = {layer_group(n) for n in update}
    missing = sorted(n for n in model if layer_group(n) in touched and n not in update)
    if missing:
        raise WeightFileRefused(
            f"layers must be sent whole: {len(missing)} tensor(s) of the layers in this update "
            f"are missing, e.g. {missing[0]!r}"
        )

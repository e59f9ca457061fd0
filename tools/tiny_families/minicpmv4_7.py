"""MiniCPM-V 4.7 (``openbmb/MiniCPM-V-4.7``): MiniCPM-V 4.6's tower, slicing processor and Qwen3.5
hybrid language model (``tools.tiny_families.minicpmv4_6``), with "canvas" M-RoPE: each view's
tokens take 2D positions on the image, its ``<image>``/``<slice>`` markers and the newline
between slice rows pinned at the canvas edges, so the config names those tokens' ids."""

from __future__ import annotations

import json
from pathlib import Path

from tools.tiny_families import common, minicpmv4_6, qwen3_5


def build(out: Path) -> None:
    ids = minicpmv4_6.write_tokenizer(out)
    minicpmv4_6.processor_files(out, "MiniCPMV4_7Processor")
    canvas = {
        "image_start_id": ids["<image>"],
        "image_end_id": ids["</image>"],
        "slice_start_id": ids["<slice>"],
        "slice_end_id": ids["</slice>"],
        "newline_id": _newline_id(out),
    }
    config = minicpmv4_6.config(ids, "MiniCPMV4_7Config", **canvas)
    common.save_random_model(config, out, qwen3_5.generation(ids))


def _newline_id(out: Path) -> int:
    """The id ``"\\n"`` alone encodes to (slice rows end with it)."""
    from tokenizers import Tokenizer

    raw = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    newline: list[int] = Tokenizer.from_str(json.dumps(raw)).encode("\n").ids
    return newline[0]

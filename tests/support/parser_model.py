"""The tiny Qwen2-VL with tool-call (hermes) and reasoning markup in its vocabulary.

vLLM's reasoning parsers look their start and end tokens up in the vocabulary (and refuse a
tokenizer without them), and the tiny models' trained vocabulary has none: this copy adds them
as ordinary added tokens (ids 1024.., as Qwen's own checkpoints add them) to the tokenizer only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tools.tiny_models import ensure_model

__all__ = ["MARKUP", "PARSER_FLAGS", "parser_model"]

MARKUP = ("<tool_call>", "</tool_call>", "<think>", "</think>")
PARSER_FLAGS = (
    "--tool-call-parser",
    "hermes",
    "--enable-auto-tool-choice",
    "--reasoning-parser",
    "deepseek_r1",
)
"""The options both render servers (ours, upstream's) take in the parity tests."""


def parser_model(root: Path) -> Path:
    """A copy of the tiny Qwen2-VL in ``root`` whose tokenizer holds :data:`MARKUP`."""
    src = ensure_model("qwen2-vl")
    out = root / "qwen2-vl-markup"
    if out.exists():
        return out
    shutil.copytree(src, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    config = json.loads((out / "tokenizer_config.json").read_text())
    next_id = 1 + max(t["id"] for t in tokenizer["added_tokens"])
    for i, content in enumerate(MARKUP, start=next_id):
        flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
        tokenizer["added_tokens"].append({"id": i, "content": content, **flags, "special": False})
        config["added_tokens_decoder"][str(i)] = {"content": content, **flags, "special": False}
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out

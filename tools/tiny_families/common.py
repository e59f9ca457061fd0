"""What every family's builder shares: the tokenizer, the JSON files, the seeded weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import tiny_models

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The text sizes of every tiny model (tools.tiny_models), so all families cost the same to run.
HIDDEN = tiny_models.HIDDEN
TEXT_LAYERS = tiny_models.TEXT_LAYERS
HEADS = tiny_models.HEADS
KV_HEADS = tiny_models.KV_HEADS
HEAD_DIM = tiny_models.HEAD_DIM
INTERMEDIATE = tiny_models.INTERMEDIATE
MAX_POSITIONS = tiny_models.MAX_POSITIONS
VISION_WIDTH = tiny_models.VISION_WIDTH
VISION_HEADS = tiny_models.VISION_HEADS
VOCAB_SIZE = tiny_models.VOCAB_SIZE
DTYPE = tiny_models.DTYPE
SEED = tiny_models.SEED
OPENAI_CLIP_MEAN = tiny_models.OPENAI_CLIP_MEAN
OPENAI_CLIP_STD = tiny_models.OPENAI_CLIP_STD


def text_sizes() -> dict[str, int]:
    """The language model's sizes, the same in every family (its config adds its own keys)."""
    return {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": TEXT_LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": MAX_POSITIONS,
    }


def vision_sizes() -> dict[str, int]:
    """The vision tower's sizes (one layer), the same in every family."""
    return {
        "hidden_size": VISION_WIDTH,
        "intermediate_size": 2 * VISION_WIDTH,
        "num_hidden_layers": 1,
        "num_attention_heads": VISION_HEADS,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer(
    out: Path,
    specials: tuple[str, ...],
    chat_template: str,
    config: dict[str, Any],
    *,
    vocab_size: int = VOCAB_SIZE,
) -> dict[str, int]:
    """Train the shared byte-level BPE with ``specials`` appended (the last ids) and write
    ``tokenizer.json``, ``tokenizer_config.json`` (``config`` on top of the common keys: name the
    family's bos/eos/pad tokens and its ``tokenizer_class`` there) and ``chat_template.jinja``.
    Returns each special token's id."""
    tok = tiny_models.train_tokenizer(specials, vocab_size=vocab_size)
    ids = {t: tok.token_to_id(t) for t in specials}
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    base: dict[str, Any] = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": tiny_models.added_tokens_decoder(ids),
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    write_json(out / "tokenizer_config.json", base | config)
    (out / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return ids


def save_random_model(
    config: PreTrainedConfig,
    out: Path,
    generation: dict[str, Any],
    *,
    auto_class: str = "AutoModelForImageTextToText",
    rename: Callable[[str], str] | None = None,
) -> None:
    """Seeded random weights for ``config`` saved to ``out`` with ``generation`` as the
    generation config; ``rename`` maps transformers' saved weight names to the published layout
    (the one vLLM's loader reads) where the two differ."""
    import torch
    import transformers
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    auto = getattr(transformers, auto_class)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = auto.from_config(config, dtype=getattr(torch, DTYPE))
    model.generation_config = GenerationConfig(**generation)  # type: ignore[no-untyped-call]
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    try:
        model.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated upstream
    if rename is not None:
        rename_weights(out / "model.safetensors", rename)


def rename_weights(path: Path, rename: Callable[[str], str]) -> None:
    """Rewrite a safetensors file with every tensor name passed through ``rename``."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    save_file({rename(k): v for k, v in tensors.items()}, path, metadata={"format": "pt"})


def llava_hf_layout(name: str) -> str:
    """A weight name as transformers 5 saves a LLaVA-style model -> the published llava-hf (and
    Gemma 3) layout, which vLLM's loaders read. transformers 5 already writes the language
    model, projector and ``image_newline`` there, but its CLIP/SigLIP tower lacks the
    ``vision_model.`` level."""
    for tower in ("vision_tower.", "model.vision_tower."):
        if name.startswith(tower):
            rest = name[len(tower) :]
            if not rest.startswith("vision_model."):
                rest = "vision_model." + rest
            return "vision_tower." + rest
    return name


def mark_plain(out: Path, tokens: tuple[str, ...]) -> None:
    """Make ``tokens`` (written by ``write_tokenizer`` among its specials) plain added tokens:
    still single ids that text never splits, but kept when decoding skips special tokens (as
    the whitespace runs a SentencePiece vocabulary holds)."""
    from tokenizers import Tokenizer

    raw = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    for entry in raw["added_tokens"]:
        if entry["content"] in tokens:
            entry["special"] = False
    text = Tokenizer.from_str(json.dumps(raw)).to_str(pretty=True)
    (out / "tokenizer.json").write_text(text + "\n", encoding="utf-8")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    for entry in config["added_tokens_decoder"].values():
        if entry["content"] in tokens:
            entry["special"] = False
    write_json(out / "tokenizer_config.json", config)

"""GLM-OCR (``zai-org/GLM-OCR``): GLM-4.1V's layout (``tools.tiny_families.glm4v``) with the
CogViT tower (biased attention, q/k norms, a convolutional token downsampler) before a GLM-0.5B
language model, served through ``Glm46VProcessor`` and GLM-4.6V's image and video processors.

Its vocabulary holds GLM-4.5V's control tokens in the same order (``<|begin_of_image|>`` 10
after ``<|endoftext|>``, ``<|image|>`` 34 after), so the tiny one reuses that list. The published
multi-token-prediction layer is left out: vLLM loads it only as a speculative draft model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common, glm4v, glm4v_moe

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published generation config stops at these.
STOP_TOKENS = ("<|endoftext|>", "<|user|>")
PROCESSOR_CLASS = "Glm46VProcessor"


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out, glm4v_moe.SPECIALS, glm4v.CHAT_TEMPLATE, glm4v.TOKENIZER_CONFIG
    )
    glm4v.processor_files(out)
    _rename_processors(out)
    common.save_random_model(_config(ids), out, glm4v.generation(ids, STOP_TOKENS))


def _rename_processors(out: Path) -> None:
    """GLM-4.1V's processor configs with GLM-4.6V's classes, as GLM-OCR publishes them."""
    for name, key, cls in (
        ("preprocessor_config.json", "image_processor_type", "Glm46VImageProcessor"),
        ("video_preprocessor_config.json", "video_processor_type", "Glm46VVideoProcessor"),
    ):
        data = json.loads((out / name).read_text(encoding="utf-8"))
        common.write_json(out / name, data | {key: cls, "processor_class": PROCESSOR_CLASS})


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import GlmOcrConfig

    vision = glm4v.vision_config() | {"attention_bias": True}
    return GlmOcrConfig(
        text_config=glm4v.text_config(ids),
        vision_config=vision,
        **glm4v.token_ids(ids),
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )

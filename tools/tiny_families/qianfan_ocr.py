"""Qianfan-OCR (``baidu/Qianfan-OCR``): InternVL's layout (InternViT tower, pixel-shuffle MLP
connector) before a Qwen3 language model, in the published InternVL-chat format vLLM reads:
``vision_model.`` / ``mlp1.`` / ``language_model.`` weights and the chat config's tiling keys.
vLLM tiles and expands ``<image>`` itself (its InternVL processor); images only.

One tile is 224x224 here (448 published) so that a tile costs 64 placeholders, not 256; the
tiling (up to 12 tiles plus a thumbnail) is the published one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.tiny_families import common, internvl

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The InternVL-chat template: string turns in ChatML, vLLM puts ``<image>`` in the text.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = (*internvl.SPECIALS, "<think>", "</think>")
TILE = internvl.TILE
PATCH = internvl.PATCH


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "tokenizer_class": "Qwen2Tokenizer",
        },
    )
    generation = {"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]}
    common.save_random_model(_config(ids), out, generation, rename=_published_name)
    _published_config(out)


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import QianfanOCRConfig

    text = {
        "model_type": "qwen3",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "max_window_layers": common.TEXT_LAYERS,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "eos_token_id": ids["<|im_end|>"],
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }
    vision = {
        **common.vision_sizes(),
        "image_size": [TILE, TILE],
        "patch_size": [PATCH, PATCH],
        "attention_bias": True,
        "use_qk_norm": False,
        "norm_type": "layer_norm",
    }
    return QianfanOCRConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=internvl.TILE_TOKENS,
        downsample_ratio=internvl.DOWNSAMPLE,
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )


def _published_name(name: str) -> str:
    """transformers 5 saves back to the published names (its conversion mapping, reversed), but
    the reversed tower rule (``layers.`` -> ``encoder.layers.``) catches the language model's
    layers too; put those back."""
    wrong = "language_model.model.encoder.layers."
    if name.startswith(wrong):
        return "language_model.model.layers." + name[len(wrong) :]
    return name


def _published_config(out: Path) -> None:
    """Add the InternVL-chat keys vLLM's ``QianfanOCRConfig`` reads (tiling, pixel shuffle,
    the tower's ``qkv_bias``) beside transformers' own."""
    path = out / "config.json"
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    config |= {
        "dynamic_image_size": True,
        "force_image_size": TILE,
        "max_dynamic_patch": 12,
        "min_dynamic_patch": 1,
        "pad2square": False,
        "ps_version": "v2",
        "select_layer": -1,
        "template": "internvl2_5",
        "use_thumbnail": True,
    }
    config["vision_config"] |= {
        "image_size": TILE,
        "patch_size": PATCH,
        "qkv_bias": True,
        "qk_normalization": False,
        "initializer_factor": 0.1,
    }
    common.write_json(path, config)

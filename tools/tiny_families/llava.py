"""Tiny LLaVA-1.5, shaped as ``llava-hf/llava-1.5-7b-hf``: a CLIP tower (its second-to-last
layer, CLS dropped), a two-layer MLP projector and a Llama language model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.tiny_families import common

# The published chat template: every image of a turn first, then its text, "ASSISTANT:" to answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
# Llama's specials, then LLaVA's image token and pad (32000 and 32001 in the real vocabulary).
SPECIALS = ("<unk>", "<s>", "</s>", "<image>", "<pad>")
# 112 px at patch 14: an 8x8 grid, 64 image tokens per image (the real 336 px gives 576).
IMAGE_SIZE = 112
PATCH = 14


def clip_vision_config() -> dict[str, object]:
    """The one-layer CLIP tower of the tiny LLaVA and LLaVA-NeXT models."""
    return {
        "model_type": "clip_vision_model",
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "projection_dim": common.VISION_WIDTH,
        "hidden_act": "quick_gelu",
    }


def llama_text_config(model_type: str, ids: dict[str, int]) -> dict[str, object]:
    """The tiny Llama/Mistral language model with Llama's bos/eos and LLaVA's pad."""
    return {
        "model_type": model_type,
        **common.text_sizes(),
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }


def llama_tokenizer_config() -> dict[str, object]:
    """Llama's tokenizer settings: ``<s>`` prepended to every encoding."""
    return {
        "add_bos_token": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "padding_side": "left",
    }


def clip_image_processor(processor_class: str) -> dict[str, object]:
    return {
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": common.OPENAI_CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": common.OPENAI_CLIP_STD,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": IMAGE_SIZE},
    }


def build(out_dir: Path) -> None:
    from transformers import LlavaConfig

    ids = common.write_tokenizer(out_dir, SPECIALS, CHAT_TEMPLATE, llama_tokenizer_config())
    common.write_json(out_dir / "preprocessor_config.json", clip_image_processor("LlavaProcessor"))
    common.write_json(
        out_dir / "processor_config.json",
        {
            "image_token": "<image>",
            # The CLS embedding the processor counts and the "default" strategy drops.
            "num_additional_image_tokens": 1,
            "patch_size": PATCH,
            "processor_class": "LlavaProcessor",
            "vision_feature_select_strategy": "default",
        },
    )
    # Published config keys transformers 5 still writes but no longer declares.
    published: dict[str, Any] = {"pad_token_id": ids["<pad>"]}
    config = LlavaConfig(
        vision_config=clip_vision_config(),
        text_config=llama_text_config("llama", ids),
        image_token_index=ids["<image>"],
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=(IMAGE_SIZE // PATCH) ** 2,
        dtype=common.DTYPE,
        **published,
    )
    common.save_random_model(
        config,
        out_dir,
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]},
        rename=common.llava_hf_layout,
    )

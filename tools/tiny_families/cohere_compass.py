"""Cohere Compass (``CohereLabs/North-Micro-Vision-Instruct``): a Cohere text model with M-RoPE, a
Qwen3-VL-style native-resolution vision tower with deepstack mergers, ``CohereCompassProcessor``.

vLLM serves it for images only (the processor also takes videos). Images are bounded far below
the published size (at most 1024 placeholders). The published chat template is not at hand
offline: the tiny model uses the Command A template (Cohere2-Vision's) with Compass's image
placeholder, ``<|VISION_START|><|IMAGE_PAD|><|VISION_END|>``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import cohere2_vision, common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# Command A's control tokens, then Compass's vision ones (the published vocabulary's order).
SPECIALS = (
    *cohere2_vision.SPECIALS[:21],
    "<|VISION_START|>",
    "<|VISION_END|>",
    "<|IMAGE_PAD|>",
    "<|VIDEO_PAD|>",
)

CHAT_TEMPLATE = cohere2_vision.CHAT_TEMPLATE.replace(
    "<|IMG_PATCH|>", "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>"
)

PATCH = 16
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE
MIN_PIXELS = FACTOR * FACTOR * 4
IMAGE_MAX_PIXELS = FACTOR * FACTOR * 1024
VIDEO_MAX_PIXELS = FACTOR * FACTOR * 4096


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<BOS_TOKEN>",
            "eos_token": "<|END_OF_TURN_TOKEN|>",
            "pad_token": "<PAD>",
            "unk_token": "<UNK>",
            "cls_token": "<CLS>",
            "sep_token": "<SEP>",
            "mask_token": "<MASK_TOKEN>",
            "padding_side": "left",
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<BOS_TOKEN>"],
            "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"],
            "pad_token_id": ids["<PAD>"],
        },
    )


def _processor_files(out: Path) -> None:
    shared = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": common.OPENAI_CLIP_MEAN,
        "image_std": common.OPENAI_CLIP_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "processor_class": "CohereCompassProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": TEMPORAL,
    }
    common.write_json(
        out / "preprocessor_config.json",
        shared
        | {
            "image_processor_type": "CohereCompassImageProcessor",
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS},
        },
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        shared
        | {
            "video_processor_type": "CohereCompassVideoProcessor",
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        },
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import CohereCompassConfig

    text = {
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "layer_norm_eps": 1e-5,
        "logit_scale": None,
        "layer_types": ["full_attention"] * common.TEXT_LAYERS,
        # Per layer type, as published; the M-RoPE sections sum to half the head dim.
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            }
        },
        "bos_token_id": ids["<BOS_TOKEN>"],
        "eos_token_id": ids["<|END_OF_TURN_TOKEN|>"],
        "pad_token_id": ids["<PAD>"],
        # vLLM's Compass language model has no lm_head of its own: it ties it.
        "tie_word_embeddings": True,
        "dtype": common.DTYPE,
    }
    vision = {
        "depth": 1,
        "hidden_size": common.VISION_WIDTH,
        "intermediate_size": 2 * common.VISION_WIDTH,
        "num_heads": common.VISION_HEADS,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "out_hidden_size": common.HIDDEN,
        "num_position_embeddings": 256,
        "deepstack_visual_indexes": [0],
    }
    return CohereCompassConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|IMAGE_PAD|>"],
        video_token_id=ids["<|VIDEO_PAD|>"],
        vision_start_token_id=ids["<|VISION_START|>"],
        vision_end_token_id=ids["<|VISION_END|>"],
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )

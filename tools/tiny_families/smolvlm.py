"""Tiny SmolVLM2, shaped as ``HuggingFaceTB/SmolVLM2-256M-Video-Instruct``
(``SmolVLMForConditionalGeneration`` with ``SmolVLMProcessor``, which needs ``num2words``):
Idefics3's tiling (``tools.tiny_families.idefics3``: tiles of the tower's size plus a global
view, ``<row_r_col_c>`` tags, SmolLM2's tokens and template) with SmolVLM2's 16-pixel patches
shuffled by 4. vLLM serves it images only, so its video settings are written as published but
never exercised."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.tiny_families import common, idefics3

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# 128 px tiles of 16 px patches (8x8) shuffled by 4: 4 tokens per tile (the published 512 px
# tiles give 64); images are resized to at most 4x4 tiles before splitting, as published.
IMAGE_SIZE = 128
PATCH = 16
SCALE_FACTOR = 4
TOKENS_PER_TILE = (IMAGE_SIZE // PATCH) ** 2 // SCALE_FACTOR**2
TOKENIZER_CONFIG = {
    "bos_token": "<|im_start|>",
    "eos_token": "<end_of_utterance>",
    "pad_token": "<|im_end|>",
    "unk_token": "<|endoftext|>",
    "padding_side": "left",
}


def build(out_dir: Path) -> None:
    ids = common.write_tokenizer(
        out_dir, idefics3.SPECIALS, idefics3.CHAT_TEMPLATE, TOKENIZER_CONFIG
    )
    common.write_json(out_dir / "preprocessor_config.json", _preprocessor())
    common.write_json(
        out_dir / "processor_config.json",
        {"image_seq_len": TOKENS_PER_TILE, "processor_class": "SmolVLMProcessor"},
    )
    # transformers 5 writes SmolVLM in its published layout already (model.vision_model,
    # model.connector, model.text_model, lm_head).
    common.save_random_model(
        _config(ids),
        out_dir,
        {
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<end_of_utterance>"],
            "pad_token_id": ids["<|im_end|>"],
        },
    )


def _preprocessor() -> dict[str, Any]:
    """The published image processor config; its ``video_sampling`` configures the video
    processor too (SmolVLM2 ships no separate video config)."""
    return {
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": idefics3.SIGLIP_NORM,
        "image_processor_type": "SmolVLMImageProcessor",
        "image_std": idefics3.SIGLIP_NORM,
        "max_image_size": {"longest_edge": IMAGE_SIZE},
        "processor_class": "SmolVLMProcessor",
        "resample": 1,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 4 * IMAGE_SIZE},
        "video_sampling": {
            "fps": 1,
            "max_frames": 64,
            "video_size": {"longest_edge": IMAGE_SIZE},
        },
    }


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import SmolVLMConfig

    vision = {
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
    }
    text = {
        "model_type": "llama",
        **common.text_sizes(),
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<end_of_utterance>"],
        "pad_token_id": ids["<|im_end|>"],
        "dtype": common.DTYPE,
    }
    return SmolVLMConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<image>"],
        scale_factor=SCALE_FACTOR,
        pad_token_id=ids["<|im_end|>"],
        dtype=common.DTYPE,
    )

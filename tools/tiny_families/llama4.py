"""Tiny Llama 4, shaped as ``meta-llama/Llama-4-Scout-17B-16E-Instruct``: its own vision tower
(an unfold patch embedding, 2D-rotary ViT and a pixel-shuffle adapter) reading each image as a
global view plus up to 16 square tiles, each tile's patches framed as
``<|image_start|>`` [tiles with separators] ``<|image|>`` [global] ``<|image_end|>``, and the
Llama 4 language model: every layer a mixture of experts (top-1 routing beside a shared
expert), rotary layers with QK-norm and chunked local attention, and NoPE global layers with
attention temperature tuning."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published specials the template and the processor use, in the published order.
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|finetune_right_pad|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|patch|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
    "<|image|>",
)
# 112 px tiles at patch 14: 8x8 patches, pixel-shuffled (ratio 0.5) to 16 tokens per tile (the
# real 336 px tiles give 144). An image takes up to 16 tiles plus its global view, as published.
TILE = 112
PATCH = 14
MAX_TILES = 16
SHUFFLE_RATIO = 0.5
SIGLIP_NORM = [0.5, 0.5, 0.5]
# Scout routes each token to 1 of 16 experts beside its shared expert.
EXPERTS = 4
# Chunks short enough that the tests' image prompts span several (the real chunk is 8192).
ATTENTION_CHUNK = 128


def build(out_dir: Path) -> None:
    from transformers import Llama4Config

    # Llama4Processor's default template is the one the published checkpoint ships.
    from transformers.models.llama4.processing_llama4 import chat_template

    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        chat_template,
        {
            "add_bos_token": True,
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot|>",
            "pad_token": "<|finetune_right_pad|>",
            "padding_side": "left",
        },
    )
    _write_processor_configs(out_dir)
    eos = [ids["<|end_of_text|>"], ids["<|eom|>"], ids["<|eot|>"]]
    config = Llama4Config(
        vision_config=_vision_config(),
        text_config=_text_config(ids, eos),
        boi_token_index=ids["<|image_start|>"],
        eoi_token_index=ids["<|image_end|>"],
        image_token_index=ids["<|image|>"],
        dtype=common.DTYPE,
    )
    # transformers 5 writes Llama 4 in its published layout already (language_model.model,
    # language_model.lm_head, vision_model, multi_modal_projector, the experts' fused
    # gate_up_proj and down_proj tensors).
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": eos,
            "pad_token_id": ids["<|finetune_right_pad|>"],
        },
    )


def _write_processor_configs(out_dir: Path) -> None:
    common.write_json(
        out_dir / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": SIGLIP_NORM,
            "image_processor_type": "Llama4ImageProcessorFast",
            "image_std": SIGLIP_NORM,
            "max_patches": MAX_TILES,
            "processor_class": "Llama4Processor",
            "resample": 2,
            "rescale_factor": 1 / 255,
            "resize_to_max_canvas": False,
            "size": {"height": TILE, "width": TILE},
        },
    )
    common.write_json(
        out_dir / "processor_config.json",
        {
            "fake_image_token": "<|image|>",
            "image_token": "<|image|>",
            "patch_size": PATCH,
            "pixel_shuffle_ratio": SHUFFLE_RATIO,
            "processor_class": "Llama4Processor",
        },
    )


def _vision_config() -> dict[str, object]:
    # The adapter's first layer reads the pixel-shuffled patches: 1 / ratio**2 = 4 times the
    # tower's width (the real 1408 -> 5632).
    return {
        "model_type": "llama4_vision_model",
        **common.vision_sizes(),
        "intermediate_size": 4 * common.VISION_WIDTH,
        "image_size": TILE,
        "patch_size": PATCH,
        "pixel_shuffle_ratio": SHUFFLE_RATIO,
        "projector_input_dim": common.HIDDEN,
        "projector_output_dim": common.HIDDEN,
        "vision_output_dim": common.HIDDEN,
        "vision_feature_select_strategy": "default",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "dtype": common.DTYPE,
    }


def _text_config(ids: dict[str, int], eos: list[int]) -> dict[str, object]:
    return {
        "model_type": "llama4_text",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "intermediate_size_mlp": 2 * common.INTERMEDIATE,
        "num_local_experts": EXPERTS,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1,
        # A rotary (chunked) layer then a NoPE (global) one: the real one-in-four NoPE pattern cut
        # to two layers.
        "no_rope_layers": [1, 0],
        "attention_chunk_size": ATTENTION_CHUNK,
        "use_qk_norm": True,
        "attn_temperature_tuning": True,
        "floor_scale": 8192,
        "attn_scale": 0.1,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            # The real 8192 of its 10M positions; it must stay below the window here.
            "original_max_position_embeddings": common.MAX_POSITIONS // 4,
        },
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": eos,
        "pad_token_id": ids["<|finetune_right_pad|>"],
        "dtype": common.DTYPE,
    }

"""Tiny LFM2-VL, shaped as ``LiquidAI/LFM2-VL-450M`` (``Lfm2VlForConditionalGeneration`` with
``Lfm2VlProcessor``): a SigLIP2 NaFlex tower that takes each image at its own size (resized to
multiples of 32 px between 64 and 256 tokens, split into 512 px tiles past that), a pixel-unshuffle
MLP projector, and an LFM2 language model, a hybrid of gated short-convolution and attention
layers (vLLM serves it with a conv-state cache beside the KV cache)."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published template (chat_template.jinja): ChatML turns after the bos token, images as
# <image> sentinels the processor expands.
CHAT_TEMPLATE = (
    "{{bos_token}}{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}{{ '<image>' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)
# LFM2's specials, the image sentinel and the tile tags the processor writes (all of the real
# vocabulary's, for grids of up to max_tiles = 10).
TILE_TAGS = tuple(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11))
SPECIALS = (
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<image>",
    "<|image_start|>",
    "<|image_end|>",
    "<|img_thumbnail|>",
    *TILE_TAGS,
)
# The published processor: 16 px patches unshuffled 2x2 (one token per 32x32 px), 64 to 256
# tokens per image, larger images split into 512 px tiles (no thumbnail on the 450M). The tiny
# tower makes these sizes cheap, so they are kept as published.
PATCH = 16
DOWNSAMPLE = 2
MAX_IMAGE_TOKENS = 256
MAX_NUM_PATCHES = MAX_IMAGE_TOKENS * DOWNSAMPLE**2
SIGLIP_NORM = [0.5, 0.5, 0.5]
# SigLIP2 base's learned position grid (16x16, resized to each image's patch grid).
POSITION_PATCHES = 256


def build(out_dir: Path) -> None:
    from transformers import Lfm2VlConfig

    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<|startoftext|>",
            "eos_token": "<|im_end|>",
            "pad_token": "<|pad|>",
            "padding_side": "left",
        },
    )
    image_processor = {
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "downsample_factor": DOWNSAMPLE,
        "encoder_patch_size": PATCH,
        "image_mean": SIGLIP_NORM,
        "image_processor_type": "Lfm2VlImageProcessorFast",
        "image_std": SIGLIP_NORM,
        "max_image_tokens": MAX_IMAGE_TOKENS,
        "max_num_patches": MAX_NUM_PATCHES,
        "max_pixels_tolerance": 2.0,
        "max_tiles": 10,
        "min_image_tokens": 64,
        "min_tiles": 2,
        "processor_class": "Lfm2VlProcessor",
        "resample": 2,
        "rescale_factor": 1 / 255,
        "return_row_col_info": True,
        "size": {"height": 512, "width": 512},
        "tile_size": 512,
        "use_thumbnail": False,
    }
    common.write_json(out_dir / "preprocessor_config.json", image_processor)
    common.write_json(
        out_dir / "processor_config.json",
        {"processor_class": "Lfm2VlProcessor", "use_image_special_tokens": True},
    )
    vision = {
        "model_type": "siglip2_vision_model",
        **common.vision_sizes(),
        "num_patches": POSITION_PATCHES,
        "patch_size": PATCH,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
        "vision_use_head": False,
    }
    text = {
        "model_type": "lfm2",
        **common.text_sizes(),
        # The published model's pattern (conv, conv, attention, ...) cut to one of each.
        "layer_types": ["conv", "full_attention"],
        "conv_L_cache": 3,
        "conv_bias": False,
        # The published config's own names for these sizes, which vLLM's LFM2 reads.
        "block_dim": common.HIDDEN,
        "conv_dim": common.HIDDEN,
        "conv_dim_out": common.HIDDEN,
        "block_auto_adjust_ff_dim": True,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "block_norm_eps": 1e-5,
        "norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "tie_word_embeddings": True,
        "bos_token_id": ids["<|startoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|pad|>"],
        "dtype": common.DTYPE,
    }
    config = Lfm2VlConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<image>"],
        downsample_factor=DOWNSAMPLE,
        projector_hidden_act="gelu",
        projector_hidden_size=common.INTERMEDIATE,
        projector_bias=True,
        projector_use_layernorm=True,
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<|startoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|pad|>"],
        },
        rename=published_layout,
    )


def published_layout(name: str) -> str:
    """A weight name as transformers 5 saves LFM2-VL -> the published layout vLLM's loader
    reads: the language model and projector are already there (lm_head is tied, so absent),
    but the SigLIP2 tower lacks its ``vision_model.`` level."""
    tower = "model.vision_tower."
    if name.startswith(tower) and not name.startswith(tower + "vision_model."):
        return tower + "vision_model." + name[len(tower) :]
    return name

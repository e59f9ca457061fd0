"""InternVL in the transformers format (``OpenGVLab/InternVL3-1B-hf``): a Qwen2 text model, the
InternVL vision tower, the GOT-OCR2 tiling image processor and InternVL's video processor.

One tile is 224x224 here (448 in the published model) so that a tile costs 64 placeholders,
not 256; the tiling itself (up to 12 tiles plus a thumbnail) is the published one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published model's additions to the Qwen2.5 vocabulary, in its order.
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<img>",
    "</img>",
    "<IMG_CONTEXT>",
    "<quad>",
    "</quad>",
    "<ref>",
    "</ref>",
    "<box>",
    "</box>",
    "<video>",
)

# The template transformers' InternVL conversion script gives the -hf checkpoints.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n'}}"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\\n' }}"
    "{% elif content['type'] == 'video' %}"
    "{{ '<video>\\n' }}"
    "{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

TILE = 224
PATCH = 14
DOWNSAMPLE = 0.5
# Placeholders per tile: (224 / 14)^2 patches, pixel-shuffled by 0.5 in each direction.
TILE_TOKENS = int((TILE // PATCH) ** 2 * DOWNSAMPLE**2)
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


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
            # InternVLProcessor reads these names off the tokenizer.
            "extra_special_tokens": {
                "start_image_token": "<img>",
                "end_image_token": "</img>",
                "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>",
            },
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
    )


def _processor_files(out: Path) -> None:
    image = {
        "crop_size": None,
        "crop_to_patches": False,
        "data_format": "channels_first",
        "default_to_square": True,
        "do_center_crop": None,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
        "max_patches": 12,
        "min_patches": 1,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": TILE, "width": TILE},
    }
    common.write_json(
        out / "preprocessor_config.json",
        image | {"image_processor_type": "GotOcr2ImageProcessorFast"},
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "do_resize": True,
            "do_sample_frames": False,
            "image_mean": IMAGENET_MEAN,
            "image_std": IMAGENET_STD,
            "initial_shift": True,
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"height": TILE, "width": TILE},
            "video_processor_type": "InternVLVideoProcessor",
        },
    )
    common.write_json(
        out / "processor_config.json",
        {"image_seq_length": TILE_TOKENS, "processor_class": "InternVLProcessor"},
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import InternVLConfig

    text = {
        "model_type": "qwen2",
        **common.text_sizes(),
        "max_window_layers": common.TEXT_LAYERS,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "tie_word_embeddings": True,
        "dtype": common.DTYPE,
    }
    vision = {
        **common.vision_sizes(),
        "image_size": [TILE, TILE],
        "patch_size": [PATCH, PATCH],
        "attention_bias": True,
        "use_qk_norm": False,
        "norm_type": "layer_norm",
        "use_mean_pooling": True,
        "use_absolute_position_embeddings": True,
    }
    return InternVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=TILE_TOKENS,
        downsample_ratio=DOWNSAMPLE,
        projector_hidden_act="gelu",
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
        dtype=common.DTYPE,
    )

"""Tiny LLaVA-OneVision, shaped as ``llava-hf/llava-onevision-qwen2-0.5b-ov-hf``: a SigLIP tower
over "anyres_max_9" tiles for images and pooled frames for videos, a two-layer MLP projector and
a Qwen2 language model with tied embeddings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.tiny_families import common

# The published template: images, then videos, then the text of each turn after a newline.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ '\n' + content['text'] }}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Qwen2's specials, then OneVision's image and video tokens (151646 and 151647 in the real one).
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>")
# 112 px at patch 14 (the real 384 px tower gives 27x27): 64 tokens per tile, 16 per video frame.
IMAGE_SIZE = 112
PATCH = 14
# As published: every grid of 1..6 by 1..6 tiles of the tower's size.
GRID_PINPOINTS = [[IMAGE_SIZE * h, IMAGE_SIZE * w] for h in range(1, 7) for w in range(1, 7)]
SIGLIP_NORM = [0.5, 0.5, 0.5]


def _processor_files(out: Path) -> None:
    shared = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": SIGLIP_NORM,
        "image_std": SIGLIP_NORM,
        "processor_class": "LlavaOnevisionProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    }
    common.write_json(
        out / "preprocessor_config.json",
        shared
        | {
            "do_pad": True,
            "image_grid_pinpoints": GRID_PINPOINTS,
            "image_processor_type": "LlavaOnevisionImageProcessor",
        },
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        shared | {"video_processor_type": "LlavaOnevisionVideoProcessor"},
    )
    common.write_json(
        out / "processor_config.json",
        {
            "image_token": "<image>",
            "num_image_tokens": (IMAGE_SIZE // PATCH) ** 2,
            "processor_class": "LlavaOnevisionProcessor",
            "video_token": "<video>",
            "vision_aspect_ratio": "anyres_max_9",
            "vision_feature_select_strategy": "full",
        },
    )


def build(out_dir: Path) -> None:
    from transformers import LlavaOnevisionConfig

    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "errors": "replace",
            "padding_side": "right",
            # Qwen2's pipeline, rebuilt from the regex the shared BPE is trained with.
            "tokenizer_class": "Qwen2Tokenizer",
        },
    )
    _processor_files(out_dir)
    vision = {
        "model_type": "siglip_vision_model",
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
        "vision_use_head": False,
    }
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
    # Published config keys transformers 5 still writes but no longer declares.
    published: dict[str, Any] = {"use_image_newline_parameter": True}
    config = LlavaOnevisionConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=ids["<image>"],
        video_token_index=ids["<video>"],
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_aspect_ratio="anyres_max_9",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        tie_word_embeddings=True,
        dtype=common.DTYPE,
        **published,
    )
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        rename=common.llava_hf_layout,
    )

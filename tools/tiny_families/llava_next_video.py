"""Tiny LLaVA-NeXT-Video, shaped as ``llava-hf/LLaVA-NeXT-Video-7B-hf``: LLaVA-NeXT's CLIP tower
and projector, each video frame's patches average-pooled 2x2, and a Llama (Vicuna) language
model. The checkpoint also carries LLaVA-NeXT's image processor, but vLLM serves it for videos
only (one per prompt) and refuses images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.tiny_families import common, llava, llava_next

# The published Vicuna-style template: every image, then every video of a turn, then its text.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
# Llama's specials, then the video and image tokens (32000 and 32001 in the real vocabulary);
# Vicuna pads with <unk>.
SPECIALS = ("<unk>", "<s>", "</s>", "<video>", "<image>")
# 224 px at patch 14, twice the other tiny CLIP towers: vLLM's video pooler divides by
# image_size // patch_size**2, zero below 196 px (the real 336 px gives 1).
IMAGE_SIZE = 224
POOL_STRIDE = 2
# Tokens of one frame: the 16x16 patch grid pooled 2x2 (the real 24x24 pools to 144).
FRAME_TOKENS = (IMAGE_SIZE // llava.PATCH // POOL_STRIDE) ** 2
# LLaVA-NeXT's tiles at this tower's size: 1x2, 2x1, 2x2, 3x1 and 1x3.
GRID_PINPOINTS = [[2 * h, 2 * w] for h, w in llava_next.GRID_PINPOINTS]


def _vision_config() -> dict[str, object]:
    return llava.clip_vision_config() | {"image_size": IMAGE_SIZE}


def _processor_files(out: Path) -> None:
    clip = llava.clip_image_processor("LlavaNextVideoProcessor") | {
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "size": {"shortest_edge": IMAGE_SIZE},
    }
    image = clip | {
        "image_processor_type": "LlavaNextImageProcessor",
        "image_grid_pinpoints": GRID_PINPOINTS,
        "do_pad": True,
    }
    common.write_json(out / "preprocessor_config.json", image)
    video = {k: v for k, v in clip.items() if k != "image_processor_type"}
    common.write_json(
        out / "video_preprocessor_config.json",
        video | {"video_processor_type": "LlavaNextVideoVideoProcessor"},
    )
    common.write_json(
        out / "processor_config.json",
        {
            "image_token": "<image>",
            "num_additional_image_tokens": 1,
            "patch_size": llava.PATCH,
            "processor_class": "LlavaNextVideoProcessor",
            "video_token": "<video>",
            "vision_feature_select_strategy": "default",
        },
    )


def build(out_dir: Path) -> None:
    from transformers import LlavaNextVideoConfig

    tokenizer = llava.llama_tokenizer_config() | {"pad_token": "<unk>"}
    ids = common.write_tokenizer(out_dir, SPECIALS, CHAT_TEMPLATE, tokenizer)
    _processor_files(out_dir)
    pad = ids["<unk>"]
    # Published config keys transformers 5 still writes but no longer declares.
    published: dict[str, Any] = {
        "pad_token_id": pad,
        "spatial_pool_out_channels": common.VISION_WIDTH,
        "use_image_newline_parameter": True,
    }
    config = LlavaNextVideoConfig(
        vision_config=_vision_config(),
        text_config=llava.llama_text_config("llama", ids | {"<pad>": pad}),
        image_token_index=ids["<image>"],
        video_token_index=ids["<video>"],
        image_grid_pinpoints=GRID_PINPOINTS,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        spatial_pool_mode="average",
        spatial_pool_stride=POOL_STRIDE,
        image_seq_length=(IMAGE_SIZE // llava.PATCH) ** 2,
        # Two frames' worth, as published (288 = 2 x 144).
        video_seq_length=2 * FRAME_TOKENS,
        tie_word_embeddings=False,
        dtype=common.DTYPE,
        **published,
    )
    common.save_random_model(
        config,
        out_dir,
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": pad},
        rename=common.llava_hf_layout,
    )

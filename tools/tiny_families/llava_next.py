"""Tiny LLaVA-NeXT, shaped as ``llava-hf/llava-v1.6-mistral-7b-hf``: LLaVA-1.5's CLIP tower and
projector over "anyres" tiles (a base view plus a grid of crops, a learned newline after each
row) and a Mistral language model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.tiny_families import common, llava

# The published Mistral-style template: [INST] turns, images before the text of a turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<<SYS>>\n' + message['content'][0]['text'] + '\n<</SYS>>\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' }}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] }}{% endfor %}{{' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'][0]['text'] + '<\\\\s> '}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)
# The real 336 px grid points scaled to the tiny 112 px tower: 1x2, 2x1, 2x2, 3x1 and 1x3 tiles.
GRID_PINPOINTS = [[112, 224], [224, 112], [224, 224], [336, 112], [112, 336]]


def build(out_dir: Path) -> None:
    from transformers import LlavaNextConfig

    ids = common.write_tokenizer(
        out_dir, llava.SPECIALS, CHAT_TEMPLATE, llava.llama_tokenizer_config()
    )
    image = llava.clip_image_processor("LlavaNextProcessor") | {
        "image_processor_type": "LlavaNextImageProcessor",
        "image_grid_pinpoints": GRID_PINPOINTS,
        "do_pad": True,
    }
    common.write_json(out_dir / "preprocessor_config.json", image)
    common.write_json(
        out_dir / "processor_config.json",
        {
            "image_token": "<image>",
            "num_additional_image_tokens": 1,
            "patch_size": llava.PATCH,
            "processor_class": "LlavaNextProcessor",
            "vision_feature_select_strategy": "default",
        },
    )
    text = llava.llama_text_config("mistral", ids) | {"sliding_window": None}
    # Published config keys transformers 5 still writes but no longer declares.
    published: dict[str, Any] = {"pad_token_id": ids["<pad>"], "use_image_newline_parameter": True}
    config = LlavaNextConfig(
        vision_config=llava.clip_vision_config(),
        text_config=text,
        image_token_index=ids["<image>"],
        image_grid_pinpoints=GRID_PINPOINTS,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        image_seq_length=(llava.IMAGE_SIZE // llava.PATCH) ** 2,
        dtype=common.DTYPE,
        **published,
    )
    common.save_random_model(
        config,
        out_dir,
        {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]},
        rename=common.llava_hf_layout,
    )

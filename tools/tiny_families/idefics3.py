"""Tiny Idefics3, shaped as ``HuggingFaceTB/SmolVLM-Instruct`` (``Idefics3ForConditionalGeneration``
with ``Idefics3Processor``): an image is split into tiles of the tower's size plus a global view,
each tile's patches pixel-shuffled into a few tokens and tagged ``<row_r_col_c>``, and a Llama
language model. (SmolVLM2's own architecture and processor, which need ``num2words``, are a
different family.)"""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published SmolVLM template: "User:" / "Assistant:" turns ended by <end_of_utterance>.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
# SmolLM2's specials, Idefics3's image tokens and the tile tags the processor looks up.
TILE_TAGS = tuple(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *TILE_TAGS,
)
# 112 px tiles at patch 14 (8x8), pixel-shuffled by 2: 16 tokens per tile (the real 384 px
# tiles give 81); images are resized to at most 4x4 tiles before splitting, as published.
IMAGE_SIZE = 112
PATCH = 14
SCALE_FACTOR = 2
TOKENS_PER_TILE = (IMAGE_SIZE // PATCH) ** 2 // SCALE_FACTOR**2
SIGLIP_NORM = [0.5, 0.5, 0.5]


def build(out_dir: Path) -> None:
    from transformers import Idefics3Config

    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<|im_start|>",
            "eos_token": "<end_of_utterance>",
            "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "padding_side": "left",
        },
    )
    common.write_json(
        out_dir / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_image_splitting": True,
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_mean": SIGLIP_NORM,
            "image_processor_type": "Idefics3ImageProcessor",
            "image_std": SIGLIP_NORM,
            "max_image_size": {"longest_edge": IMAGE_SIZE},
            "processor_class": "Idefics3Processor",
            "resample": 1,
            "rescale_factor": 1 / 255,
            "size": {"longest_edge": 4 * IMAGE_SIZE},
        },
    )
    common.write_json(
        out_dir / "processor_config.json",
        {"image_seq_len": TOKENS_PER_TILE, "processor_class": "Idefics3Processor"},
    )
    vision = {
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
    }
    text = {
        "model_type": "llama",
        **common.text_sizes(),
        "rope_parameters": {"rope_type": "default", "rope_theta": 273768.0},
        "bos_token_id": ids["<|im_start|>"],
        "eos_token_id": ids["<end_of_utterance>"],
        "pad_token_id": ids["<|im_end|>"],
        "dtype": common.DTYPE,
    }
    config = Idefics3Config(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<image>"],
        scale_factor=SCALE_FACTOR,
        pad_token_id=ids["<|im_end|>"],
        dtype=common.DTYPE,
    )
    # transformers 5 writes Idefics3 in its published layout already (model.vision_model,
    # model.connector, model.text_model, lm_head).
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": ids["<end_of_utterance>"],
            "pad_token_id": ids["<|im_end|>"],
        },
    )

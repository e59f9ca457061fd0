"""Tiny Aria, shaped as ``rhymes-ai/Aria`` in its transformers format
(``AriaForConditionalGeneration`` with ``AriaProcessor``): an Idefics3-style vision tower whose
patches a projector reads with a fixed set of learned queries through cross-attention (one
count of queries per image size), and a Llama language model whose feed-forward blocks are a
mixture of experts with shared experts beside the routed ones.

The published tokenizer holds ``<|img|>`` as a single token but not the chat markers:
``<|im_start|>``, ``<|im_end|>``, ``<fim_prefix>`` and ``<fim_suffix>`` are plain text there (the
model's own inference code stops on the string ``<|im_end|>``), and so they are here."""

from __future__ import annotations

from pathlib import Path

from tools.tiny_families import common

# The published template.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is iterable %}{% for item in message['content'] %}"
    "{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'image' %}<fim_prefix><|img|><fim_suffix>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>", "<|img|>")
# The processor pads every image to a square of 490 or 980 px (transformers allows no other
# size; it asks for 980 unless told otherwise). 70 px patches make those 7x7 and 14x14 grids,
# read by 8 and 16 queries (the real 14 px patches give 35x35 and 70x70, read by 128 and 256).
IMAGE_SIZE = 980
PATCH = 70
QUERIES = {490: 8, 980: 16}
SIGLIP_NORM = [0.5, 0.5, 0.5]
# The crop grids (rows, columns of 490 px tiles) a split image may take, as published.
SPLIT_GRIDS = (
    (1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 7), (1, 8), (2, 4), (2, 3), (2, 2),
    (2, 1), (3, 1), (3, 2), (4, 1), (4, 2), (5, 1), (6, 1), (7, 1), (8, 1),
)  # fmt: skip

# The real model routes each token to 6 of 64 experts beside 2 shared ones.
EXPERTS = 4
TOP_K = 2
SHARED_EXPERTS = 2


def build(out_dir: Path) -> None:
    from transformers import AriaConfig

    ids = common.write_tokenizer(
        out_dir,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "padding_side": "left",
            # AriaProcessor reads the image token from the tokenizer.
            "extra_special_tokens": {"image_token": "<|img|>"},
        },
    )
    _write_processor_configs(out_dir)
    text = {
        "model_type": "aria_text",
        **common.text_sizes(),
        "moe_num_experts": EXPERTS,
        "moe_topk": TOP_K,
        "moe_num_shared_experts": SHARED_EXPERTS,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
        "dtype": common.DTYPE,
    }
    vision = {
        "model_type": "idefics3_vision",
        **common.vision_sizes(),
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH,
    }
    config = AriaConfig(
        vision_config=vision,
        text_config=text,
        projector_patch_to_query_dict={(size // PATCH) ** 2: n for size, n in QUERIES.items()},
        image_token_index=ids["<|img|>"],
        dtype=common.DTYPE,
    )
    # Published at the top level too, though AriaConfig declares it only in the text config.
    config.pad_token_id = ids["<pad>"]
    # transformers 5 writes Aria in its published layout already (language_model.model,
    # language_model.lm_head, vision_tower, multi_modal_projector, experts.fc1/fc2.weight).
    common.save_random_model(
        config,
        out_dir,
        {
            "bos_token_id": ids["<s>"],
            "eos_token_id": ids["</s>"],
            "pad_token_id": ids["<pad>"],
        },
    )


def _write_processor_configs(out_dir: Path) -> None:
    common.write_json(
        out_dir / "preprocessor_config.json",
        {
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_rescale": True,
            "image_mean": SIGLIP_NORM,
            "image_processor_type": "AriaImageProcessor",
            "image_std": SIGLIP_NORM,
            "max_image_size": IMAGE_SIZE,
            "min_image_size": 336,
            "processor_class": "AriaProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "split_image": False,
            "split_resolutions": [[490 * h, 490 * w] for h, w in SPLIT_GRIDS],
        },
    )
    common.write_json(
        out_dir / "processor_config.json",
        {
            "processor_class": "AriaProcessor",
            # Keys are image sizes in pixels, values the image tokens per crop.
            "size_conversion": {str(size): n for size, n in QUERIES.items()},
        },
    )

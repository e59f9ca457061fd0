"""EXAONE 4.5 (``LGAI-EXAONE/EXAONE-4.5-33B``): a Qwen2.5-VL-style vision tower (window
attention, grouped key/value heads, a gated MLP) before an EXAONE 4 language model (sliding-window
layers with RoPE, global layers without), ``Exaone4_5_Processor`` over Qwen2-VL's image and video
processors. An image is ``<vision><|image_pad|></vision>``, a video the same with
``<|video_pad|>``.

The tiny language model has one sliding layer then one global layer (published: three, then
one); images and videos are bounded as the Qwen2.5-VL tiny model's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

SPECIALS = (
    "[PAD]",
    "[BOS]",
    "<|endoftext|>",
    "[UNK]",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|endofturn|>",
    "<think>",
    "</think>",
    "<vision>",
    "</vision>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# EXAONE's turn format (as vLLM's EXAONE 4.5 example prompts it): media before a turn's text,
# reasoning switched off in earlier assistant turns.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
<|system|>
You are a helpful assistant.<|endofturn|>
{% endif -%}
<|{{ message['role'] }}|>
{% if message['content'] is string -%}
{{ message['content'] }}
{%- else -%}
{%- for part in message['content'] if part['type'] == 'image' or 'image' in part -%}
<vision><|image_pad|></vision>
{%- endfor -%}
{%- for part in message['content'] if part['type'] == 'video' or 'video' in part -%}
<vision><|video_pad|></vision>
{%- endfor -%}
{%- for part in message['content'] if part['type'] == 'text' -%}
{{ part['text'] }}
{%- endfor -%}
{%- endif -%}
<|endofturn|>
{% endfor -%}
{%- if add_generation_prompt -%}
<|assistant|>
{% endif -%}"""

PATCH = 14
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE
STOP_TOKENS = ("<|endofturn|>", "<|endoftext|>")


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "[BOS]",
            "eos_token": "<|endofturn|>",
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "extra_special_tokens": {
                "image_token": "<|image_pad|>",
                "video_token": "<|video_pad|>",
            },
        },
    )
    _processor_files(out)
    generation = {
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": [ids[t] for t in STOP_TOKENS],
        "pad_token_id": ids["[PAD]"],
    }
    common.save_random_model(_config(ids), out, generation)


def _processor_files(out: Path) -> None:
    keys = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": common.OPENAI_CLIP_MEAN,
        "image_std": common.OPENAI_CLIP_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "processor_class": "Exaone4_5_Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": TEMPORAL,
    }
    image = {"shortest_edge": (2 * FACTOR) ** 2, "longest_edge": FACTOR * FACTOR * 1024}
    common.write_json(
        out / "preprocessor_config.json",
        keys | {"image_processor_type": "Qwen2VLImageProcessor", "size": image},
    )
    video = {"shortest_edge": FACTOR * FACTOR * 128, "longest_edge": FACTOR * FACTOR * 768}
    common.write_json(
        out / "video_preprocessor_config.json",
        keys
        | {
            "video_processor_type": "Qwen2VLVideoProcessor",
            "size": video,
            "min_frames": 4,
            "max_frames": 768,
            "cap_pixels_per_frame": True,
        },
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Exaone4_5_Config

    text = {
        "model_type": "exaone4",
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "rms_norm_eps": 1e-5,
        # M-RoPE sections sum to half the head dim (32 / 2).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": [4, 6, 6],
        },
        "sliding_window": 4096,
        "sliding_window_pattern": 2,
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": ids["<|endofturn|>"],
        "pad_token_id": ids["[PAD]"],
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }
    vision = {
        "depth": 1,
        "hidden_size": common.VISION_WIDTH,
        "intermediate_size": 2 * common.VISION_WIDTH,
        "num_heads": common.VISION_HEADS,
        "num_key_value_heads": 1,
        "out_hidden_size": common.HIDDEN,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "window_size": 112,
        # The real [7, 15, 23, 31] would name missing blocks; keep one full-attention block.
        "fullatt_block_indexes": [0],
    }
    return Exaone4_5_Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )

"""GLM-4.1V (``zai-org/GLM-4.1V-9B-Thinking``): a GLM-4 text model with M-RoPE, the GLM-4V
vision tower, ``Glm4vProcessor`` with its image and video processors.

Images and videos are bounded far below the published sizes (at most 1024 placeholders for an
image, 4096 for a whole video); a frame's timestamp is written between its images as text."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens, in its order (it has them after the BPE too).
SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
)

# The published chat template (GLM-4.1V-9B-Thinking's chat_template.jinja).
CHAT_TEMPLATE = """\
[gMASK]<sop>
{%- for msg in messages %}
    {%- if msg.role == 'system' %}
<|system|>
{{ msg.content }}
    {%- elif msg.role == 'user' %}
<|user|>{{ '\\n' }}

        {%- if msg.content is string %}
{{ msg.content }}
        {%- else %}
            {%- for item in msg.content %}
                {%- if item.type == 'video' or 'video' in item %}
<|begin_of_video|><|video|><|end_of_video|>
                {%- elif item.type == 'image' or 'image' in item %}
<|begin_of_image|><|image|><|end_of_image|>
                {%- elif item.type == 'text' %}
{{ item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- elif msg.role == 'assistant' %}
        {%- if msg.metadata %}
<|assistant|>{{ msg.metadata }}
{{ msg.content }}
        {%- else %}
<|assistant|>
{{ msg.content }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}"""

PATCH = 14
MERGE = 2
TEMPORAL = 2
FACTOR = PATCH * MERGE
# Bounds are pixel areas over the temporal patch (``t * h * w``), as GLM's smart_resize reads them.
IMAGE_MAX_PIXELS = TEMPORAL * FACTOR * FACTOR * 1024
VIDEO_MAX_PIXELS = TEMPORAL * FACTOR * FACTOR * 4096
MIN_PIXELS = 112 * 112


# tokenizer_config.json's keys beyond the common ones (GLM-4.5V publishes the same).
TOKENIZER_CONFIG = {
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "do_lower_case": False,
    "padding_side": "left",
    "remove_space": False,
}
# Generation stops at any of these (the published generation_config's eos_token_id).
STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>", "</answer>")


def build(out: Path) -> None:
    ids = common.write_tokenizer(out, SPECIALS, CHAT_TEMPLATE, TOKENIZER_CONFIG)
    processor_files(out)
    common.save_random_model(_config(ids), out, generation(ids, STOP_TOKENS))


def generation(ids: dict[str, int], stops: tuple[str, ...]) -> dict[str, object]:
    """The generation config: stop at ``stops``, pad with ``<|endoftext|>``."""
    return {"eos_token_id": [ids[t] for t in stops], "pad_token_id": ids["<|endoftext|>"]}


def processor_files(out: Path) -> None:
    """The image and video processor configs (GLM-4.5V publishes the same processors)."""
    common_keys = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": common.OPENAI_CLIP_MEAN,
        "image_std": common.OPENAI_CLIP_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "processor_class": "Glm4vProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "temporal_patch_size": TEMPORAL,
    }
    common.write_json(
        out / "preprocessor_config.json",
        common_keys
        | {
            "image_processor_type": "Glm4vImageProcessor",
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": IMAGE_MAX_PIXELS},
        },
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        common_keys
        | {
            "video_processor_type": "Glm4vVideoProcessor",
            "do_sample_frames": True,
            "fps": 2,
            "max_duration": 300,
            "max_image_size": {"longest_edge": VIDEO_MAX_PIXELS},
            "size": {"shortest_edge": MIN_PIXELS, "longest_edge": VIDEO_MAX_PIXELS},
        },
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Glm4vConfig

    return Glm4vConfig(
        text_config=text_config(ids),
        vision_config=vision_config(),
        **token_ids(ids),
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )


def text_config(ids: dict[str, int]) -> dict[str, object]:
    """The GLM-4 language model's keys (GLM-4.5V's MoE adds its own on top)."""
    return {
        **common.text_sizes(),
        "rms_norm_eps": 1e-5,
        # Half the head dim rotates (16 of 32); its M-RoPE sections sum to half of that.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [2, 3, 3],
        },
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "dtype": common.DTYPE,
    }


def vision_config() -> dict[str, object]:
    """The one-layer GLM-4V vision tower."""
    return {
        "depth": 1,
        "hidden_size": common.VISION_WIDTH,
        "num_heads": common.VISION_HEADS,
        "out_hidden_size": common.HIDDEN,
        "intermediate_size": common.INTERMEDIATE,
        "image_size": 224,
        "patch_size": PATCH,
        "spatial_merge_size": MERGE,
        "temporal_patch_size": TEMPORAL,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
    }


def token_ids(ids: dict[str, int]) -> dict[str, Any]:
    """The top-level config's placeholder and boundary token ids (keyword arguments)."""
    return {
        "image_token_id": ids["<|image|>"],
        "video_token_id": ids["<|video|>"],
        "image_start_token_id": ids["<|begin_of_image|>"],
        "image_end_token_id": ids["<|end_of_image|>"],
        "video_start_token_id": ids["<|begin_of_video|>"],
        "video_end_token_id": ids["<|end_of_video|>"],
    }

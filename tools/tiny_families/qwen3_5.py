"""Qwen3.5 (``Qwen/Qwen3.5-27B``): the Qwen3-VL vision tower (no deepstack taps) before a hybrid
language model, Gated-DeltaNet linear-attention layers with a gated full-attention layer every
fourth. The tiny one has one of each: a linear-attention layer, then a full-attention one.

Its processor is Qwen3-VL's (``Qwen3VLProcessor``), with the tiny Qwen3-VL's files
(``tools.tiny_models``); the tokenizer holds the published control tokens in their order."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from tools import tiny_models
from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens in its order (248044..248069), Qwen3's.
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
# Published as plain added tokens: single ids, yet kept when decoding skips special tokens.
PLAIN = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

# The published template's chat, media and thinking parts (its tool-call parts left out): no
# default system prompt, earlier turns' reasoning dropped, and the answer opens a thinking block
# unless ``enable_thinking=False`` closes it empty.
CHAT_TEMPLATE = """\
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item %}
                {%- set image_count.value = image_count.value + 1 %}
                {%- if add_vision_id %}{{- 'Picture ' ~ image_count.value ~ ': ' }}{%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif item.type == 'video' or 'video' in item %}
                {%- set video_count.value = video_count.value + 1 %}
                {%- if add_vision_id %}{{- 'Video ' ~ video_count.value ~ ': ' }}{%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
{%- for message in messages %}
    {%- set content = render_content(message.content) %}
    {%- if message.role == 'assistant' and '</think>' in content %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

TOKENIZER_CONFIG = {
    "bos_token": None,
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "unk_token": None,
    "errors": "replace",
    # transformers reads Qwen3.5's tokenizer as Qwen3_5Tokenizer whatever this says.
    "tokenizer_class": "Qwen2Tokenizer",
}

# The tiny Qwen3-VL, whose processor files and vision tower this family shares.
VISION_DONOR = "qwen3-vl"
# Gated DeltaNet heads: twice as many value heads as key heads, as published (16 and 32), at the
# published 128 dims, which the CPU build's chunked delta-rule kernel requires (32 fails there).
LINEAR_KEY_HEADS = 1
LINEAR_VALUE_HEADS = 2
LINEAR_HEAD_DIM = 128
# Rotary on a quarter of each 32-dim head, as published: 8 dims, M-RoPE sections summing to 4.
PARTIAL_ROTARY = 0.25
MROPE_SECTION = [2, 1, 1]


def build(out: Path) -> None:
    # The processor files first: the tokenizer's chat_template.jinja then replaces theirs.
    tiny_models._processor_files(out, VISION_DONOR)
    ids = write_tokenizer(out)
    common.save_random_model(_config(ids), out, generation(ids))


def write_tokenizer(out: Path) -> dict[str, int]:
    """The tokenizer files (Qwen3.5 and Qwen3.5-MoE share them); returns the special ids."""
    ids = common.write_tokenizer(out, SPECIALS, CHAT_TEMPLATE, TOKENIZER_CONFIG)
    common.mark_plain(out, PLAIN)
    return ids


def generation(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
    }


def text_config(ids: dict[str, int]) -> dict[str, Any]:
    """The hybrid language model's settings (the MoE variant adds its experts)."""
    return {
        **common.text_sizes(),
        "head_dim": common.HEAD_DIM,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": LINEAR_HEAD_DIM,
        "linear_value_head_dim": LINEAR_HEAD_DIM,
        "linear_num_key_heads": LINEAR_KEY_HEADS,
        "linear_num_value_heads": LINEAR_VALUE_HEADS,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "mrope_section": MROPE_SECTION,
            "mrope_interleaved": True,
            "partial_rotary_factor": PARTIAL_ROTARY,
        },
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "dtype": common.DTYPE,
    }


def vision_config() -> dict[str, Any]:
    """The tiny Qwen3-VL's tower without its deepstack taps (Qwen3.5 has none)."""
    return {
        "depth": 1,
        "hidden_size": common.VISION_WIDTH,
        "intermediate_size": 2 * common.VISION_WIDTH,
        "num_heads": common.VISION_HEADS,
        "out_hidden_size": common.HIDDEN,
        "patch_size": 16,
        "spatial_merge_size": tiny_models.MERGE,
        "temporal_patch_size": tiny_models.TEMPORAL_PATCH,
        # A 16x16 learned grid, interpolated to the image's grid like the real 48x48 one.
        "num_position_embeddings": 256,
    }


class TokenIds(TypedDict):
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int


def token_ids(ids: dict[str, int]) -> TokenIds:
    return {
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
    }


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen3_5Config

    return Qwen3_5Config(
        text_config=text_config(ids),
        vision_config=vision_config(),
        **token_ids(ids),
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )

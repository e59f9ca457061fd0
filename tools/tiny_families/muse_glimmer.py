"""Muse Glimmer (``meta-models/Muse-Glimmer-30B``): a Gemma-style sandwich-norm text model with
gated attention and NoPE full-attention layers, a native-resolution ViT pixel-shuffled by 2, and
an adapter MLP into the text model.

vLLM reads the transformers layout with a few keys of the original checkpoint beside it
(``output_dim``, ``adapter_dim``, ``merge_kernel_size`` on the vision config; ``no_rope_layers``
and ``normalize_tok_embeddings`` on the text one): the config carries both. vLLM processes images
and videos with its own ``MuseGlimmerProcessor`` at that processor's fixed defaults (at most 4096
placeholders an image), so this family's context is 8192 tokens where the others have 4096."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The published vocabulary's control tokens (it has them from 200000 on), in its order.
SPECIALS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start|>",
    "<|message|>",
    "<|eot|>",
    "<|eom|>",
    "<|image|>",
    "<|video|>",
    "<|patch|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|vid_start|>",
    "<|vid_end|>",
    "<|vid_frame_separator|>",
)

# vLLM's copy of the published template (``MUSE_GLIMMER_MM_CHAT_TEMPLATE`` in
# vllm/transformers_utils/processors/muse_glimmer.py), one token per image or video part, but an
# image written as ``<|patch|>``, the token transformers' processor and vLLM's prompt update
# expand: vLLM's copy writes ``<|image|>``, which its own prompt update never finds (vLLM 0.32
# fails every chat with an image on it).
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- macro render_parts(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|patch|>' -}}"
    "{%- elif part['type'] == 'video' -%}{{- '<|video|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(has_system=false) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.has_system = true -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and not ns.has_system -%}"
    "{{- '<|start|>system<|message|>You are a helpful assistant.<|eot|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role == 'assistant' -%}"
    "{%- set recipient = message.get('recipient') -%}"
    "{%- set end_turn = message.get('end_turn') -%}"
    "{%- if end_turn is none -%}"
    "{%- set end_turn = not (recipient and recipient != 'user') -%}"
    "{%- endif -%}"
    "{{- '<|start|>assistant' -}}"
    "{%- if recipient -%}{{- ' to=' + recipient -}}{%- endif -%}"
    "{{- '<|message|>' -}}{{- render_parts(message['content']) -}}"
    "{{- ('<|eot|>' if end_turn else '<|eom|>') -}}"
    "{%- elif role == 'tool' -%}"
    "{%- set name = message.get('name', '') -%}"
    "{{- '<|start|>tool ' + name + '<|message|>' -}}"
    "{{- render_parts(message['content']) -}}"
    "{{- '<|eot|>' -}}"
    "{%- else -%}"
    "{%- set header = role -%}"
    "{%- if message.get('name') -%}"
    "{%- set header = role + ' ' + message['name'] -%}"
    "{%- endif -%}"
    "{{- '<|start|>' + header + '<|message|>' -}}"
    "{{- render_parts(message['content']) -}}"
    "{{- '<|eot|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

PATCH = 14
MERGE = 2
TEMPORAL = 2
# The text context: vLLM's processor sizes an image at up to 4096 placeholders.
CONTEXT = 2 * common.MAX_POSITIONS
# The ViT's learned position grid (interpolated to each image's).
POS_GRID = 8


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot|>",
            "pad_token": "<|end_of_text|>",
            "model_max_length": CONTEXT,
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": [ids["<|eot|>"], ids["<|eom|>"], ids["<|end_of_text|>"]],
            "pad_token_id": ids["<|end_of_text|>"],
        },
    )


def _processor_files(out: Path) -> None:
    """transformers' image and video processors (vLLM uses its own at their defaults)."""
    shared = {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": MERGE,
        "patch_size": PATCH,
        "processor_class": "MuseGlimmerProcessor",
        "temporal_patch_size": TEMPORAL,
    }
    common.write_json(
        out / "preprocessor_config.json",
        shared | {"image_processor_type": "MuseGlimmerImageProcessor", "max_image_tokens": 4096},
    )
    common.write_json(
        out / "video_preprocessor_config.json",
        shared | {"video_processor_type": "MuseGlimmerVideoProcessor"},
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import MuseGlimmerConfig

    text = {
        **common.text_sizes(),
        "max_position_embeddings": CONTEXT,
        "head_dim": common.HEAD_DIM,
        "sliding_window": 512,
        # The published pattern cut to two layers: sliding RoPE, then full NoPE (the last).
        "layer_types": ["sliding_attention", "full_attention"],
        "layer_rope_theta": [500000.0, 0],
        "no_rope_layers": [1, 0],
        "normalize_tok_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": ids["<|eot|>"],
        "pad_token_id": ids["<|end_of_text|>"],
        "dtype": common.DTYPE,
    }
    out_hidden = common.VISION_WIDTH * MERGE * MERGE
    vision = {
        **common.vision_sizes(),
        "patch_size": PATCH,
        "patch_temporal": TEMPORAL,
        "merge_size": MERGE,
        "merge_kernel_size": MERGE,
        "pos_emb_height": POS_GRID,
        "pos_emb_width": POS_GRID,
        "max_position_embeddings": POS_GRID * POS_GRID,
        "output_dim": out_hidden,
        "adapter_dim": common.HIDDEN,
    }
    return MuseGlimmerConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|patch|>"],
        video_token_id=ids["<|video|>"],
        out_hidden_size=out_hidden,
        projector_hidden_size=common.HIDDEN,
        dtype=common.DTYPE,
    )

"""Tiny Granite 4 Vision, shaped as ``ibm-granite/granite-vision-4.1-4b``
(``Granite4VisionForConditionalGeneration`` with ``Granite4VisionProcessor``): LLaVA-NeXT's
"anyres" tiles through a SigLIP tower, each tile's patches read by window Q-Former projectors
and the features added into the Granite language model's layers ("deepstack"), not into its
input embeddings (image positions start as zeros).

The published model maps four vision layers to four language layers and samples the last vision
layer four ways (one offset of each 2x2 block) for four more; here a 2-layer language model takes
one of each: the last vision layer at layer 0, its first spatial offset at layer 1. vLLM keys the
injected features by language layer, so the layers must differ. vLLM fixes the Q-Former's shape
(width = the tower's, 3072 wide MLP, heads of 64) and always builds four spatial projectors, as
transformers does. A 256 px tile (384 published): 16x16 patches, 8x8 windows whose 4x4 queries
("4/8") give 8x8 features per tile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# Granite 4's control tokens (GPT-2 style BPE, these after its 100k merges) and the image token
# the processor expands, added last (100352 published).
SPECIALS = (
    "<|pad|>",
    "<|end_of_text|>",
    "<|unk|>",
    "<|start_of_role|>",
    "<|end_of_role|>",
    "<|tool_call|>",
    "<image>",
)

# Granite's role-tagged turns, each image part written in place as a bare <image> (no
# open/close markers), no default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] == 'image' -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|end_of_text|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}"
    "{%- endif -%}"
)

TILE = 256
PATCH = 16
DOWNSAMPLE_RATE = "4/8"
# The published grid (1 to 10 tiles of 384 px, as height x width), in 256 px tiles.
GRID_PINPOINTS = [
    [TILE * h, TILE * w]
    for h, w in (
        *((1, w) for w in range(1, 11)),
        *((2, w) for w in range(1, 6)),
        *((3, w) for w in range(1, 4)),
        (4, 1),
        (4, 2),
        (5, 1),
        (5, 2),
        *((h, 1) for h in range(6, 11)),
    )
]
# (vision layer, language layer): the published map ends with the last vision layer at layer 0.
DEEPSTACK_LAYER_MAP = [[-1, 0]]
SPATIAL_TARGET_LAYERS = [1]


def build(out: Path) -> None:
    ids = common.write_tokenizer(
        out,
        SPECIALS,
        CHAT_TEMPLATE,
        {
            "bos_token": "<|end_of_text|>",
            "eos_token": "<|end_of_text|>",
            "pad_token": "<|pad|>",
            "unk_token": "<|unk|>",
            "padding_side": "left",
            "tokenizer_class": "GPT2Tokenizer",
        },
    )
    _processor_files(out)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<|end_of_text|>"],
            "eos_token_id": ids["<|end_of_text|>"],
            "pad_token_id": ids["<|pad|>"],
        },
        rename=_published_name,
    )


def _published_name(name: str) -> str:
    """``model.vision_tower.X`` -> ``model.vision_tower.vision_model.X``: transformers 5 writes
    the SigLIP tower without the level the published checkpoint, and vLLM's loader, have."""
    tower = "model.vision_tower."
    if name.startswith(tower) and not name.startswith(tower + "vision_model."):
        return tower + "vision_model." + name[len(tower) :]
    return name


def _processor_files(out: Path) -> None:
    common.write_json(
        out / "preprocessor_config.json",
        {
            "crop_size": {"height": TILE, "width": TILE},
            "do_center_crop": True,
            "do_convert_rgb": True,
            "do_normalize": True,
            "do_pad": True,
            "do_rescale": True,
            "do_resize": True,
            "image_grid_pinpoints": GRID_PINPOINTS,
            "image_mean": [0.5, 0.5, 0.5],
            "image_processor_type": "LlavaNextImageProcessor",
            "image_std": [0.5, 0.5, 0.5],
            "processor_class": "Granite4VisionProcessor",
            "resample": 3,
            "rescale_factor": 1 / 255,
            "size": {"shortest_edge": TILE},
        },
    )
    common.write_json(
        out / "processor_config.json",
        {
            "downsample_rate": DOWNSAMPLE_RATE,
            "image_token": "<image>",
            # SigLIP has no CLS embedding to count or drop.
            "num_additional_image_tokens": 0,
            "patch_size": PATCH,
            "processor_class": "Granite4VisionProcessor",
            "vision_feature_select_strategy": "full",
        },
    )


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Granite4VisionConfig

    text = {
        "model_type": "granite4_vision_text",
        **common.text_sizes(),
        "rms_norm_eps": 1e-5,
        # Granite's muP multipliers: the embedding and attention ones as published; the
        # published residual (0.22) and logits (1/10) scales would leave two different images'
        # logprobs within the parity suite's 1e-3 of each other on random weights.
        "embedding_multiplier": 12.0,
        "attention_multiplier": 0.015625,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0},
        "bos_token_id": ids["<|end_of_text|>"],
        "eos_token_id": ids["<|end_of_text|>"],
        "pad_token_id": ids["<|pad|>"],
        "tie_word_embeddings": False,
        "dtype": common.DTYPE,
    }
    vision = {
        "model_type": "siglip_vision_model",
        **common.vision_sizes(),
        "image_size": TILE,
        "patch_size": PATCH,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    }
    return Granite4VisionConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=ids["<image>"],
        image_grid_pinpoints=GRID_PINPOINTS,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_seq_length=(TILE // PATCH) ** 2,
        downsample_rate=DOWNSAMPLE_RATE,
        deepstack_layer_map=DEEPSTACK_LAYER_MAP,
        spatial_vision_layer=-1,
        spatial_target_layers=SPATIAL_TARGET_LAYERS,
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )

"""Qwen3-VL-MoE (``Qwen/Qwen3-VL-30B-A3B-Instruct``): the tiny Qwen3-VL of ``tools.tiny_models``
(its tokenizer, processor files and vision tower, unchanged) before a Qwen3-MoE language model.
Every text layer routes: four small experts, two per token, no shared expert, as published."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools import tiny_models
from tools.tiny_families import common

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

# The dense tiny model this one shares everything but the language model's MLPs with.
DENSE = "qwen3-vl"
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
# Twice this differs from the hidden size, as published: no fused tensor is square, so either
# layout reads unambiguously.
EXPERT_INTERMEDIATE = common.INTERMEDIATE // 8


def build(out: Path) -> None:
    # tiny_models keeps its Qwen builders private; reusing them keeps the two models in step.
    ids = tiny_models._tokenizer_files(out, DENSE)
    tiny_models._processor_files(out, DENSE)
    common.save_random_model(
        _config(ids),
        out,
        {
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
        },
    )
    _published_expert_layout(out / "model.safetensors")


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen3VLMoeConfig

    dense = tiny_models._model_config(DENSE, ids)
    text: dict[str, Any] = {
        **_own_keys(dense.text_config),
        "num_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        # As the top level says: the saved lm_head is the output layer, not the embeddings.
        "tie_word_embeddings": False,
    }
    return Qwen3VLMoeConfig(
        text_config=text,
        vision_config=_own_keys(dense.vision_config),
        image_token_id=dense.image_token_id,
        video_token_id=dense.video_token_id,
        vision_start_token_id=dense.vision_start_token_id,
        vision_end_token_id=dense.vision_end_token_id,
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )


def _own_keys(config: PreTrainedConfig) -> dict[str, Any]:
    """A dense sub-config's settings, minus what names its class and the writing library."""
    keys = config.to_diff_dict()
    for key in ("model_type", "transformers_version"):
        keys.pop(key, None)
    return keys


def _published_expert_layout(path: Path) -> None:
    """Transpose the fused experts to the published layout (``gate_up_proj`` as
    ``[experts, hidden, 2 * intermediate]``, ``down_proj`` as ``[experts, intermediate, hidden]``),
    which vLLM's loader reads. transformers 5 saves its own layout: its reverse conversion
    transposes only tensors whose shape differs from the model's, and a model's never does."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    fused = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
    save_file(
        {k: v.transpose(1, 2).contiguous() if k.endswith(fused) else v for k, v in tensors.items()},
        path,
        metadata={"format": "pt"},
    )

"""Qwen3.5-MoE (``Qwen/Qwen3.5-35B-A3B``): Qwen3.5's vision tower, tokenizer, processor and
hybrid layers (``tools.tiny_families.qwen3_5``) with a mixture-of-experts MLP in every layer:
four small routed experts, two per token, beside one gated shared expert, as published."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tools import tiny_models
from tools.tiny_families import common, qwen3_5

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

EXPERTS = 4
EXPERTS_PER_TOKEN = 2
# Twice this differs from the hidden size, as published: no fused expert tensor is square.
EXPERT_INTERMEDIATE = common.INTERMEDIATE // 8


def build(out: Path) -> None:
    # The processor files first: the tokenizer's chat_template.jinja then replaces theirs.
    tiny_models._processor_files(out, qwen3_5.VISION_DONOR)
    ids = qwen3_5.write_tokenizer(out)
    common.save_random_model(_config(ids), out, qwen3_5.generation(ids))


def _config(ids: dict[str, int]) -> PreTrainedConfig:
    from transformers import Qwen3_5MoeConfig

    text = {
        **qwen3_5.text_config(ids),
        "num_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "shared_expert_intermediate_size": EXPERT_INTERMEDIATE,
    }
    # Every layer routes: the dense MLP size is no key of the MoE text config.
    del text["intermediate_size"]
    return Qwen3_5MoeConfig(
        text_config=text,
        vision_config=qwen3_5.vision_config(),
        **qwen3_5.token_ids(ids),
        tie_word_embeddings=False,
        dtype=common.DTYPE,
    )

"""Model-aware item rules: what a processed item must hold for this model's encoder, and how
many embedding tokens it yields, where the generic checks (keys, dtypes, ranks, grids) cannot
tell. Keyed by HF processor class, as the wire transforms are.

Generate applies a model's rule to every item before the engine sees it: an item whose
encoder output does not fit its placeholder run either fails inside vLLM's engine core, taking
every request with it, or quietly feeds the model misplaced embeddings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tandem_wire import KwargsItem

__all__ = ["ItemRule", "ItemRuleMismatch", "WhisperFeatures", "item_rule_for", "register"]


class ItemRuleMismatch(ValueError):
    """An item this model's encoder cannot take (the generate service answers it as an
    invalid item)."""


class ItemRule(Protocol):
    """One modality's rule for one model."""

    def embed_tokens(self, item: KwargsItem) -> int:
        """The embedding tokens the encoder makes of ``item``; ItemRuleMismatch for an item
        it cannot take."""
        ...


@dataclass(frozen=True)
class WhisperFeatures:
    """Log-mel features over a fixed window (Qwen2-Audio): ``input_features`` is
    ``(mel bins, frames)`` and ``feature_attention_mask`` marks the frames that hold audio.

    The encoder reads the whole window and keeps as many outputs as the mask's sum makes
    through its two stride-2 steps (vLLM's own formula), so both shapes are those of the
    processor's window and the mask holds only ones and zeros: a negative sum kills the engine
    core, and twos count double.
    """

    features_shape: tuple[int, ...]
    mask_shape: tuple[int, ...]

    def embed_tokens(self, item: KwargsItem) -> int:
        from vllm.model_executor.models.qwen2_audio import _get_feat_extract_output_lengths

        features = item["input_features"].data
        mask = item["feature_attention_mask"].data
        if not isinstance(features, np.ndarray) or features.shape != self.features_shape:
            raise ItemRuleMismatch(
                f"input_features must be {list(self.features_shape)} (the processor's window)"
            )
        if not isinstance(mask, np.ndarray) or mask.shape != self.mask_shape:
            raise ItemRuleMismatch(f"feature_attention_mask must be {list(self.mask_shape)}")
        ones = int(np.count_nonzero(mask))
        if ones == 0 or int(np.count_nonzero(mask == 1)) != ones:
            raise ItemRuleMismatch("feature_attention_mask must hold ones and zeros, some ones")
        import torch

        _, tokens = _get_feat_extract_output_lengths(torch.tensor(ones))
        return int(tokens)


RuleFactory = Callable[[Any, str, KwargsItem], ItemRule | None]
"""(HF processor, modality, the start-up probe's item) -> that modality's rule, or None."""

_REGISTRY: dict[str, RuleFactory] = {}


def register(*processor_classes: str) -> Callable[[RuleFactory], RuleFactory]:
    """Register a factory for the HF processors of these class names (by exact name)."""

    def add(factory: RuleFactory) -> RuleFactory:
        for name in processor_classes:
            _REGISTRY[name] = factory
        return factory

    return add


def item_rule_for(hf_processor: Any, modality: str, probe: KwargsItem) -> ItemRule | None:
    """The rule for ``modality`` items of the model whose processor is ``hf_processor``."""
    factory = _REGISTRY.get(type(hf_processor).__name__) if hf_processor is not None else None
    return factory(hf_processor, modality, probe) if factory is not None else None


@register("Qwen2AudioProcessor")
def _qwen2_audio(hf_processor: Any, modality: str, probe: KwargsItem) -> ItemRule | None:
    if modality != "audio":
        return None
    features, mask = probe["input_features"].data, probe["feature_attention_mask"].data
    if not isinstance(features, np.ndarray) or not isinstance(mask, np.ndarray):
        raise RuntimeError("the Qwen2-Audio processor no longer makes feature tensors")
    return WhisperFeatures(features_shape=tuple(features.shape), mask_shape=tuple(mask.shape))

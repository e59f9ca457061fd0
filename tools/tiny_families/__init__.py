"""Tiny random-weight checkpoints of the multimodal families beyond Qwen, built offline.

Each family lives in its own module here with a ``build(out_dir: Path) -> None`` that writes a
loadable checkpoint (weights in the published layout, config, tokenizer with the family's special
tokens and chat template, the family's real processor configs). ``tools.tiny_models`` builds and
caches them by name beside the Qwen models; the parity suite and the supported-models page read
this table.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    """One model family as the tests and the docs know it."""

    name: str
    """The cache folder and command-line name (``python -m tools.tiny_models NAME``)."""
    module: str
    """The module under ``tools.tiny_families`` whose ``build`` writes it."""
    title: str
    """The family as users call it (the docs table's first column)."""
    architecture: str
    """The architecture vLLM serves it as (``config.json``'s ``architectures[0]``)."""
    modalities: tuple[str, ...]
    """What the tiny checkpoint takes and the parity suite sends: ``image``, ``video``."""
    notes: str = ""
    """What users should know (shown in the docs table)."""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llava-1.5", "llava", "LLaVA-1.5", "LlavaForConditionalGeneration", ("image",)),
        Family(
            "llava-next",
            "llava_next",
            "LLaVA-NeXT",
            "LlavaNextForConditionalGeneration",
            ("image",),
        ),
        Family(
            "llava-onevision",
            "llava_onevision",
            "LLaVA-OneVision",
            "LlavaOnevisionForConditionalGeneration",
            ("image", "video"),
        ),
        Family(
            "gemma3",
            "gemma3",
            "Gemma 3",
            "Gemma3ForConditionalGeneration",
            ("image",),
            "Two adjacent images share a token no image embeds: `vllm launch render` refuses "
            "them (400), Tandem's render answers as `vllm serve` does.",
        ),
        Family(
            "idefics3",
            "idefics3",
            "Idefics3 / SmolVLM",
            "Idefics3ForConditionalGeneration",
            ("image",),
        ),
        Family(
            "internvl-hf",
            "internvl",
            "InternVL (HF format)",
            "InternVLForConditionalGeneration",
            ("image", "video"),
            "The `-hf` checkpoints (`OpenGVLab/InternVL3-*-hf`); pixels travel as bf16.",
        ),
        Family(
            "mistral3",
            "mistral3",
            "Mistral 3 (Pixtral)",
            "Mistral3ForConditionalGeneration",
            ("image",),
            "With the HF tokenizer (`tokenizer.json`); mistral-common's `tekken.json` is untested.",
        ),
        Family(
            "glm4.1v",
            "glm4v",
            "GLM-4.1V",
            "Glm4vForConditionalGeneration",
            ("image", "video"),
            "One video per prompt (vLLM's limit for this model).",
        ),
        Family(
            "cohere2-vision",
            "cohere2_vision",
            "Cohere2-Vision",
            "Cohere2VisionForConditionalGeneration",
            ("image",),
        ),
    )
}


def module_path(name: str) -> Path:
    """The source file of family ``name``'s builder (part of its build fingerprint)."""
    return Path(__file__).with_name(FAMILIES[name].module + ".py")


def builder(name: str) -> Callable[[Path], None]:
    """Family ``name``'s ``build(out_dir)``."""
    module = importlib.import_module(f"tools.tiny_families.{FAMILIES[name].module}")
    build: Callable[[Path], None] = module.build
    return build

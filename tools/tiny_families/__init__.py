"""Tiny random-weight checkpoints of the multimodal families beyond Qwen, built offline.

Each family lives in its own module here with a ``build(out_dir: Path) -> None`` that writes a
loadable checkpoint (weights in the published layout, config, tokenizer with the family's special
tokens and chat template, the family's real processor configs). ``tools.tiny_models`` builds and
caches them by name beside the Qwen models; the parity suite and the supported-models page read
this table.
"""

from __future__ import annotations

import importlib
import re
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
    in_make_test: bool = True
    """Whether ``make test`` (CI) runs its parity suite; ``make test-families`` runs every
    family. One family of each kind at least is in ``make test``; the rest wait for the suite's
    time budget."""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "llava-1.5",
            "llava",
            "LLaVA-1.5",
            "LlavaForConditionalGeneration",
            ("image",),
            in_make_test=False,
        ),
        Family(
            "llava-next",
            "llava_next",
            "LLaVA-NeXT",
            "LlavaNextForConditionalGeneration",
            ("image",),
            in_make_test=False,
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
            in_make_test=False,
        ),
        Family(
            "lfm2-vl",
            "lfm2_vl",
            "LFM2-VL",
            "Lfm2VlForConditionalGeneration",
            ("image",),
            "A hybrid (short-conv + attention) language model: on the CPU build its engine "
            "keeps chunked prefill on, as vLLM requires for it.",
        ),
        Family(
            "glm4.5v",
            "glm4v_moe",
            "GLM-4.5V",
            "Glm4vMoeForConditionalGeneration",
            ("image", "video"),
            "One video per prompt (vLLM's limit for this model).",
        ),
        Family(
            "qwen2.5-omni",
            "qwen2_5_omni",
            "Qwen2.5-Omni (thinker)",
            "Qwen2_5OmniForConditionalGeneration",
            ("image", "audio", "video"),
            "Text out only: vLLM serves the thinker and skips the talker's and token2wav's "
            "weights; a video's own audio track (`use_audio_in_video`) is untested.",
        ),
        Family(
            "paligemma2",
            "paligemma",
            "PaliGemma 2",
            "PaliGemmaForConditionalGeneration",
            ("image",),
            "One image per prompt (vLLM's limit). No chat template is published: chats use "
            "vLLM's fallback for `paligemma` (the messages' text, concatenated).",
        ),
        Family(
            "smolvlm",
            "smolvlm",
            "SmolVLM2",
            "SmolVLMForConditionalGeneration",
            ("image",),
            "Images only (vLLM serves no video for it). Its processor needs `num2words`.",
            in_make_test=False,
        ),
        Family(
            "gemma3n",
            "gemma3n",
            "Gemma 3n",
            "Gemma3nForConditionalGeneration",
            ("image", "audio"),
            "Its MobileNetV5 tower is a timm model: generate needs `timm` (render does not). Two "
            "adjacent images share a token no image embeds: `vllm launch render` refuses them "
            "(400), Tandem's render answers as `vllm serve` does.",
            in_make_test=False,
        ),
        Family(
            "llava-next-video",
            "llava_next_video",
            "LLaVA-NeXT-Video",
            "LlavaNextVideoForConditionalGeneration",
            ("video",),
            "Videos only, one per prompt: vLLM serves it without images (400).",
        ),
        Family(
            "blip2",
            "blip2",
            "BLIP-2",
            "Blip2ForConditionalGeneration",
            ("image",),
            "One image per prompt (vLLM's limit), its 32 query tokens put before the prompt. No "
            "chat template is published: chats use vLLM's fallback for `blip-2` "
            '("Question: ... Answer:").',
        ),
        Family(
            "aria",
            "aria",
            "Aria",
            "AriaForConditionalGeneration",
            ("image",),
            in_make_test=False,
        ),
        Family(
            "qwen3-vl-moe",
            "qwen3_vl_moe",
            "Qwen3-VL-MoE",
            "Qwen3VLMoeForConditionalGeneration",
            ("image", "video"),
            in_make_test=False,
        ),
        Family(
            "llama4",
            "llama4",
            "Llama 4",
            "Llama4ForConditionalGeneration",
            ("image",),
            in_make_test=False,
        ),
        Family(
            "gemma4",
            "gemma4",
            "Gemma 4",
            "Gemma4ForConditionalGeneration",
            ("image", "audio", "video"),
            "Audio unproven here: vLLM 0.32's CPU build fails its audio tower (oneDNN's matmul "
            "takes no transposed input), `vllm serve` as well.",
            in_make_test=False,
        ),
        Family(
            "gemma4-unified",
            "gemma4_unified",
            "Gemma 4 Unified",
            "Gemma4UnifiedForConditionalGeneration",
            ("image", "audio", "video"),
            in_make_test=False,
        ),
        Family(
            "glm-ocr",
            "glm_ocr",
            "GLM-OCR",
            "GlmOcrForConditionalGeneration",
            ("image", "video"),
            "One video per prompt (vLLM's limit for this model).",
            in_make_test=False,
        ),
        Family(
            "audio-flamingo3",
            "audio_flamingo3",
            "Audio Flamingo 3",
            "AudioFlamingo3ForConditionalGeneration",
            ("audio",),
            "One audio clip per prompt (vLLM's limit for this model).",
            in_make_test=False,
        ),
        Family(
            "glm-asr",
            "glm_asr",
            "GLM-ASR",
            "GlmAsrForConditionalGeneration",
            ("audio",),
            in_make_test=False,
        ),
        Family(
            "qwen3.5",
            "qwen3_5",
            "Qwen3.5",
            "Qwen3_5ForConditionalGeneration",
            ("image", "video"),
            "A hybrid (Gated DeltaNet + attention) language model: on the CPU build its engine "
            "keeps chunked prefill on, as vLLM requires for it.",
            in_make_test=False,
        ),
        Family(
            "qwen3.5-moe",
            "qwen3_5_moe",
            "Qwen3.5-MoE",
            "Qwen3_5MoeForConditionalGeneration",
            ("image", "video"),
            "A hybrid (Gated DeltaNet + attention) language model: on the CPU build its engine "
            "keeps chunked prefill on, as vLLM requires for it.",
            in_make_test=False,
        ),
        Family(
            "qwen3-omni-moe",
            "qwen3_omni_moe",
            "Qwen3-Omni (thinker)",
            "Qwen3OmniMoeForConditionalGeneration",
            ("image", "audio", "video"),
            "Text out only: vLLM serves the thinker; the tiny checkpoint has no talker or "
            "code2wav (vLLM skips their weights). A video's own audio track "
            "(`use_audio_in_video`) is untested.",
            in_make_test=False,
        ),
        Family(
            "qwen3-asr",
            "qwen3_asr",
            "Qwen3-ASR",
            "Qwen3ASRForConditionalGeneration",
            ("audio",),
            "The transformers layout (`Qwen/Qwen3-ASR-1.7B-hf`); the original `thinker.*` "
            "checkpoints load in vLLM too but are untested.",
            in_make_test=False,
        ),
        Family(
            "paddleocr-vl",
            "paddleocr_vl",
            "PaddleOCR-VL",
            "PaddleOCRVLForConditionalGeneration",
            ("image",),
            "Images only (vLLM serves no video for it).",
            in_make_test=False,
        ),
        Family(
            "qianfan-ocr",
            "qianfan_ocr",
            "Qianfan-OCR",
            "QianfanOCRForConditionalGeneration",
            ("image",),
            "Images only. vLLM reads the published InternVL-chat layout and tiles images with "
            "its own InternVL processor.",
            in_make_test=False,
        ),
        Family(
            "exaone4.5",
            "exaone4_5",
            "EXAONE 4.5",
            "Exaone4_5_ForConditionalGeneration",
            ("image", "video"),
            "A hybrid sliding-window language model; the multi-token-prediction head is skipped.",
            in_make_test=False,
        ),
        Family(
            "minicpm-v4.6",
            "minicpmv4_6",
            "MiniCPM-V 4.6",
            "MiniCPMV4_6ForConditionalGeneration",
            ("image", "video"),
            "A hybrid (Gated-DeltaNet + attention) Qwen3.5 language model.",
            in_make_test=False,
        ),
        Family(
            "minicpm-v4.7",
            "minicpmv4_7",
            "MiniCPM-V 4.7",
            "MiniCPMV4_7ForConditionalGeneration",
            ("image", "video"),
            "A hybrid (Gated-DeltaNet + attention) Qwen3.5 language model.",
            in_make_test=False,
        ),
        Family(
            "cohere-compass",
            "cohere_compass",
            "Cohere Compass (North Micro Vision)",
            "CohereCompassForConditionalGeneration",
            ("image",),
            "Images only (vLLM serves no video for it). Tested with the Command A chat template "
            "and Compass's image placeholder; the published template is untested.",
            in_make_test=False,
        ),
        Family(
            "muse-glimmer",
            "muse_glimmer",
            "Muse Glimmer",
            "MuseGlimmerForConditionalGeneration",
            ("image", "video"),
            "vLLM sizes images and videos with its own processor's fixed defaults. Its chat "
            "template must write an image as `<|patch|>`: the `<|image|>` of vLLM's built-in "
            "template fails every image chat in vLLM 0.32.",
            in_make_test=False,
        ),
        Family(
            "granite4-vision",
            "granite4_vision",
            "Granite 4 Vision",
            "Granite4VisionForConditionalGeneration",
            ("image",),
            "Images only. Image features are added into language-model layers (deepstack), "
            "not input embeddings. Tested with a Granite-style chat template writing each "
            "image as `<image>`; the published template is untested.",
            in_make_test=False,
        ),
    )
}


def module_path(name: str) -> Path:
    """The source file of family ``name``'s builder."""
    return Path(__file__).with_name(FAMILIES[name].module + ".py")


def module_paths(name: str) -> list[Path]:
    """Family ``name``'s builder and the family builders it imports (GLM-4.5V builds on
    GLM-4.1V's): the sources its build fingerprint hashes, so an edit to a builder another
    builds on rebuilds both."""
    found, todo = [module_path(name)], [module_path(name)]
    while todo:
        text = todo.pop().read_text(encoding="utf-8")
        for line in re.findall(r"^from tools\.tiny_families import (.+)$", text, re.M):
            for module in line.split(","):
                path = found[0].with_name(f"{module.strip()}.py")
                if module.strip() != "common" and path not in found:
                    found.append(path)
                    todo.append(path)
    return found


def builder(name: str) -> Callable[[Path], None]:
    """Family ``name``'s ``build(out_dir)``."""
    module = importlib.import_module(f"tools.tiny_families.{FAMILIES[name].module}")
    build: Callable[[Path], None] = module.build
    return build

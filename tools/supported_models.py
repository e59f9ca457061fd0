"""Write the "Supported models" table of docs/models.md from the suites' parameters.

The families and their modalities come from ``tools.tiny_families`` (what the family parity
suite runs) and the Qwen models' own suites; ``python -m tools.supported_models`` rewrites the
table between its markers, and a unit test fails when the page and the suites disagree.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.tiny_families import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "models.md"
BEGIN = "<!-- supported-models:begin (python -m tools.supported_models) -->"
END = "<!-- supported-models:end -->"

FAMILY_SUITE = "`test_family_parity` (door, client, render)"
IN_MAKE_TEST = f"`make test`: {FAMILY_SUITE}"
IN_MAKE_TEST_FAMILIES = f"`make test-families`: {FAMILY_SUITE}"


TORCHAUDIO = (
    "Its processor needs `torchaudio`, and PyPI holds none for the torch vLLM's CPU build "
    "pins here (torch 2.13; the newest torchaudio is 2.11)."
)


@dataclass(frozen=True)
class Row:
    title: str
    architecture: str
    modalities: tuple[str, ...]
    tested: str
    notes: str = ""


# The Qwen models the project started from, each with suites of its own.
QWEN_ROWS = (
    Row(
        "Qwen2-VL",
        "Qwen2VLForConditionalGeneration",
        ("image", "video"),
        "`make test`: `test_openai_equivalence`, `test_render_parity`, `test_video_parity`, "
        "every fleet suite",
        "The default model of `make run` and of most suites.",
    ),
    Row(
        "Qwen2.5-VL",
        "Qwen2_5_VLForConditionalGeneration",
        ("image", "video"),
        IN_MAKE_TEST,
    ),
    Row(
        "Qwen3-VL",
        "Qwen3VLForConditionalGeneration",
        ("image", "video"),
        "`make test`: `test_render_parity`, `test_video_parity`",
    ),
    Row(
        "Qwen2-Audio",
        "Qwen2AudioForConditionalGeneration",
        ("audio",),
        "`make test`: `test_render_parity`, `test_audio_parity`",
    ),
)


def rows() -> list[Row]:
    families = [
        Row(
            f.title,
            f.architecture,
            f.modalities,
            IN_MAKE_TEST if f.in_make_test else IN_MAKE_TEST_FAMILIES,
            f.notes,
        )
        for f in FAMILIES.values()
    ]
    return [*QWEN_ROWS, *families]


def table() -> str:
    lines = [
        "| Family | vLLM architecture | Inputs | Proven by | Notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows():
        inputs = ", ".join(r.modalities)
        lines.append(f"| {r.title} | `{r.architecture}` | {inputs} | {r.tested} | {r.notes} |")
    lines += [
        "",
        "Not proven here (vLLM 0.32 serves them and transformers 5 holds their processor and "
        "config, but a tiny checkpoint of them cannot be served here, for the reason given):",
        "",
        "| vLLM architecture | Why |",
        "| --- | --- |",
    ]
    lines += [f"| `{arch}` | {why} |" for arch, why in sorted(UNTESTED.items())]
    return "\n".join(lines)


UNTESTED: dict[str, str] = {
    "CohereAsrForConditionalGeneration": (
        "vLLM reads the original NeMo-style config (`encoder`, `transf_decoder`, `head`) and "
        "weight names, not transformers' `CohereAsrConfig`; transcription only (no chat route)."
    ),
    "Cosmos3EdgeForConditionalGeneration": (
        "vLLM reads `projector_config` attributes and the Diffusers weight layout, which "
        "transformers' `Cosmos3EdgeConfig` does not hold."
    ),
    "DiffusionGemmaForBlockDiffusion": (
        "vLLM serves diffusion models on its V2 model runner only, which needs Triton; the CPU "
        "build falls back to V1, which refuses them."
    ),
    "Ernie4_5_VLMoeForConditionalGeneration": (
        "vLLM's model reads the PaddlePaddle checkpoint's remote-code config and processor "
        "(`spatial_conv_size`, `grid_thw`), which transformers' classes do not hold."
    ),
    "Glm5NextForConditionalGeneration": (
        "Sparse attention (`index_topk`, which transformers requires) is not supported by "
        "vLLM's CPU build."
    ),
    "GraniteSpeechForConditionalGeneration": TORCHAUDIO,
    "GraniteSpeechPlusForConditionalGeneration": TORCHAUDIO,
    "MiniMaxM3SparseForConditionalGeneration": (
        "Its RMSNorm calls flashinfer, which is CUDA only (not in vLLM's CPU build)."
    ),
    "NemotronH_Omni_Reasoning_V3": (
        "vLLM reads `vit_hidden_size`, which transformers' config renames on load: no "
        "`config.json` both read without remote code."
    ),
    "Qwen4ExpForConditionalGeneration": "vLLM serves it on CUDA and ROCm only.",
    "Step3p7ForConditionalGeneration": (
        "vLLM reads the vision config's original names (`width`, `heads`, `layers`), which "
        "transformers' `Step3p7VisionConfig` renames on load."
    ),
    "VoxtralForConditionalGeneration": (
        "Mistral format only (`tekken.json`): the door's start-up fails on a `MistralTokenizer` "
        "(its template probe), and render's media tokens reach `mistral_common`, which decodes "
        "audio itself. Open."
    ),
    "WhisperForConditionalGeneration": (
        "Transcription only: `vllm serve` has no chat route for it (404; the door: 400, no chat "
        "template), and the door has no `/v1/audio/transcriptions`. Open."
    ),
}
"""Every multimodal architecture of vLLM's registry that transformers holds natively and no
row above proves, with why (a unit test keeps the two lists whole)."""


def rendered(page: str) -> str:
    """``page`` with the table between its markers replaced by the current one."""
    head, found, rest = page.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"{PAGE} lacks the table's markers")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    new = rendered(page)
    if args.check:
        return 0 if new == page else 1
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

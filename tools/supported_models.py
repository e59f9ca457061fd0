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
        "`test_openai_equivalence`, `test_render_parity`, `test_video_parity`, every fleet suite",
        "The default model of `make run` and of most suites.",
    ),
    Row(
        "Qwen2.5-VL",
        "Qwen2_5_VLForConditionalGeneration",
        ("image", "video"),
        FAMILY_SUITE,
    ),
    Row(
        "Qwen3-VL",
        "Qwen3VLForConditionalGeneration",
        ("image", "video"),
        "`test_render_parity`, `test_video_parity`",
    ),
    Row(
        "Qwen2-Audio",
        "Qwen2AudioForConditionalGeneration",
        ("audio",),
        "`test_render_parity`, `test_audio_parity`",
    ),
)


def rows() -> list[Row]:
    families = [
        Row(f.title, f.architecture, f.modalities, FAMILY_SUITE, f.notes) for f in FAMILIES.values()
    ]
    return [*QWEN_ROWS, *families]


def table() -> str:
    lines = [
        "| Family | vLLM architecture | Inputs | Tested in CI | Notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows():
        inputs = ", ".join(r.modalities)
        lines.append(f"| {r.title} | `{r.architecture}` | {inputs} | {r.tested} | {r.notes} |")
    return "\n".join(lines)


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

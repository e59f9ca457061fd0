"""The fenced code blocks of README.md and docs/, and what each fence promises a test does."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUN = "python"
"""Run by a test: in-process, or against the test fleet after a ``<!-- example: fleet -->``."""
PARSED = "json"
"""Parsed as JSON by a test (request bodies and content parts)."""
COMMANDS = "sh"
"""Commands a user types, each checked by a test (make targets, service flags, files)."""
SHOWN = frozenset({"text", "console"})
"""Output, diagrams and transcripts: shown, never run."""
FENCES = frozenset({RUN, PARSED, COMMANDS}) | SHOWN

FLEET = "fleet"
MARKER = re.compile(r"<!--\s*example:\s*(\S+)\s*-->")
FENCE = re.compile(r"^(\s*)(```+)(.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its fence's language and the example marker before it."""

    path: Path
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown page of the site (the generated bench report included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, in order (indented fences, in lists, too)."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = m.groups()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        previous = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        marker = MARKER.search(previous)
        lang = info.strip().split()[0] if info.strip() else ""
        found.append(
            Block(
                path, start + 1, lang, "\n".join(body) + "\n", marker.group(1) if marker else None
            )
        )
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path)]


def python_blocks(marker: str | None) -> list[Block]:
    """The Python examples run in-process (``marker=None``) or against the fleet (``FLEET``)."""
    return [b for b in all_blocks() if b.lang == RUN and b.marker == marker]


def commands(block: Block) -> list[str]:
    """The command lines of a shell block: comments dropped, continuations joined."""
    text = re.sub(r"\\\n\s*", " ", block.code)
    out = []
    for line in text.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out

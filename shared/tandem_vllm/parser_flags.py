"""The chat template and tool/reasoning parser flags, shared by render and the front door.

Both build vLLM's derender from them (``tandem_vllm.derender``), so an operator gives both the
same values; the names and meanings are vLLM's own. No vLLM import: ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["TOOL_STRICT_LEVELS", "add_parser_flags", "check_parser_flags"]

TOOL_STRICT_LEVELS = ("auto", "function", "parameter")


def add_parser_flags(
    p: argparse.ArgumentParser, tool_strict_level: str, cohere_format: Any
) -> None:
    """Add the flags; ``tool_strict_level`` and ``cohere_format`` are the defaults shown."""
    p.add_argument(
        "--chat-template", help="a chat template file or string to use instead of the model's"
    )
    p.add_argument(
        "--tool-call-parser",
        help="vLLM's tool-call parser (e.g. hermes): derender answers tool_calls, render takes "
        "tool_choice auto with --enable-auto-tool-choice (default: none)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=None,
        help="take tool_choice auto (needs --tool-call-parser), as vLLM's option",
    )
    p.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action="store_true",
        default=None,
        help="leave tool definitions out of the prompt when tool_choice is none, as vLLM's",
    )
    p.add_argument(
        "--tool-strict-level",
        choices=list(TOOL_STRICT_LEVELS),
        help="vLLM's server-side floor for structural-tag tool calling "
        f"(default: {tool_strict_level})",
    )
    p.add_argument(
        "--reasoning-parser",
        help="vLLM's reasoning parser (e.g. deepseek_r1, qwen3): derender answers "
        "reasoning_content (default: none)",
    )
    p.add_argument(
        "--default-chat-template-kwargs",
        type=json.loads,
        help="chat template kwargs every request starts from, as JSON, e.g. "
        "'{\"enable_thinking\": false}' (default: none)",
    )
    p.add_argument(
        "--cohere-format",
        help="Cohere prompt format (cmd4 or cmd3) added to the default chat template kwargs, "
        f"as vLLM's option (default: {cohere_format})",
    )


def check_parser_flags(p: argparse.ArgumentParser, args: dict[str, Any]) -> None:
    """Refuse what vLLM refuses."""
    if args["enable_auto_tool_choice"] and not args["tool_call_parser"]:
        p.error("--enable-auto-tool-choice requires --tool-call-parser")

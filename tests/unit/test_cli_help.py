"""Every option of the services' command lines says what it does in ``--help``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest


class _Built(Exception):
    """Raised instead of parsing, carrying the parser that ``parse_args`` built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(
    parse_args: Callable[[list[str]], object], parser_class: type, monkeypatch
) -> argparse.ArgumentParser:
    def capture(self, *args, **kwargs):
        raise _Built(self)

    monkeypatch.setattr(parser_class, "parse_args", capture)
    with pytest.raises(_Built) as built:
        parse_args([])
    return built.value.parser


def _without_help(actions) -> dict[str, str | None]:
    """Option name -> help, for the options whose help is missing or blank."""
    return {
        a.option_strings[0]: a.help
        for a in actions
        if not isinstance(a, argparse._HelpAction)
        and (not a.help or a.help == argparse.SUPPRESS or not a.help.strip())
    }


def test_every_render_option_has_help(monkeypatch):
    from tandem_render.__main__ import parse_args

    parser = _parser_of(parse_args, argparse.ArgumentParser, monkeypatch)
    assert len(parser._actions) > 20  # the real parser, not an empty one
    assert _without_help(parser._actions) == {}
    parser.format_help()  # every help string formats (a stray % would raise here)


@pytest.mark.vllm
def test_every_tandem_generate_option_has_help(monkeypatch):
    # Only Tandem's own group: vLLM's engine options and their help come from vLLM.
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tandem_generate.__main__ import parse_args

    parser = _parser_of(parse_args, FlexibleArgumentParser, monkeypatch)
    (ours,) = [g for g in parser._action_groups if g.title == "tandem generate"]
    assert ours.description
    assert len(ours._group_actions) >= 8
    assert _without_help(ours._group_actions) == {}
    parser.format_help()


def test_every_front_door_option_has_help(monkeypatch):
    from tandem_front.__main__ import parse_args

    parser = _parser_of(parse_args, argparse.ArgumentParser, monkeypatch)
    assert len(parser._actions) > 15
    assert _without_help(parser._actions) == {}
    parser.format_help()


@pytest.mark.vllm
def test_enable_mm_embeds_reaches_both_services(qwen2_dir):
    # Render's own flag, and vLLM's engine option on generate (which the service reads back).
    from tandem_generate.__main__ import parse_args as generate_args
    from tandem_render.__main__ import parse_args as render_args

    assert render_args(["--model", "m", "--enable-mm-embeds"]).enable_mm_embeds is True
    assert render_args(["--model", "m"]).enable_mm_embeds is False
    assert generate_args(["--model", qwen2_dir, "--enable-mm-embeds"])[1].enable_mm_embeds
    assert not generate_args(["--model", qwen2_dir])[1].enable_mm_embeds

"""Every option of the services' command lines has ``--help`` text and is on its docs page."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

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


# -- every option is documented on its service's page ------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _undocumented(actions, page: str) -> list[str]:
    text = (DOCS / page).read_text()
    return [
        option
        for a in actions
        if not isinstance(a, argparse._HelpAction)
        for option in a.option_strings
        if option.startswith("--") and f"`{option}" not in text and f"{option}`" not in text
    ]


def test_every_render_option_is_on_the_render_page(monkeypatch):
    from tandem_render.__main__ import parse_args

    parser = _parser_of(parse_args, argparse.ArgumentParser, monkeypatch)
    assert _undocumented(parser._actions, "render.md") == []


def test_every_front_door_option_is_on_its_page(monkeypatch):
    from tandem_front.__main__ import parse_args

    parser = _parser_of(parse_args, argparse.ArgumentParser, monkeypatch)
    assert _undocumented(parser._actions, "front-door.md") == []


@pytest.mark.vllm
def test_every_tandem_generate_option_is_on_the_generate_page(monkeypatch):
    # vLLM's engine options are vLLM's to document; Tandem's own group is documented here.
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tandem_generate.__main__ import parse_args

    parser = _parser_of(parse_args, FlexibleArgumentParser, monkeypatch)
    (ours,) = [g for g in parser._action_groups if g.title == "tandem generate"]
    assert _undocumented(ours._group_actions, "generate.md") == []


@pytest.mark.vllm
def test_admin_keys_from_flags_or_the_environment(qwen2_dir, monkeypatch):
    # Several keys: the flag repeated or listed, or the variable comma-separated.
    from tandem_front.__main__ import parse_args as front_args
    from tandem_generate.__main__ import parse_args as generate_args

    door = ["--render", "http://r", "--generate", "http://g", "--model", "m"]
    node = ["--model", qwen2_dir]
    monkeypatch.delenv("TANDEM_ADMIN_API_KEY", raising=False)
    assert front_args(door).admin_api_key == ()
    assert generate_args(node)[0].admin_api_key == ()
    flags = ["--admin-api-key", "a1", "a2", "--admin-api-key", "a3"]
    assert front_args([*door, *flags]).admin_api_key == ("a1", "a2", "a3")
    assert generate_args([*node, *flags])[0].admin_api_key == ("a1", "a2", "a3")
    monkeypatch.setenv("TANDEM_ADMIN_API_KEY", " e1, e2 ,")
    monkeypatch.setenv("TANDEM_UPSTREAM_ADMIN_API_KEY", "up")
    assert front_args(door).admin_api_key == ("e1", "e2")
    assert front_args(door).upstream_admin_api_key == "up"
    assert generate_args(node)[0].admin_api_key == ("e1", "e2")
    assert generate_args([*node, "--admin-api-key", "f"])[0].admin_api_key == ("f",)


SCRIPTS = {
    "tandem-render": "tandem_render",
    "tandem-generate": "tandem_generate",
    "tandem-front": "tandem_front",
}


def test_each_service_is_installed_as_a_command():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {
        script: f"{module}.__main__:main" for script, module in SCRIPTS.items()
    }


@pytest.mark.vllm
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_the_installed_command_starts_its_service(script):
    # As a user runs it: the script pip wrote into the environment, its usage naming itself.
    import subprocess
    import sys

    exe = Path(sys.executable).parent / script
    assert exe.is_file(), f"{script} is not installed: rerun make setup"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"usage: {script} "), out.stdout[:200]


def test_python_dash_m_keeps_its_usage_line(monkeypatch):
    from tandem_http import program_name

    monkeypatch.setattr("sys.argv", ["/x/tandem_render/__main__.py"])
    assert program_name("tandem_render") == "python -m tandem_render"
    monkeypatch.setattr("sys.argv", ["/venv/bin/tandem-render"])
    assert program_name("tandem_render") == "tandem-render"

"""Every code block of README.md and docs/ is run, parsed, checked, or marked as output; the
in-process Python examples run here (the fleet ones in tests/integration/test_docs_examples.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from ..support.doc_examples import (
    COMMANDS,
    FENCES,
    FLEET,
    PARSED,
    ROOT,
    RUN,
    Block,
    all_blocks,
    blocks,
    commands,
    doc_files,
    python_blocks,
)

SERVICES = ("tandem_render", "tandem_generate", "tandem_front")


def test_every_block_is_run_checked_or_marked_as_output():
    unmarked = [f"{b.name} ```{b.lang}" for b in all_blocks() if b.lang not in FENCES]
    assert unmarked == [], "fence each block as python, json, sh, text or console"
    misplaced = [b.name for b in all_blocks() if b.marker is not None and b.lang != RUN]
    assert misplaced == [], "<!-- example: ... --> marks a python block"
    unknown = [b.name for b in all_blocks() if b.marker not in (None, FLEET)]
    assert unknown == [], f"the one example marker is <!-- example: {FLEET} -->"


def test_the_collector_sees_fences_markers_and_indented_blocks(tmp_path):
    # The rule above is only as strong as the parsing under it.
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: fleet -->\n```python\nprint(1)\n```\n\n- item\n\n  ```sh\n  make run"
        "   # serve\n  ```\n\n```bash\nls\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.marker, b.line) for b in found] == [
        ("python", "fleet", 2),
        ("sh", None, 8),
        ("bash", None, 12),
    ]
    assert commands(found[1]) == ["make run"]


def test_docs_hold_examples_of_each_kind():
    # A collector that found nothing would pass every other test here.
    langs = [b.lang for b in all_blocks()]
    assert langs.count(RUN) >= 8 and PARSED in langs and COMMANDS in langs
    assert len(python_blocks(None)) >= 2 and len(python_blocks(FLEET)) >= 5


@pytest.mark.parametrize("block", python_blocks(None), ids=lambda b: b.name)
def test_python_example_runs(block: Block, monkeypatch):
    monkeypatch.chdir(ROOT)
    exec(compile(block.code, block.name, "exec"), {"__name__": "__docs_example__"})


@pytest.mark.parametrize(
    "block", [b for b in all_blocks() if b.lang == PARSED], ids=lambda b: b.name
)
def test_json_example_parses(block: Block):
    json.loads(block.code)


# -- shell blocks ----------------------------------------------------------------------------------


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def without_assignments(argv: list[str]) -> list[str]:
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv = argv[1:]
    return argv


def service_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """``[.venv/bin/]python -m MODULE ARGS`` or ``[.venv/bin/]tandem-NAME ARGS`` (the installed
    command) -> (module, args)."""
    if len(argv) >= 3 and Path(argv[0]).name == "python" and argv[1] == "-m":
        return argv[2], argv[3:]
    script = Path(argv[0]).name.replace("-", "_")
    if script in SERVICES:
        return script, argv[1:]
    return None


def check_command(argv: list[str], generate_model: str | None) -> None:
    argv = without_assignments(argv)
    if argv[0] == "make":
        targets = [a for a in argv[1:] if "=" not in a]
        assert targets and set(targets) <= make_targets(), f"no such make target: {argv}"
        return
    if argv[:2] == ["docker", "compose"]:
        compose = yaml.safe_load((ROOT / argv[argv.index("-f") + 1]).read_text())
        profiles = {p for s in compose["services"].values() for p in s.get("profiles", [])}
        assert argv[argv.index("--profile") + 1] in profiles
        return
    if argv[:3] == ["kubectl", "apply", "-k"]:
        assert (ROOT / argv[3] / "kustomization.yaml").is_file()
        return
    module_args = service_args(argv)
    assert module_args is not None, f"not a command this test knows how to check: {argv}"
    module, args = module_args
    assert module in SERVICES, f"not a service: {module}"
    if module == "tandem_render":
        from tandem_render.__main__ import parse_args

        parse_args(args)
    elif module == "tandem_front":
        from tandem_front.__main__ import parse_args as parse_front

        parse_front(args)
    else:
        from tandem_generate.__main__ import parse_args as parse_generate

        assert generate_model is not None
        # The placeholder model folder is the tiny model (vLLM reads its config while parsing).
        at = args.index("--model") + 1
        settings, engine = parse_generate([*args[:at], generate_model, *args[at + 1 :]])
        assert engine.model == generate_model


def shell_blocks(generate: bool) -> list[Block]:
    return [
        b
        for b in all_blocks()
        if b.lang == COMMANDS
        and any(name in b.code for name in ("tandem_generate", "tandem-generate")) == generate
    ]


@pytest.mark.parametrize("block", shell_blocks(generate=False), ids=lambda b: b.name)
def test_shell_commands_are_real(block: Block):
    for line in commands(block):
        check_command(shlex.split(line), None)


@pytest.mark.vllm
@pytest.mark.parametrize("block", shell_blocks(generate=True), ids=lambda b: b.name)
def test_generate_command_lines_parse(block: Block, qwen2_dir):
    for line in commands(block):
        check_command(shlex.split(line), qwen2_dir)


def test_a_wrong_command_is_caught():
    with pytest.raises(AssertionError):
        check_command(["make", "no-such-target"], None)
    with pytest.raises(SystemExit):
        check_command(["python", "-m", "tandem_render", "--model", "m", "--no-such-flag"], None)
    with pytest.raises(AssertionError):
        check_command(["curl", "http://127.0.0.1:8000/health"], None)


# -- links -----------------------------------------------------------------------------------------


def test_readme_is_the_front_page_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    # mkdocs checks the site's links (make docs, strict); the README is not part of the site.
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme):
        if not re.match(r"https?://", target):
            assert (ROOT / target).exists(), f"README links to a missing {target}"


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in doc_files() if p.name != "README.md"}
    missing = sorted(p for p in pages if f": {p}" not in nav)
    assert missing == []

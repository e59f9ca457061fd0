"""The examples and `make demo`, run as a user would, against the real services."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_example_mm_serve(fleet):
    _, urls = fleet
    done = run(
        "examples/example_mm_serve.py",
        "--render-url",
        urls["render"],
        "--generate-url",
        urls["generate"],
        "--max-tokens",
        "6",
    )
    assert "generated token ids: [" in done.stderr and done.stdout.strip()


def test_example_mm_serve_works_against_upstream_too(fleet):
    _, urls = fleet
    run(
        "examples/example_mm_serve.py",
        "--render-url",
        urls["up_render"],
        "--generate-url",
        urls["up_serve"],
    )


def test_grpo_rollout_example(fleet):
    _, urls = fleet
    done = run(
        "examples/grpo_rollout.py",
        "--render-url",
        urls["render"],
        "--generate-url",
        urls["generate"],
        "--n",
        "2",
        "--max-tokens",
        "5",
    )
    lines = done.stdout.splitlines()
    assert sum(line.startswith("prompt ") for line in lines) == 3
    assert sum("advantage" in line for line in lines) == 6


def test_make_demo_starts_the_stack_runs_the_examples_and_stops():
    run(
        "-m",
        "tools.run_stack",
        "--demo",
        "--render-port",
        str(free_port()),
        "--generate-port",
        str(free_port()),
        "--front-port",
        str(free_port()),
        "--render-workers",
        "1",
        timeout=900,
    )

"""The examples and `make demo`, run as a user would, against the real services."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
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


def test_example_mm_serve_with_a_video(fleet):
    _, urls = fleet
    done = run(
        "examples/example_mm_serve.py",
        "--media",
        "video",
        "--render-url",
        urls["render"],
        "--generate-url",
        urls["generate"],
        "--max-tokens",
        "6",
    )
    assert "video at {" in done.stderr and "generated token ids: [" in done.stderr


def test_example_mm_serve_works_against_upstream_too(fleet):
    _, urls = fleet
    run(
        "examples/example_mm_serve.py",
        "--render-url",
        urls["up_render"],
        "--generate-url",
        urls["up_serve"],
    )


def test_grpo_rollout_example(fleet, weight_dir):
    _, urls = fleet
    done = run(
        "examples/grpo_rollout.py",
        "--render-url",
        urls["render"],
        "--generate-url",
        urls["generate"],
        "--weight-dir",
        weight_dir,
        "--n",
        "2",
        "--max-tokens",
        "5",
        "--steps",
        "2",
    )
    lines = done.stdout.splitlines()
    # Three rollouts (before and after each of two updates), each naming its weights.
    assert [line for line in lines if line.startswith("== rollout")] == [
        "== rollout 0: weight version default",
        "== rollout 1: weight version step-1",
        "== rollout 2: weight version step-2",
    ]
    assert sum(line.startswith("prompt ") for line in lines) == 9
    assert sum("advantage" in line for line in lines) == 18
    assert lines[-1] == "== original weights restored (weight version default)"
    info = httpx.get(f"{urls['generate']}/weight_info").json()
    assert info == {"weight_version": "default"}


def test_make_demo_starts_the_stack_runs_the_examples_and_stops():
    done = run(
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
    # examples/image_embeds.py: the vision tower's embeddings give the image's own tokens.
    assert "same tokens: True" in done.stdout

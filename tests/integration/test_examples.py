"""The examples and `make demo`, run as a user would, against the real services."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tandem_client import TandemClient
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


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grpo_rollout_example_trains_and_updates_both_nodes(fleet, front_door, weight_dir):
    """A real AdamW step on the tiny model reaches both generate nodes behind the door: each
    reports the new version and answers the example's first prompt with new greedy tokens."""
    from safetensors.torch import load_file
    from transformers import AutoProcessor

    model, _ = fleet
    door, nodes = front_door
    grpo = load_example("grpo_rollout")
    prompts, images = grpo.batch(AutoProcessor.from_pretrained(model))
    sent = [[grpo.png(im) for im in images[0]]]

    def greedy(node: str) -> list[int]:
        # Rendered by the door, generated on this one node.
        with TandemClient(door, node) as client:
            out = client.rollout(
                prompts[:1], sent, model=model, n=1, temperature=0.0, max_tokens=8, **grpo.ROLLOUT
            )
        return list(out.completion_ids[0])

    before = {node: greedy(node) for node in nodes}
    assert before[nodes[0]] == before[nodes[1]]
    try:
        done = run(
            "examples/grpo_rollout.py",
            "--url",
            door,
            "--weight-dir",
            weight_dir,
            "--n",
            "4",
            "--max-tokens",
            "8",
            "--steps",
            "1",
            "--keep-weights",
        )
        lines = done.stdout.splitlines()
        assert [line for line in lines if line.startswith("== rollout")] == [
            "== rollout 0: weight version default (12 of 12 completions)",
            "== rollout 1: weight version step-1 (12 of 12 completions)",
        ]
        assert sum("reward/advantage" in line for line in lines) == 6
        printed = next(line for line in lines if line.startswith("greedy after (step-1): "))
        for node in nodes:
            assert httpx.get(f"{node}/weight_info").json()["weight_version"] == "step-1"
            after = greedy(node)
            assert after != before[node], node
            assert printed.startswith(f"greedy after (step-1): {after} "), (node, printed)
        assert "greedy tokens changed: True" in lines
    finally:
        original = load_file(str(Path(model) / "model.safetensors"))
        with TandemClient(door, door, weight_dir=weight_dir) as client:
            client.update_weights(original, version="default")
    assert {node: greedy(node) for node in nodes} == before


@pytest.mark.own_fleet  # two engines of its own: before the session's shared ones exist
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
    # examples/grpo_rollout.py: trained, both generate nodes updated, greedy tokens changed.
    assert "== rollout 1: weight version step-1 (12 of 12 completions)" in done.stdout
    assert "-> step-2 on 2 nodes" in done.stdout
    assert "greedy tokens changed: True" in done.stdout

"""The README's and docs' Python examples marked ``<!-- example: fleet -->``, run as a user runs
them against `make run`, here against the session fleet: render, generate and the front door."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from ..support.doc_examples import FLEET, ROOT, Block, python_blocks

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.engine]

MAKE_RUN = {
    "front": "http://127.0.0.1:8000",
    "render": "http://127.0.0.1:8100",
    "generate": "http://127.0.0.1:8200",
    "weight_dir": ".cache/weight-transfer",
}
"""What the examples name (`make run`'s URLs and weight folder), pointed at the fleet's."""


def pointed_at(code: str, fleet_places: dict[str, str]) -> str:
    for name, default in MAKE_RUN.items():
        code = code.replace(default, fleet_places[name])
    return code


@pytest.mark.parametrize("block", python_blocks(FLEET), ids=lambda b: b.name)
def test_fleet_example_runs(block: Block, fleet, front_door, weight_dir):
    _, urls = fleet
    places = {
        "front": front_door[0],
        "render": urls["render"],
        "generate": urls["generate"],
        "weight_dir": weight_dir,
    }
    code = pointed_at(block.code, places)
    assert code != block.code, f"{block.name} names none of make run's URLs"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{block.name}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert done.stdout.strip(), f"{block.name} printed nothing"
    finally:
        # An example that updates weights leaves the fleet as the other tests expect it.
        for url in (urls["generate"], front_door[1][1]):
            httpx.post(f"{url}/resume", timeout=30)
            httpx.post(f"{url}/update_weight_version", json={"new_version": "default"}, timeout=30)

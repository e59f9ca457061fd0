"""A spy on vLLM's NCCL weight-transfer rendezvous in a server process (see sitecustomize.py
here): the environment that turns it on, and what it recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .sitecustomize import FILE_ENV

__all__ = ["spy_env", "spied"]

HERE = Path(__file__).parent


def spy_env(record_to: Path) -> dict[str, str]:
    """The environment of a server process whose workers record to ``record_to`` the rank and
    world size they would join the trainer's NCCL group with, instead of joining it."""
    path = os.environ.get("PYTHONPATH", "")
    return {
        "PYTHONPATH": f"{HERE}{os.pathsep}{path}" if path else str(HERE),
        FILE_ENV: str(record_to),
    }


def spied(record_to: Path) -> list[dict[str, Any]]:
    """Every rendezvous recorded (one per worker per init), in order."""
    if not record_to.exists():
        return []
    return [json.loads(line) for line in record_to.read_text().splitlines() if line]

"""An engine server's CPU split into work and vLLM's busy-wait, and its steps per request.

vLLM's engine core and its worker wait for each other on shared-memory queues that spin
(``sched_yield``) for a second after every message: under load the worker's process fills its
core whatever it computes, so its CPU per request reads one core over the throughput, not the
engine's work. The servers a benchmark starts with ``engine_env`` time that wait
(``tools/engine_clock/sitecustomize.py``); ``EngineSplit`` reads it back, with the engine's
steps (``vllm:iteration_tokens_total``'s count), so a per-request figure says what the engine
did: CPU less the wait, and how many steps the scheduler ran for it (fewer requests in each
batch, more steps, more of the steps' fixed cost).
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from tools.servers import VLLM_DEFAULT_BINDING, ServerProcess

__all__ = ["EngineSplit", "engine_env", "new_clock_dir"]

CLOCK_PATH = Path(__file__).resolve().parent / "engine_clock"
STEPS_METRIC = "vllm:iteration_tokens_total_count"


def new_clock_dir() -> str:
    return tempfile.mkdtemp(prefix="tandem-engine-clock-")


def engine_env(clock_dir: str) -> dict[str, str]:
    """An engine server's environment: vLLM's default OpenMP binding (as a user's), and the
    queue clock loaded in each of its processes, writing into ``clock_dir``."""
    path = os.pathsep.join(p for p in (str(CLOCK_PATH), os.environ.get("PYTHONPATH")) if p)
    return {**VLLM_DEFAULT_BINDING, "TANDEM_ENGINE_CLOCK_DIR": clock_dir, "PYTHONPATH": path}


@dataclass(frozen=True)
class EngineSplit:
    """One engine server's counters at one moment (seconds of CPU, steps)."""

    core_s: float
    core_wait_s: float
    worker_s: float
    worker_wait_s: float
    steps: float

    @classmethod
    def read(cls, server: ServerProcess, clock_dir: str) -> EngineSplit:
        """The engine core is the server's child, its worker a grandchild (vLLM's CPU
        executor); with several workers, their sums."""
        core = core_wait = worker = worker_wait = 0.0
        for child in psutil.Process(server.proc.pid).children():
            core += _cpu(child)
            core_wait += _waited(clock_dir, child.pid)
            for grandchild in child.children(recursive=True):
                worker += _cpu(grandchild)
                worker_wait += _waited(clock_dir, grandchild.pid)
        return cls(core, core_wait, worker, worker_wait, _steps(server))

    def per_request(self, before: EngineSplit, requests: int) -> dict[str, float]:
        """ms per request over ``requests`` since ``before`` (steps: per request)."""
        n = max(1, requests)

        def ms(now: float, then: float) -> float:
            return (now - then) / n * 1000

        worker = ms(self.worker_s, before.worker_s)
        worker_wait = ms(self.worker_wait_s, before.worker_wait_s)
        core = ms(self.core_s, before.core_s)
        core_wait = ms(self.core_wait_s, before.core_wait_s)
        return {
            "worker": worker,
            "worker waiting": worker_wait,
            "worker work": worker - worker_wait,
            "core": core,
            "core waiting": core_wait,
            "core work": core - core_wait,
            "steps": (self.steps - before.steps) / n,
        }


def _cpu(process: psutil.Process) -> float:
    t = process.cpu_times()
    return float(t.user + t.system)


_LAYOUT = struct.Struct("<ddqq")
"""The clock file's layout (``tools/engine_clock/sitecustomize.py``)."""


def _waited(clock_dir: str, pid: int) -> float:
    """CPU seconds the process has spent in vLLM's queue reads, the one under way included
    (0 for a process that never read one)."""
    try:
        raw = (Path(clock_dir) / f"{pid}.clock").read_bytes()[: _LAYOUT.size]
    except FileNotFoundError:
        return 0.0
    wait_s, open_since, thread, _ = _LAYOUT.unpack(raw)
    if open_since < 0:
        return float(wait_s)
    times = {t.id: float(t.user_time + t.system_time) for t in psutil.Process(pid).threads()}
    under_way = times.get(thread, open_since) - open_since
    return float(wait_s + max(0.0, under_way))


def _steps(server: ServerProcess) -> float:
    text = server.get("/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == STEPS_METRIC
    )

"""The benchmarks' split of an engine's CPU into work and vLLM's busy-wait: the queue clock
each engine process keeps (tools/engine_clock) and the per-request figures read from it."""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tools.engine_split import CLOCK_PATH, EngineSplit, _waited, engine_env


def _clock_module() -> ModuleType:
    """The sitecustomize the engine servers load, imported here without its import hook (no
    TANDEM_ENGINE_CLOCK_DIR in this process)."""
    assert "TANDEM_ENGINE_CLOCK_DIR" not in os.environ
    spec = importlib.util.spec_from_file_location("engine_clock", CLOCK_PATH / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _Queue:
    """Stands in for vLLM's MessageQueue: each dequeue burns CPU until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def dequeue(self) -> str:
        while not self.release.is_set():
            _spin(0.002)
        return "message"


def test_the_clock_counts_finished_reads_and_the_one_under_way(tmp_path: Path) -> None:
    clock = _clock_module()
    queues = SimpleNamespace(MessageQueue=_Queue)
    clock._instrument(queues, clock._Clock(str(tmp_path)))
    queue = _Queue()
    pid = os.getpid()
    assert _waited(str(tmp_path), pid) == 0.0

    queue.release.set()
    assert queue.dequeue() == "message"  # a finished read: counted, however short
    after_one = _waited(str(tmp_path), pid)

    queue.release.clear()
    reader = threading.Thread(target=queue.dequeue)
    reader.start()
    try:
        # The read under way is held open; its CPU shows before it returns.
        deadline = time.monotonic() + 30
        while _waited(str(tmp_path), pid) < after_one + 0.05:
            assert time.monotonic() < deadline, "the open read's CPU never showed"
            time.sleep(0.01)
    finally:
        queue.release.set()
        reader.join()
    total = _waited(str(tmp_path), pid)
    assert total >= after_one + 0.05
    # Closed again: the count stands still while nothing reads.
    time.sleep(0.05)
    assert _waited(str(tmp_path), pid) == total


def test_per_request_splits_work_from_waiting() -> None:
    before = EngineSplit(core_s=1.0, core_wait_s=0.5, worker_s=2.0, worker_wait_s=1.0, steps=100)
    after = EngineSplit(core_s=3.0, core_wait_s=2.4, worker_s=6.0, worker_wait_s=2.0, steps=900)
    split = after.per_request(before, 100)
    assert split == pytest.approx(
        {
            "worker": 40.0,
            "worker waiting": 10.0,
            "worker work": 30.0,
            "core": 20.0,
            "core waiting": 19.0,
            "core work": 1.0,
            "steps": 8.0,
        }
    )


def test_engine_servers_load_the_clock_first_on_their_path(tmp_path: Path) -> None:
    env = engine_env(str(tmp_path))
    assert env["TANDEM_ENGINE_CLOCK_DIR"] == str(tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(CLOCK_PATH)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"  # vLLM's default, as users run it

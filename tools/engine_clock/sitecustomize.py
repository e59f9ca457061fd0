"""Benchmark instrument: how much of an engine process's CPU is vLLM's busy-wait.

Loaded by Python at start-up in every process whose ``PYTHONPATH`` starts with this folder (the
benchmarks put it there for the engine servers they start, ours and ``vllm serve`` alike:
``tools.engine_split``), and active only when ``TANDEM_ENGINE_CLOCK_DIR`` is set. It times, in
CPU seconds of the calling thread, each ``MessageQueue.dequeue`` of vLLM's shared-memory
queues: the engine core waiting for its worker's output, the worker waiting for the next step.
vLLM's reader spins (``sched_yield``) for a second after each message (``SpinCondition``), so
under load a worker fills its core whatever its work.

Each process keeps its clock in ``<pid>.clock`` in that folder, updated in place (a memory
map: no system call per read) as little-endian ``wait_s`` (float64, reads that returned),
``open_since`` (float64: the thread's CPU clock when the read under way began, -1 when none),
``thread`` (int64: the reading thread's id, whose CPU clock the reader adds since
``open_since``) and ``reads`` (int64). Nothing of the served path changes beyond this timing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import mmap
import os
import struct
import sys
import threading
import time
from types import ModuleType
from typing import Any

_DIR = os.environ.get("TANDEM_ENGINE_CLOCK_DIR")
_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
_LAYOUT = struct.Struct("<ddqq")


class _Clock:
    def __init__(self, folder: str) -> None:
        path = os.path.join(folder, f"{os.getpid()}.clock")
        with open(path, "wb") as f:
            f.write(_LAYOUT.pack(0.0, -1.0, 0, 0))
        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), _LAYOUT.size)
        self.wait_s = 0.0
        self.reads = 0

    def begin(self) -> float:
        start = time.thread_time()
        _LAYOUT.pack_into(self.map, 0, self.wait_s, start, threading.get_native_id(), self.reads)
        return start

    def end(self, start: float) -> None:
        self.wait_s += time.thread_time() - start
        self.reads += 1
        _LAYOUT.pack_into(self.map, 0, self.wait_s, -1.0, 0, self.reads)


def _instrument(module: ModuleType, clock: _Clock) -> None:
    queue = module.MessageQueue
    dequeue = queue.dequeue

    def timed_dequeue(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = clock.begin()
        try:
            return dequeue(self, *args, **kwargs)
        finally:
            clock.end(start)

    queue.dequeue = timed_dequeue


class _OnImport(importlib.abc.MetaPathFinder):
    """Instruments vLLM's queue module when the process first imports it."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, folder = spec.loader, self.folder
        exec_module = loader.exec_module

        def exec_and_instrument(module: ModuleType) -> None:
            exec_module(module)
            _instrument(module, _Clock(folder))

        loader.exec_module = exec_and_instrument  # type: ignore[method-assign]
        return spec


if _DIR:
    sys.meta_path.insert(0, _OnImport(_DIR))

"""Freed memory stays in the process, pre-faulted memory is reused without page faults, and
request garbage in reference cycles is collected while start-up objects are frozen."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

MIB = 1024 * 1024
pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# Blocks above glibc's largest automatic mmap threshold (32 MiB): by default each one is a fresh
# mapping, faulted in page by page and unmapped when freed.
CHURN = f"""
import resource, sys
from tandem_http import keep_freed_memory, pretouch

if sys.argv[1] == "keep":
    assert keep_freed_memory()
    pretouch(128 * {MIB})
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    block = bytearray(48 * {MIB})  # zero-filled: every page is written
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_while_churning(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def test_pretouched_memory_is_reused_without_faults() -> None:
    pages = 4 * 48 * MIB // 4096
    assert faults_while_churning("default") > pages // 2  # the control: fresh pages each time
    assert faults_while_churning("keep") < pages // 50


# A server process: hundreds of thousands of container objects from start-up (imports, the
# model's tables), then requests whose objects sit in reference cycles (as httpx's and anyio's
# do) holding a megabyte body, living long enough to reach the oldest generation.
CYCLES = """
import gc, sys, weakref
from tandem_http import startup_objects_frozen

startup = [[None] for _ in range(1_500_000)]
gc.collect()


class Request:
    pass


def serve_one(live):
    request = Request()
    request.self = request  # a cycle: only the cyclic collector frees it
    request.body = bytearray(1 << 20)
    gone = weakref.ref(request)
    for i in range(8_000):  # work while it is alive: young collections promote it
        live.append([i])
    return gone


def run():
    live = []
    served = [serve_one(live) for _ in range(10)]
    for i in range(150_000):  # later requests' work, as a server goes on
        live.append([i])
    return sum(ref() is not None for ref in served)


if sys.argv[1] == "frozen":
    with startup_objects_frozen():
        print(run())
    print(gc.get_freeze_count())
else:
    print(run())
"""


def bodies_still_held(mode: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, check=True
    )
    return [int(line) for line in out.stdout.split()]


def test_request_cycles_are_collected_while_start_up_objects_are_frozen() -> None:
    # The control: behind 1.5 million start-up objects no full collection runs, and the
    # bodies stay.
    (held,) = bodies_still_held("plain")
    assert held >= 8  # (the last may die young)
    held, frozen_after = bodies_still_held("frozen")
    assert held <= 1  # full collections ran as the work went on
    assert frozen_after == 0  # closed: the start-up objects are collectable again

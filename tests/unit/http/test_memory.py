"""Freed memory stays in the process, and pre-faulted memory is reused without page faults."""

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

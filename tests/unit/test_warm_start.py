"""The test session's warm parent (tools.warm_start): a forked server is what `python -m` would
have run, and it is managed as a subprocess is. A light parent (nothing preloaded) keeps this
module fast; the integration suite forks every server from the real one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.warm_start import WarmParent


@pytest.fixture(scope="module")
def parent() -> Iterator[WarmParent]:
    warm = WarmParent.start(preload=("json",))
    try:
        yield warm
    finally:
        warm.stop()


def _module(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def test_a_module_runs_as_main_with_its_output_in_its_log(parent, tmp_path: Path) -> None:
    log = tmp_path / "zen.log"
    child = parent.spawn(_module("this"), os.environ, log)
    assert child.wait(timeout=30) == 0
    assert "Beautiful is better than ugly." in log.read_text()


def test_its_exit_code_and_error_are_the_modules(parent, tmp_path: Path) -> None:
    # json.tool reads its standard input, /dev/null in the child: not JSON, exit 1.
    log = tmp_path / "tool.log"
    child = parent.spawn(_module("json.tool"), os.environ, log)
    assert child.wait(timeout=30) == 1
    fresh = subprocess.run(_module("json.tool"), stdin=subprocess.DEVNULL, capture_output=True)
    assert fresh.returncode == 1
    assert fresh.stderr.decode().strip() in log.read_text()


def test_a_signal_ends_it_as_it_ends_a_subprocess(parent, tmp_path: Path) -> None:
    child = parent.spawn(
        _module("http.server", "0", "--bind", "127.0.0.1"), os.environ, tmp_path / "http.log"
    )
    time.sleep(0.5)
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert os.getpgid(child.pid) == child.pid  # its own session, stopped with its group
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_only_a_module_in_the_parents_environment_is_forked(parent) -> None:
    env = dict(os.environ)
    assert parent.can_fork(_module("this"), env)
    assert parent.can_fork(_module("this"), {**env, "PYTEST_CURRENT_TEST": "another"})
    assert not parent.can_fork(_module("this"), {**env, "OMP_NUM_THREADS": "7"})
    assert not parent.can_fork(["/bin/echo", "hi"], env)
    assert not parent.can_fork([sys.executable, "script.py"], env)

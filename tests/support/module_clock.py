"""Where a test session's time went: wall and CPU seconds per test module.

Each test's setup, call and teardown report carries the CPU this process spent in that phase
(its own and its reaped children's) and the CPU the whole machine spent meanwhile (every
process: the servers an integration test started, the engines they spawned). The reports reach
the controller under pytest-xdist too, so the totals per module are the same with or without
workers; with two workers the machine's CPU of a module includes what the other worker ran
beside it. At the end, the slowest modules are printed and every module's totals are written
to ``.cache/test-times/<first test path's folder>.json`` (``TANDEM_TEST_TIMES`` overrides the
folder).
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SHOWN = 15


def machine_cpu_seconds() -> float:
    """CPU seconds every core of this machine has spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class ModuleClock:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.mark = (process_cpu_seconds(), machine_cpu_seconds())
        self.modules: dict[str, dict[str, float]] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        outcome = yield
        report = outcome.get_result()
        now = (process_cpu_seconds(), machine_cpu_seconds())
        report.user_properties.append(("cpu_s", now[0] - self.mark[0]))
        report.user_properties.append(("machine_cpu_s", now[1] - self.mark[1]))
        self.mark = now

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        # What ran between two tests (a module fixture's teardown runs inside the last test's
        # protocol) is not counted twice: the next test's setup starts counting afresh.
        self.mark = (process_cpu_seconds(), machine_cpu_seconds())
        yield

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::")[0]
        row = self.modules.setdefault(
            module, {"wall_s": 0.0, "cpu_s": 0.0, "machine_cpu_s": 0.0, "tests": 0}
        )
        row["wall_s"] += report.duration
        for key, value in report.user_properties:
            if key in row:
                row[key] += float(value)
        if report.when == "call" or (report.when == "setup" and report.skipped):
            row["tests"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.modules or hasattr(self.config, "workerinput"):
            return
        rows = sorted(self.modules.items(), key=lambda kv: -kv[1]["wall_s"])
        write = terminalreporter.write_line
        terminalreporter.section("time per module (wall s, this process's CPU s, machine CPU s)")
        for module, row in rows[:SHOWN]:
            write(
                f"{row['wall_s']:8.1f} {row['cpu_s']:8.1f} {row['machine_cpu_s']:8.1f}  "
                f"{module} ({int(row['tests'])} tests)"
            )
        total = {k: sum(r[k] for _, r in rows) for k in ("wall_s", "cpu_s", "machine_cpu_s")}
        write(
            f"{total['wall_s']:8.1f} {total['cpu_s']:8.1f} {total['machine_cpu_s']:8.1f}  "
            f"all {len(rows)} modules (wall: the sum over workers)"
        )
        folder = Path(os.environ.get("TANDEM_TEST_TIMES", ROOT / ".cache" / "test-times"))
        folder.mkdir(parents=True, exist_ok=True)
        first = Path(rows[0][0]).parts
        name = first[1] if len(first) > 2 and first[0] == "tests" else "tests"
        (folder / f"{name}.json").write_text(json.dumps(dict(rows), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ModuleClock(config), "tandem_module_clock")

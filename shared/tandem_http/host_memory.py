"""The memory this process may use: its cgroup's limit when one is set, else the host's RAM."""

from __future__ import annotations

from pathlib import Path

__all__ = ["HELD_BYTES_SHARE", "default_held_bytes", "held_bytes_budget", "memory_limit"]

HELD_BYTES_SHARE = 4
"""Request bodies a process holds by default: a quarter of its memory. The rest is for what
the process needs anyway (a generate node's engine, weights and KV cache, its item cache; a
front door's other workers) and for the copies a body's decode makes before it is charged."""

_CGROUP_LIMITS = (
    "/sys/fs/cgroup/memory.max",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
)
_UNLIMITED = 1 << 60
"""cgroup v1 writes 'no limit' as a page-rounded 2**63-1."""


def memory_limit(root: str = "/") -> int:
    """Bytes of memory this process may use: the smallest of its cgroup limit (v2 or v1,
    when set) and MemTotal. ``root`` stands in for ``/`` in tests."""
    total = _meminfo_total(Path(root, "proc/meminfo"))
    for name in _CGROUP_LIMITS:
        try:
            text = Path(root, name.lstrip("/")).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _UNLIMITED:
            total = min(total, int(text))
    return total


def default_held_bytes(processes: int = 1, root: str = "/") -> int:
    """The default byte budget of one of ``processes`` serving processes on this host."""
    return memory_limit(root) // HELD_BYTES_SHARE // max(processes, 1)


def held_bytes_budget(setting: int | None, processes: int = 1) -> int:
    """A process's byte budget from a service's ``max_held_bytes`` setting: the setting when
    given (0: no budget), else the default for one of ``processes``."""
    return default_held_bytes(processes) if setting is None else setting


def _meminfo_total(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024  # kB
    raise OSError(f"no MemTotal in {path}")

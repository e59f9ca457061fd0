"""The default byte budget follows the memory the process may use: cgroup limit, else RAM."""

from __future__ import annotations

from pathlib import Path

from tandem_http import default_held_bytes, memory_limit

GIB = 1 << 30


def host(tmp_path: Path, ram_kb: int, files: dict[str, str]) -> str:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(f"MemTotal:       {ram_kb} kB\nMemFree: 1 kB\n")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return str(tmp_path)


def test_a_cgroup_v2_limit_below_ram_is_the_limit(tmp_path: Path) -> None:
    root = host(tmp_path, 24 * 1024 * 1024, {"sys/fs/cgroup/memory.max": str(8 * GIB)})
    assert memory_limit(root) == 8 * GIB
    assert default_held_bytes(root=root) == 2 * GIB
    assert default_held_bytes(4, root=root) == GIB // 2  # shared among a door's workers


def test_no_cgroup_limit_means_ram(tmp_path: Path) -> None:
    v2 = host(tmp_path / "v2", 24 * 1024 * 1024, {"sys/fs/cgroup/memory.max": "max"})
    v1 = host(
        tmp_path / "v1",
        24 * 1024 * 1024,
        {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"},
    )
    none = host(tmp_path / "none", 24 * 1024 * 1024, {})
    assert memory_limit(v2) == memory_limit(v1) == memory_limit(none) == 24 * GIB


def test_a_cgroup_v1_limit_counts(tmp_path: Path) -> None:
    root = host(
        tmp_path, 24 * 1024 * 1024, {"sys/fs/cgroup/memory/memory.limit_in_bytes": str(GIB)}
    )
    assert memory_limit(root) == GIB


def test_this_host_has_a_limit() -> None:
    assert memory_limit() > 0

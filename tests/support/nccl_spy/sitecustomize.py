"""A spy on vLLM's NCCL weight-transfer rendezvous for tests: each worker writes the rank and
world size vLLM computed for it to ``$TANDEM_NCCL_SPY_FILE`` instead of opening the group.

Loaded by Python at start-up when this folder is on a process's PYTHONPATH (the tests put it on
a generate node's only); it patches ``vllm.distributed.weight_transfer.nccl_common`` when that
module is first imported, so processes that never import it are untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

TARGET = "vllm.distributed.weight_transfer.nccl_common"
FILE_ENV = "TANDEM_NCCL_SPY_FILE"


def _record(rank: int, world_size: int, **rendezvous: Any) -> None:
    line = {"pid": os.getpid(), "rank": rank, "world_size": world_size, **rendezvous}
    with open(os.environ[FILE_ENV], "a") as f:
        f.write(json.dumps(line) + "\n")


class _NoAccelerator:
    """The module's ``torch`` with device 0 as the current device: there is none on a CPU
    machine, and the rendezvous it is for is not opened here."""

    accelerator = SimpleNamespace(current_device_index=lambda: 0)

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)


def _patch(module: ModuleType) -> None:
    # vLLM's worker_init_process_group computes the worker's rank, then calls one of these two
    # (looked up in the module at call time): what they receive is what the worker would join
    # with. Only this module's names change; vLLM's rank arithmetic runs as released.
    module.torch = _NoAccelerator()  # type: ignore[attr-defined]

    def stateless(addr: str, port: int, rank: int, world_size: int, device: Any) -> None:
        _record(rank, world_size, master_address=addr, master_port=port)

    def uid(unique_id: bytes, rank: int, world_size: int, device: Any) -> None:
        _record(rank, world_size, unique_id=True)

    module.stateless_init_process_group = stateless  # type: ignore[attr-defined]
    module.uid_init_process_group = uid  # type: ignore[attr-defined]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get(FILE_ENV):
    sys.meta_path.insert(0, _Finder())

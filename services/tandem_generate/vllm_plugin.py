"""vLLM general plugin: registers the ``tandem_file`` weight-transfer backend in every process.

vLLM runs ``vllm.general_plugins`` entry points in each of its processes (the engine core and
its workers included; on CPU they are always spawned, so an entry point is the only way in).
The entry point is declared in pyproject.toml and exists once the package is installed.
"""

from __future__ import annotations

__all__ = ["PLUGIN_NAME", "register"]

PLUGIN_NAME = "tandem_weight_transfer"
"""The entry point's name in pyproject.toml's ``vllm.general_plugins`` group."""


def register() -> None:
    """Register the backend (lazily: its module loads only when an engine is configured with
    it); calling this again is harmless."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from .weight_files import BACKEND

    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "tandem_generate.weight_backend", "FileWeightTransferEngine"
        )
    except ValueError:
        pass  # already registered in this process

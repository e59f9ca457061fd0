"""vLLM general plugin: registers the ``tandem_file`` weight-transfer backend in every process.

vLLM runs ``vllm.general_plugins`` entry points in each of its processes (the engine core and
its workers included, however they are started); the generate service also calls
``register`` itself before it builds its engine, which covers forked engine processes even
where the package metadata is not installed.
"""

from __future__ import annotations

__all__ = ["register"]


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

"""The ``tandem_file`` weight-transfer backend: new weights arrive as safetensors files.

Runs inside vLLM's engine worker (registered there by ``tandem_generate.vllm_plugin``). The
trainer writes a file into the shared weight-transfer folder and ``update_weights`` names it
(the API process has confined the path to that folder and checked the header already). Each
``update_weights`` checks the file's header against the model's checkpoint again and stages
its tensors in memory; ``finish_weight_update`` loads everything staged through the model's
own ``load_weights`` inside vLLM's layerwise reload (which re-runs the CPU kernels' weight
pre-packing). A refused file stages nothing, and nothing reaches the model before finish,
so the old weights serve until a whole update is in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .weight_files import (
    ABORT_UPDATE,
    TensorSpec,
    check_update,
    checkpoint_spec,
    model_folder,
    read_header,
)

__all__ = ["FileInitInfo", "FileUpdateInfo", "FileWeightTransferEngine"]


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """Nothing to set up: the folder is the server's ``--weight-transfer-dir``."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    """One update file."""

    path: str
    """Absolute path of a safetensors file (the API process resolved and confined it)."""


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    """Stages checked safetensors files, then reloads the model's layers from them at once."""

    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._staged: dict[str, torch.Tensor] = {}
        self._spec: dict[str, TensorSpec] | None = None  # read at the first update, not at start
        self._serving_dtypes = (str(self.model_config.dtype).removeprefix("torch."),)

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        self._staged.clear()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        if update_info == ABORT_UPDATE:
            self._staged.clear()
            raise RuntimeError("weight update aborted: nothing staged is loaded")
        # The base class synchronizes an accelerator here; the CPU has nothing in flight.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        if self._spec is None:
            mc = self.model_config
            self._spec = checkpoint_spec(model_folder(mc.model, mc.revision))
        spec, dtypes = self._spec, self._serving_dtypes
        # Checked again here: the file may have changed since the API process read it.
        check_update(read_header(update_info.path), spec, dtypes)
        tensors = load_file(update_info.path)  # copies out of the file: it may be replaced
        check_update({n: _spec_of(t) for n, t in tensors.items()}, spec, dtypes)
        self._staged.update(tensors)

    def finish_weight_update(self) -> None:
        if not self._staged:
            return
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        weights, self._staged = self._staged, {}
        with torch.no_grad():
            initialize_layerwise_reload(self.model)
            self.model.load_weights(iter(weights.items()))  # type: ignore[operator]
            finalize_layerwise_reload(self.model, self.model_config)  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        self._staged.clear()


def _spec_of(tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))

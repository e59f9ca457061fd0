"""vLLM ``SamplingParams`` -> the wire's ``sampling_params`` map."""

from __future__ import annotations

from typing import Any

import msgspec
from vllm.sampling_params import SamplingParams

__all__ = ["sampling_params_to_wire"]


def sampling_params_to_wire(params: SamplingParams) -> dict[str, Any]:
    """The fields that differ from ``SamplingParams``' defaults, plus ``max_tokens`` always.

    Upstream's render leaves out every field equal to its dataclass default (16 for
    ``max_tokens``), but upstream's generate reads an absent ``max_tokens`` as "the room left
    in the context", not as 16: a caller asking for exactly 16 tokens would get thousands.
    Writing the resolved ``max_tokens`` keeps the document upstream-shaped and makes it mean
    what the caller asked for on either generate server.
    """
    fields: dict[str, Any] = msgspec.to_builtins(params)
    if params.max_tokens is not None:
        fields["max_tokens"] = params.max_tokens
    return fields

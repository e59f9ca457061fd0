"""Upstream's ``GenerateRequest`` (what vLLM's render computes) -> the wire ``GenerateRequest``."""

from __future__ import annotations

from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateRequest as UpstreamGenerateRequest,
)

from tandem_wire import GenerateRequest, MultiModalFeatures

from .sampling import sampling_params_to_wire

__all__ = ["UpstreamGenerateRequest", "generate_request_to_wire"]


def generate_request_to_wire(
    req: UpstreamGenerateRequest, features: MultiModalFeatures[bytes | None] | None
) -> GenerateRequest[bytes | None]:
    """Our wire request for upstream's, every field carried over as upstream serializes it.

    ``features`` replaces upstream's (base64 inside JSON) with ours, built from the engine
    input by ``features_from_engine_input``.
    """
    parser_kwargs = req.reasoning_parser_kwargs
    return GenerateRequest(
        request_id=req.request_id,
        token_ids=req.token_ids,
        features=features,
        sampling_params=sampling_params_to_wire(req.sampling_params),
        model=req.model,
        stream=req.stream,
        stream_options=(
            req.stream_options.model_dump() if req.stream_options is not None else None
        ),
        cache_salt=req.cache_salt,
        priority=req.priority,
        token_offsets=req.token_offsets,
        reasoning_ended=req.reasoning_ended,
        reasoning_parser_kwargs=(parser_kwargs.model_dump() if parser_kwargs is not None else None),
    )

"""The JSON Schemas of the generate service's request bodies, for its ``/openapi.json``."""

from __future__ import annotations

from tandem_http.openapi import REF_TEMPLATE, BodySchemas
from tandem_vllm.sampling import sampling_params_schema
from tandem_wire import GenerateRequest
from tandem_wire.control import CONTROL_ROUTES

__all__ = ["GENERATE_PATH", "body_schemas"]

GENERATE_PATH = "/inference/v1/generate"


def body_schemas() -> BodySchemas:
    """Generate and control bodies; ``sampling_params`` spelled out field by field, as
    ``SamplingParams`` declares the fields this service accepts."""
    out = BodySchemas.of_structs(
        {
            GENERATE_PATH: GenerateRequest[str | None],
            **{r.path: r.body for r in CONTROL_ROUTES if r.body is not None},
        }
    )
    sampling, defs = sampling_params_schema(REF_TEMPLATE)
    ref = out.bodies[GENERATE_PATH]["$ref"].rsplit("/", 1)[1]
    out.components[ref]["properties"]["sampling_params"] = sampling
    return out.merged(BodySchemas(components=defs))

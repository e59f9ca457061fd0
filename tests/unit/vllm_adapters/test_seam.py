"""The wire <-> vLLM conversions of tandem_vllm, without an engine or a model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")

from vllm.entrypoints.scale_out.token_in_token_out.protocol import (  # noqa: E402
    ReasoningParserKwargs,
)
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402

from tandem_vllm.prompts import engine_prompt  # noqa: E402
from tandem_vllm.requests import UpstreamGenerateRequest, generate_request_to_wire  # noqa: E402
from tandem_vllm.sampling import (  # noqa: E402
    SamplingParamsRefused,
    sampling_params_from_wire,
    sampling_params_to_wire,
)
from tandem_wire import PlaceholderRange  # noqa: E402


def test_upstream_request_to_wire_carries_every_field():
    upstream = UpstreamGenerateRequest(
        request_id="r1",
        token_ids=[1, 2, 3],
        sampling_params=SamplingParams(max_tokens=16, temperature=0.5),
        model="m",
        cache_salt="salt",
        priority=2,
        token_offsets=[(0, 1)],
        reasoning_ended=True,
        reasoning_parser_kwargs=ReasoningParserKwargs(chat_template_kwargs={"think": False}),
    )
    wire = generate_request_to_wire(upstream, None)
    assert (wire.request_id, wire.token_ids, wire.model) == ("r1", [1, 2, 3], "m")
    assert wire.sampling_params == sampling_params_to_wire(upstream.sampling_params)
    assert wire.sampling_params["max_tokens"] == 16  # the default, written anyway
    assert (wire.cache_salt, wire.priority, wire.reasoning_ended) == ("salt", 2, True)
    assert wire.reasoning_parser_kwargs == {"chat_template_kwargs": {"think": False}}
    assert wire.features is None and wire.stream_options is None


def test_sampling_round_trip_and_refusals_name_the_field():
    params = sampling_params_from_wire(
        {"temperature": 0.5, "max_tokens": 7, "output_kind": 2},
        stream=True,
        max_n=4,
        max_logprobs=5,
    )
    assert params.output_kind is RequestOutputKind.DELTA
    assert sampling_params_to_wire(params)["max_tokens"] == 7
    for fields, param in [
        ({"extra_args": {}}, "sampling_params"),
        ({"n": 5}, "sampling_params.n"),
        ({"logprobs": 6}, "sampling_params.logprobs"),
        ({"temperature": "hot"}, "sampling_params"),
    ]:
        with pytest.raises(SamplingParamsRefused) as info:
            sampling_params_from_wire(fields, stream=False, max_n=4, max_logprobs=5)
        assert info.value.param == param
        assert isinstance(info.value, ValueError)


def test_engine_prompt_text_only_and_multimodal():
    assert engine_prompt([5, 6], {}, {}, {}, cache_salt="s") == {
        "type": "token",
        "prompt_token_ids": [5, 6],
        "cache_salt": "s",
    }
    ranges = {"image": [PlaceholderRange(offset=1, length=3, is_embed=[True, False, True])]}
    prompt = engine_prompt([5, 9, 9, 9], {"image": [None]}, {"image": ["h"]}, ranges)
    assert prompt["type"] == "multimodal" and prompt["mm_hashes"] == {"image": ["h"]}
    (rng,) = prompt["mm_placeholders"]["image"]
    assert (rng.offset, rng.length) == (1, 3)
    assert rng.is_embed.dtype == torch.bool and rng.is_embed.tolist() == [True, False, True]
    plain = engine_prompt([9], {"image": [None]}, {"image": ["h"]}, {"image": [ranges["image"][0]]})
    assert "cache_salt" not in plain

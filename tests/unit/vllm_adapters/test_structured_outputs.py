"""Structured outputs from the wire: the operator's bounds, and the checks vLLM's own validation
lacks (tandem_vllm.structured_outputs), without an engine."""

from __future__ import annotations

import pytest
from vllm.sampling_params import StructuredOutputsParams

from tandem_vllm.sampling import (
    InvalidStructuredOutput,
    StructuredOutputsDisabled,
    StructuredOutputTooLarge,
    sampling_params_from_wire,
    sampling_params_to_wire,
)
from tandem_vllm.structured_outputs import (
    MAX_NESTED_REPEAT,
    check_grammar_cost,
    check_matches_something,
)

CAP = 64 * 1024


def from_wire(structured, cap: int | None = CAP):
    fields = {"structured_outputs": structured, "max_tokens": 4}
    return sampling_params_from_wire(
        fields, stream=False, max_n=1, max_logprobs=0, max_structured_output_bytes=cap
    )


def test_fields_arrive_as_vllm_reads_them_and_go_back_out_the_same():
    params = from_wire({"json": {"type": "integer"}, "disable_any_whitespace": True})
    assert params.structured_outputs == StructuredOutputsParams(
        json={"type": "integer"}, disable_any_whitespace=True
    )
    again = from_wire(sampling_params_to_wire(params)["structured_outputs"])
    assert again.structured_outputs == params.structured_outputs


def test_the_backend_is_the_servers_choice():
    # Render's documents carry vLLM's private fields; a caller cannot pick a backend with them.
    params = from_wire({"choice": ["a"], "_backend": "outlines", "_backend_was_auto": True})
    assert params.structured_outputs._backend is None


@pytest.mark.parametrize(
    ("structured", "cap", "error"),
    [
        ({"regex": "a"}, None, StructuredOutputsDisabled),
        ({"regex": "a" * 100}, 64, StructuredOutputTooLarge),
        ({"choice": ["x" * 30, "y" * 30]}, 64, StructuredOutputTooLarge),
        ({"regex": "a", "backend": "outlines"}, CAP, InvalidStructuredOutput),
        ({"regex": "a", "choice": ["a"]}, CAP, InvalidStructuredOutput),
        ({}, CAP, InvalidStructuredOutput),
        (["regex"], CAP, InvalidStructuredOutput),
        ({"choice": "not a list"}, CAP, InvalidStructuredOutput),
    ],
)
def test_refusals_name_the_field(structured, cap, error):
    with pytest.raises(error) as info:
        from_wire(structured, cap)
    assert info.value.param == "sampling_params.structured_outputs"


def test_no_structured_outputs_needs_no_cap():
    params = sampling_params_from_wire({}, stream=False, max_n=1, max_logprobs=0)
    assert params.structured_outputs is None


@pytest.mark.parametrize(
    ("regex", "refused"),
    [
        ("(a{0,30}){0,30}(a{0,30}){0,30}", True),
        ("(a{0,100}){0,100}", True),
        ("x|(?:b(a{0,20}){0,20})", True),
        ("(((a{0,5}){0,5}){0,5})", True),
        ("(a{0,10}){0,10}", False),  # exactly MAX_NESTED_REPEAT
        ("[a-z]{1,60000}", False),
        (r"(\d{3}-){2}\d{4}", False),
        ("([a-z]+ )*[a-z]+", False),
        ("((a?){100}){100}", False),
        ("(unbalanced", False),  # left to the backend's parser
    ],
)
def test_nested_repetition_is_bounded(regex, refused):
    so = StructuredOutputsParams(regex=regex)
    if refused:
        with pytest.raises(ValueError, match="nests repetitions"):
            check_grammar_cost(so)
    else:
        check_grammar_cost(so)
    assert MAX_NESTED_REPEAT == 100


def test_schema_patterns_are_bounded_too():
    schema = {
        "type": "object",
        "properties": {"p": {"type": "string", "pattern": "(a{0,50}){2,40}"}},
    }
    with pytest.raises(ValueError):
        check_grammar_cost(StructuredOutputsParams(json=schema))


@pytest.mark.parametrize(
    ("json_", "grammar", "refused"),
    [
        ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, None, True),
        (None, "root ::= root", True),
        ({"type": "object", "properties": {"next": {"$ref": "#"}}}, None, False),
        ('{"type": "string"}', None, False),
        (None, 'root ::= "a" | "b"', False),
    ],
)
def test_a_constraint_that_matches_nothing_is_refused(json_, grammar, refused):
    so = StructuredOutputsParams(json=json_) if json_ else StructuredOutputsParams(grammar=grammar)
    if refused:
        with pytest.raises(ValueError, match="matches no output"):
            check_matches_something(so)
    else:
        check_matches_something(so)

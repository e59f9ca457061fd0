"""A caller's body checked with vLLM's own request models: which failures are the body's, and
what a refusal says of them."""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["VALIDATOR_SLIPS", "first_error"]

VALIDATOR_SLIPS = (TypeError, KeyError, AttributeError, IndexError)
"""What vLLM's model validators raise on values they did not expect (``structured_outputs:
true``, ``tools: 0``): pydantic wraps only ``ValueError`` and ``AssertionError`` into a
``ValidationError``, but these are the body's fault all the same."""


def first_error(exc: ValidationError) -> str:
    """The first of pydantic's errors, as ``where: what`` (at most 300 characters)."""
    errors = exc.errors()
    if not errors:
        return "the request is not valid"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}"[:300] if where else str(first.get("msg"))[:300]

"""Checks vLLM's structured-output validation lacks: a constraint matching nothing, and nested
regex repetition whose matching cost grows exponentially per generated token.

Both get past vLLM's own check (which only parses) and fail in the engine core: the first ends its
request with ``finish_reason: "error"``; the second stalls every engine step (and so every
request on the node) as xgrammar tracks more and more ways to split the input. Each check raises
``ValueError``; ``tandem_vllm.sampling.check_structured_outputs`` turns it into a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from typing import Any

__all__ = ["MAX_NESTED_REPEAT", "check_grammar_cost", "check_matches_something"]

MAX_NESTED_REPEAT = 100
"""Largest product of the upper bounds of variable-count repetitions nested in one another
(``(a{0,10}){0,10}`` is 100). Measured on xgrammar 0.2.8: ``(a{0,30}){0,30}(a{0,30}){0,30}``
(900) took 0.3 s for its 24th token and doubled every few tokens; one level of any count
(``[a-z]{1,60000}``), unbounded ``*``/``+`` and fixed counts (``(\\d{3}-){2}``) stay in the
microseconds and are not limited."""


def check_grammar_cost(so: Any) -> None:
    """Refuse nested variable repetition beyond ``MAX_NESTED_REPEAT`` in ``so.regex`` and in
    the ``pattern`` strings of ``so.json`` (xgrammar turns both into the same grammar rules)."""
    patterns = [so.regex] if isinstance(so.regex, str) else []
    if so.json is not None:
        patterns.extend(_schema_patterns(_as_json(so.json)))
    for pattern in patterns:
        product = _nested_repeat(pattern)
        if product > MAX_NESTED_REPEAT:
            raise ValueError(
                f"regex {pattern[:60]!r} nests repetitions {product} deep (at most "
                f"{MAX_NESTED_REPEAT}): matching it grows exponentially with the output"
            )


def check_matches_something(so: Any) -> None:
    """Refuse an xgrammar JSON schema or EBNF grammar that no output can start (a schema that
    is only a reference to itself): vLLM accepts it, and its engine fails the request on the
    first token. Compiled against a 257-token byte vocabulary: about a millisecond."""
    import xgrammar as xgr

    compiler = _probe_compiler()
    if so.json is not None:
        spec = so.json if isinstance(so.json, str) else json.dumps(so.json)
        grammar = compiler.compile_json_schema(spec, any_whitespace=False)
    elif isinstance(so.grammar, str) and "::=" in so.grammar:  # EBNF (choices become one)
        grammar = compiler.compile_grammar(so.grammar)
    else:
        return
    matcher = xgr.GrammarMatcher(grammar)
    mask = xgr.allocate_token_bitmask(1, len(_PROBE_VOCAB))
    matcher.fill_next_token_bitmask(mask)
    if not bool(mask.any()):
        raise ValueError(
            "the constraint matches no output at all (a schema that only refers to itself?)"
        )


_PROBE_VOCAB = [bytes([b]) for b in range(256)] + [b"</s>"]


@cache
def _probe_compiler() -> Any:
    import xgrammar as xgr

    info = xgr.TokenizerInfo(_PROBE_VOCAB, vocab_type=xgr.VocabType.RAW, stop_token_ids=[256])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def _as_json(spec: Any) -> Any:
    if not isinstance(spec, str):
        return spec
    try:
        return json.loads(spec)
    except ValueError:
        return None  # malformed: vLLM's own check says so


def _schema_patterns(node: Any) -> Iterator[str]:
    # vLLM has already refused schemas nested deeper than 64 levels.
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            elif key == "patternProperties" and isinstance(value, dict):
                yield from (k for k in value if isinstance(k, str))
                yield from _schema_patterns(value)
            else:
                yield from _schema_patterns(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_patterns(value)


def _nested_repeat(pattern: str) -> int:
    """The largest product of upper bounds along a chain of two or more variable-count
    repetitions nested in one another, as Python's regex parser reads ``pattern`` (1 when
    none nest; a pattern it cannot read is left to the backend's own parser)."""
    from re import _parser  # type: ignore[attr-defined]

    try:
        return _walk(list(_parser.parse(pattern)))[1]
    except (re.error, RecursionError, OverflowError, ValueError):
        return 1


def _walk(items: list[Any]) -> tuple[int, int]:
    """(the largest product along any chain of variable repetitions in ``items``, the largest
    along a chain of two or more)."""
    from re import _constants as c  # type: ignore[attr-defined]

    best_chain = best_nested = 1
    for op, arg in items:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, sub = arg
            chain, nested = _walk(list(sub))
            # Unbounded and fixed counts are loops or plain copies to xgrammar: not counted.
            if low != high and 1 < high != c.MAXREPEAT:
                if chain > 1:
                    nested = max(nested, high * chain)
                chain *= high
            best_chain, best_nested = max(best_chain, chain), max(best_nested, nested)
            continue
        for sub in _subpatterns(op, arg, c):
            chain, nested = _walk(sub)
            best_chain, best_nested = max(best_chain, chain), max(best_nested, nested)
    return best_chain, best_nested


def _subpatterns(op: Any, arg: Any, c: Any) -> Iterator[list[Any]]:
    if op == c.SUBPATTERN:
        yield list(arg[-1])
    elif op == c.BRANCH:
        yield from (list(p) for p in arg[1])
    elif op == c.ATOMIC_GROUP:
        yield list(arg)
    elif op in (c.ASSERT, c.ASSERT_NOT):
        yield list(arg[1])
    elif op == c.GROUPREF_EXISTS:
        yield from (list(p) for p in arg[1:] if p is not None)

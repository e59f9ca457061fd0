"""Logprob entries in the shape TRL 1.16 parses, from vLLM 0.32's generate answers.

vLLM 0.32's ``/inference/v1/generate`` answers ``{"token_id": 123, "logprob": ...,
"top_logprobs": [{"token_id": ..., "logprob": ...}]}``; TRL's ``parse_logprobs`` reads
``entry["token"]`` and ``top["token"]`` and strips the ``"token_id:"`` prefix (the shape of vLLM
<= 0.31 with ``return_tokens_as_token_ids``). ``trl`` adds that ``token`` string to every entry
and keeps ``token_id``, so readers of either shape work.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HEADER", "TRL_REQUEST_PREFIX", "with_token_strings"]

HEADER = "x-tandem-logprobs-format"
"""Request header a client may send (``trl`` or ``vllm-0.32``) to pick the shape per request."""

TRL_REQUEST_PREFIX = "trl-"
"""TRL 1.16's ``VLLMClient`` names its generate requests ``trl-<hex>``: the signal ``auto``
reads."""


def _entry(entry: Any) -> None:
    if isinstance(entry, dict) and "token_id" in entry and "token" not in entry:
        entry["token"] = f"token_id:{entry['token_id']}"


def with_token_strings(document: Any) -> Any:
    """The generate answer (decoded JSON) with ``token`` strings added in place; returned."""
    choices = document.get("choices") if isinstance(document, dict) else None
    for choice in choices or ():
        logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        for entry in content or ():
            _entry(entry)
            for top in entry.get("top_logprobs") or () if isinstance(entry, dict) else ():
                _entry(top)
    return document

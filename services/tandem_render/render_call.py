"""The one hand-off between a render request and the vLLM hooks it runs through.

A request's media, its per-prompt media (completions) and the engine inputs vLLM produced all
travel in one ``RenderCall``. ``EngineRenderer`` is the only place that binds one; the hooks
(the media connector, the engine-input capture, the completion renderer) only read it.

Why a context variable at all: vLLM builds the media connector itself, from its registry,
with no argument of ours, and calls ``_extract_mm_features`` and ``render_completion`` on
objects shared by every request. Nothing per request can be passed down that call chain, so
the request's ``RenderCall`` rides in this single context variable, set in exactly one place
(``bound``) and reset when the upstream call returns.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .caches import DecodedCache
from .media import AudioDecoding

__all__ = ["RenderCall", "bound", "current"]

PromptMedia = Sequence[Mapping[str, list[Any]] | None]
"""Per completion prompt: modality -> decoded media, or None for a prompt without media."""


@dataclass
class RenderCall:
    """What one render request hands to vLLM's stack, and what it gets back."""

    media: Mapping[str, bytes] = field(default_factory=dict)
    """Token URL -> vetted bytes: all the media connector may serve (anything else is refused)."""

    embeds: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Token -> checked embedding tensor: all vLLM's embedding fetch may serve."""

    decoded: DecodedCache | None = None
    """Where the connector keeps decoded media across requests, if anywhere."""

    audio: AudioDecoding | None = None
    """How the connector decodes audio clips (limits, the model's sample rate)."""

    prompt_media: PromptMedia | None = None
    """Completions only: media per prompt, which upstream's completion renderer lacks."""

    captured: list[tuple[Any, Any]] = field(default_factory=list)
    """(engine input, mm_payload) per rendered prompt, in order, appended by the capture."""


_CURRENT: contextvars.ContextVar[RenderCall | None] = contextvars.ContextVar(
    "tandem_render_call", default=None
)


@contextmanager
def bound(call: RenderCall) -> Iterator[RenderCall]:
    """Make ``call`` the hand-off the vLLM hooks see within this context."""
    token = _CURRENT.set(call)
    try:
        yield call
    finally:
        _CURRENT.reset(token)


def current() -> RenderCall | None:
    """The request's hand-off; None outside a render call (hooks then serve nothing)."""
    return _CURRENT.get()

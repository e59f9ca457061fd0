"""Token parity with vLLM's own chat completions on the same engine: render -> generate, JSON
and binary, against `/v1/chat/completions` of vLLM's app for the same chat."""

from __future__ import annotations

import weakref

import pytest

from tandem_wire import ANY_WIRE_TRANSFORM

from ...support.asgi import app_client
from ...support.vllm_chat import generate_steps, vllm_chat, vllm_openai_app
from .helpers import generate_app, post, render_body

GREEDY_WITH_LOGPROBS = {"temperature": 0.0, "max_tokens": 8, "logprobs": True, "top_logprobs": 5}


_APPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""vLLM's app per engine, built once (its set-up warms a renderer up: seconds)."""


async def reference(engine, model: str, body: dict):
    """vLLM's own chat answer for ``body``, token by token with the top-5 logprobs."""
    app = _APPS.get(engine)
    if app is None:
        app = _APPS[engine] = await vllm_openai_app(engine.llm, model)
    return await vllm_chat(app, {**body, **GREEDY_WITH_LOGPROBS})


async def ours(engine, renderer, model: str, body: dict, **render_settings):
    """Our render -> generate answers for ``body``: {"json": steps, "binary": steps}, the
    binary one in every wire transform the model has; and the render answer."""
    body = {**body, **GREEDY_WITH_LOGPROBS}
    as_json = await render_body(renderer, model, body, **render_settings)
    as_binary = await render_body(
        renderer, model, body, transforms=frozenset({ANY_WIRE_TRANSFORM}), **render_settings
    )
    answers = {}
    async with app_client(generate_app(engine, model)) as c:
        answers["json"] = generate_steps(await post(c, as_json))
        answers["binary"] = generate_steps(await post(c, as_binary, binary=True))
    return answers, as_json


def assert_same_steps(mine, theirs) -> None:
    """Same tokens, and the same logprobs for them and their top candidates."""
    assert [t for t, _, _ in mine] == [t for t, _, _ in theirs]
    for (_, lp, top), (_, ref_lp, ref_top) in zip(mine, theirs, strict=True):
        assert lp == pytest.approx(ref_lp, abs=1e-6)
        assert sorted(top) == sorted(ref_top)
        assert [top[t] for t in sorted(top)] == pytest.approx(
            [ref_top[t] for t in sorted(top)], abs=1e-6
        )

"""vLLM's own OpenAI server app, in-process, over an engine a test already runs.

The reference for token parity: vLLM's `/v1/chat/completions` (its chat template, media IO,
HF processor and engine input path) on the very engine our generate app drives, so a model's
parity test costs one engine, not two.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def vllm_media_connector() -> Iterator[None]:
    """vLLM's own media connector while inside: our render registers one in its place for the
    whole process (it serves only prefetched media), and the reference must fetch as vLLM does."""
    from vllm import envs
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaConnector

    name = envs.VLLM_MEDIA_CONNECTOR
    saved = MEDIA_CONNECTOR_REGISTRY.name2class.get(name)
    MEDIA_CONNECTOR_REGISTRY.register(name)(MediaConnector)
    try:
        yield
    finally:
        if saved is not None:
            MEDIA_CONNECTOR_REGISTRY.register(name)(saved)


async def vllm_openai_app(llm: Any, model: str, *options: str) -> Any:
    """vLLM's OpenAI server app (routes and state as `vllm serve` builds them) over ``llm``,
    an ``AsyncLLM``; ``options``: more of `vllm serve`'s command line."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", model, "--disable-log-stats", *options]
    )
    tasks = await llm.get_supported_tasks()
    app = build_app(args, tasks, llm.model_config)
    await init_app_state(llm, app.state, args, tasks)
    return app


Steps = list[tuple[int, float, dict[int, float]]]
"""Per generated token: (token id, its logprob, {token id: logprob} of the top candidates)."""


async def vllm_chat(app: Any, body: dict[str, Any]) -> Steps:
    """What vLLM's own chat route generates for ``body``, token by token with logprobs
    (``body`` should ask for ``logprobs`` and ``top_logprobs``)."""
    import httpx

    body = {**body, "return_tokens_as_token_ids": True}
    # Without the app's lifespan: vLLM's deletes the app's state on the way out.
    transport = httpx.ASGITransport(app=app)
    with vllm_media_connector():
        async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
            r = await client.post("/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text[:2000]
    steps = r.json()["choices"][0]["logprobs"]["content"]

    def token_id(entry: dict[str, Any]) -> int:
        return int(entry["token"].removeprefix("token_id:"))

    return [
        (
            token_id(s),
            float(s["logprob"]),
            {token_id(t): float(t["logprob"]) for t in s["top_logprobs"]},
        )
        for s in steps
    ]


def generate_steps(answer: dict[str, Any]) -> Steps:
    """The same view of a Tandem generate answer's first choice."""
    return [
        (
            int(s["token_id"]),
            float(s["logprob"]),
            {int(t["token_id"]): float(t["logprob"]) for t in s["top_logprobs"]},
        )
        for s in answer["choices"][0]["logprobs"]["content"]
    ]

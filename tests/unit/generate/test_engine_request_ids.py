"""Engine request ids: one caller's disconnect never aborts another's request with the same id,
and a cancelled handler leaves no generation running (observed on vLLM's own request table)."""

from __future__ import annotations

import asyncio

import pytest

from tandem_wire import GenerateRequest

from ...support.asgi import app_client
from .helpers import generate_app

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

PROMPT = [1017, 359, 261, 198, 82, 88, 1018, 198, 1017, 436, 198]


def long_request(request_id: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        token_ids=PROMPT,
        request_id=request_id,
        sampling_params={"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0},
    )


async def engine_idle(engine, within_s: float = 10.0) -> bool:
    for _ in range(int(within_s / 0.05)):
        if engine.llm.get_num_unfinished_requests() == 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_disconnect_aborts_only_its_own_request(qwen2_engine, qwen2_dir):
    app = generate_app(qwen2_engine, qwen2_dir, disconnect_poll_s=0.05)
    async with app_client(app):
        service = app.state.service
        leaving = asyncio.Event()

        async def gone() -> bool:
            return leaving.is_set()

        async def stays() -> bool:
            return False

        # Two callers happen to pick the same request id.
        first = asyncio.create_task(service.generate(long_request("same-id", 3000), gone))
        second = asyncio.create_task(service.generate(long_request("same-id", 400), stays))
        await asyncio.sleep(0.5)
        leaving.set()  # the first caller hangs up
        assert await first is None
        answer = await second
        assert answer is not None and answer.request_id == "same-id"
        assert len(answer.choices[0].token_ids or []) == 400
        assert await engine_idle(qwen2_engine)


async def test_a_cancelled_handler_aborts_its_engine_request(qwen2_engine, qwen2_dir):
    app = generate_app(qwen2_engine, qwen2_dir)
    async with app_client(app):
        service = app.state.service

        async def stays() -> bool:
            return False

        handler = asyncio.create_task(service.generate(long_request("cancelled", 3000), stays))
        for _ in range(200):
            if qwen2_engine.llm.get_num_unfinished_requests() > 0:
                break
            await asyncio.sleep(0.02)
        assert qwen2_engine.llm.get_num_unfinished_requests() > 0
        handler.cancel()  # e.g. the server shutting down under it
        with pytest.raises(asyncio.CancelledError):
            await handler
        assert await engine_idle(qwen2_engine), "a generation was left running for nobody"

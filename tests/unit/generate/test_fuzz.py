"""Fuzz the generate route with mutants of a real rendered request: no 5xx, still serving.

Seeded and bounded (``TANDEM_FUZZ_COUNT`` mutants, 150 by default; ``make fuzz`` runs more).
Every input that gets a 5xx is written to ``tests/fuzz_crashes/`` to become a regression test.
"""

from __future__ import annotations

import json
import os

import msgspec
import pytest

from tandem_wire import WireFormat, encode_generate_request

from ...support.asgi import app_client
from ...support.fuzz import keep_crash, mutations
from .helpers import GREEDY, generate_app, render, tokens

pytestmark = [pytest.mark.anyio, pytest.mark.vllm, pytest.mark.engine]

COUNT = int(os.environ.get("TANDEM_FUZZ_COUNT", "150"))


async def test_mutated_generate_requests_never_get_a_5xx(qwen2_engine, qwen2_renderer, qwen2_dir):
    req = await render(qwen2_renderer, qwen2_dir, [60, 61], **{**GREEDY, "max_tokens": 4})
    seed_doc = json.loads(encode_generate_request(req, WireFormat.JSON))
    app = generate_app(qwen2_engine, qwen2_dir)
    seen: dict[int, int] = {}
    async with app_client(app, raise_app_exceptions=False) as c:
        for doc in mutations(seed_doc, seed=13, count=COUNT):
            body = json.dumps(doc).encode()
            r = await c.post("/inference/v1/generate", content=body, timeout=120)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                path = keep_crash("generate", doc, r.text)
                pytest.fail(f"{r.status_code} for the input kept in {path}: {r.text[:300]}")
            if r.status_code >= 400:
                assert r.json()["error"]["type"], r.text
        # Mutants that the server took ran on the engine; the original still does.
        ok = await c.post(
            "/inference/v1/generate", content=msgspec.json.encode(seed_doc), timeout=120
        )
        assert ok.status_code == 200 and len(tokens(ok.json())) == 4
    print("generate fuzz: answers by status", dict(sorted(seen.items())))
    assert seen.get(400, 0) > 0  # the mutants did reach validation

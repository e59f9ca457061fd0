"""Generate test fixtures: ONE vLLM engine for the whole session (it takes ~25 s on CPU).

vLLM's async engine binds its output handler to the event loop of its first request, so these
tests share one session-wide event loop: anyio keeps its runner alive for as long as an
async fixture of that scope lives.
"""

from __future__ import annotations

import pytest

from .helpers import cpu_engine


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
async def qwen2_engine(qwen2_dir, anyio_backend):
    # An async session fixture keeps anyio's event loop alive across the tests.
    engine = cpu_engine(
        qwen2_dir,
        max_num_seqs=8,
        # Enforced by the service itself (test_items_and_hostile).
        limit_mm_per_prompt={"image": 4},
        # Precomputed embeddings (test_embeds). With the image limit above 0 this changes
        # nothing for pixel inputs: vLLM reads it only when parsing embedding inputs.
        enable_mm_embeds=True,
        # The file weight-transfer backend (tests/unit/generate/test_weight_updates.py);
        # tests that change the weights push the original ones back.
        weight_transfer_config={"backend": "tandem_file"},
    )
    yield engine
    engine.shutdown()

"""Test-session environment: offline hub, CPU engine settings, caches inside the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Each session ends with its time per module (tests/support/module_clock.py).
pytest_plugins = ["tests.support.module_clock"]

ROOT = Path(__file__).resolve().parent.parent

# Set before anything imports transformers or vLLM: nothing may reach a model hub, and the CPU
# engine needs a small KV cache on these machines (see ../shared/docs/running-vllm-here.md).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".cache" / "vllm"))
os.environ.setdefault("TANDEM_MODEL_CACHE", str(ROOT / ".cache" / "models"))
# Every engine the tests start (ours in-process, ours and vLLM's as servers) runs its model
# worker inside the engine-core process: the layout vLLM picks on one GPU. The CPU build
# otherwise spawns a third process that imports vLLM and torch again, 12 s more on each of
# the suite's engine starts on this 2-core box (vLLM's async engine still runs its core as a
# process of its own, so an engine's death is still a process dying). `make run`, the soak
# and the chaos run keep the CPU build's own layout.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# One OpenMP thread per engine. The CPU build's threads spin at each of a forward pass's
# hundreds of barriers, and every test runs an engine beside other busy processes (the test's
# own client and server, a second node, vllm serve): with one core taken, a two-thread engine
# ran the tiny model 3.4x slower and burnt 3x the CPU of a one-thread engine, which the busy
# core left untouched. Alone, two threads won only 25% on the tiny model.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Session-wide: one vLLM render stack per model (each takes seconds to build).


@pytest.fixture(scope="session")
def qwen2_dir():
    from tools.tiny_models import ensure_model

    return str(ensure_model("qwen2-vl"))


@pytest.fixture(scope="session")
def qwen2_renderer(qwen2_dir):
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer

    return EngineRenderer(RenderSettings(model=qwen2_dir, max_images_per_prompt=4))


@pytest.fixture(scope="session")
def qwen3_renderer():
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer
    from tools.tiny_models import ensure_model

    return EngineRenderer(RenderSettings(model=str(ensure_model("qwen3-vl"))))


@pytest.fixture(scope="session")
def qwen2_audio_dir():
    from tools.tiny_models import ensure_model

    return str(ensure_model("qwen2-audio"))


@pytest.fixture(scope="session")
def qwen2_audio_renderer(qwen2_audio_dir):
    from tandem_render.settings import RenderSettings
    from tandem_render.vllm_renderer import EngineRenderer

    return EngineRenderer(RenderSettings(model=qwen2_audio_dir, max_audios_per_prompt=4))

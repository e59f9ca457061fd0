"""Test-session environment: offline hub, CPU engine settings, caches inside the repo."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Set before anything imports transformers or vLLM: nothing may reach a model hub, and the CPU
# engine needs a small KV cache on these machines (see ../shared/docs/running-vllm-here.md).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_CACHE_ROOT", str(ROOT / ".cache" / "vllm"))
os.environ.setdefault("TANDEM_MODEL_CACHE", str(ROOT / ".cache" / "models"))

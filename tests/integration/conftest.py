"""Integration fixtures: the real services started as processes, once per test session."""

from __future__ import annotations

import pytest

from tools.servers import ServerProcess, free_port, python_module
from tools.tiny_models import ensure_model

ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "4096", "--max-num-seqs", "8", "--seed", "0"]


@pytest.fixture(scope="session")
def fleet():
    """Upstream render + serve (with scale-out), ours render + generate, on the tiny Qwen2-VL."""
    model = str(ensure_model("qwen2-vl"))
    ports = {name: free_port() for name in ("up_render", "up_serve", "render", "generate")}
    procs = {
        "up_render": ServerProcess(
            "upstream-render",
            python_module(
                "vllm.entrypoints.launchers.render.entry",
                "--model",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(ports["up_render"]),
            ),
            ports["up_render"],
        ),
        "up_serve": ServerProcess(
            "upstream-serve",
            python_module(
                "vllm.entrypoints.openai.api_server",
                "--model",
                model,
                "--host",
                "127.0.0.1",
                "--port",
                str(ports["up_serve"]),
                "--enable-scale-out",
                *ENGINE_ARGS,
            ),
            ports["up_serve"],
        ),
        "render": ServerProcess(
            "tandem-render",
            python_module(
                "tandem_render", "--model", model, "--workers", "1", "--port", str(ports["render"])
            ),
            ports["render"],
        ),
        "generate": ServerProcess(
            "tandem-generate",
            python_module(
                "tandem_generate", "--model", model, "--port", str(ports["generate"]), *ENGINE_ARGS
            ),
            ports["generate"],
        ),
    }
    try:
        for proc in procs.values():
            proc.wait_healthy(timeout=300)
        yield model, {name: p.url for name, p in procs.items()}
    finally:
        for proc in procs.values():
            proc.stop()

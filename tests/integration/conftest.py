"""Integration fixtures: the real services started as processes, once per test session."""

from __future__ import annotations

import os

import pytest

from tools.servers import (
    fork_servers_from,
    serving,
    tandem_front,
    tandem_generate,
    tandem_render,
    upstream_render,
    upstream_serve,
)
from tools.tiny_models import ensure_model
from tools.warm_start import WarmParent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that start engines of their own (``own_fleet``) run first: the session's shared
    fleet (three engines) lives until the session ends, and a second fleet beside it would not
    fit this machine's memory (24 GiB)."""
    items.sort(key=lambda item: item.get_closest_marker("own_fleet") is None)


@pytest.fixture(scope="session", autouse=True)
def warm_parent():
    """Servers forked from one parent that has imported vLLM, torch and transformers (see
    ``tools.warm_start``): each start skips ~8 s of imports. ``TANDEM_WARM_START=0`` starts
    every server as a fresh interpreter instead; ``test_examples`` always does (``make demo``
    runs the commands users run)."""
    if os.environ.get("TANDEM_WARM_START", "1") == "0":
        yield None
        return
    parent = WarmParent.start()
    fork_servers_from(parent)
    try:
        yield parent
    finally:
        fork_servers_from(None)
        parent.stop()


@pytest.fixture(scope="session")
def weight_dir(tmp_path_factory) -> str:
    """The fleet generate server's weight-transfer folder (trainers write updates here)."""
    return str(tmp_path_factory.mktemp("weight-transfer"))


@pytest.fixture(scope="session")
def fleet_servers(weight_dir):
    """Upstream render + serve (with scale-out), ours render + generate, on the tiny Qwen2-VL:
    the model folder and the ServerProcess of each."""
    model = str(ensure_model("qwen2-vl"))
    procs = {
        "up_render": upstream_render(model),
        "up_serve": upstream_serve(model),
        "render": tandem_render(model),
        "generate": tandem_generate(model, weight_dir),
    }
    with serving(procs.values(), timeout=300):
        yield model, procs


@pytest.fixture(scope="session")
def fleet(fleet_servers):
    """The model folder and each fleet server's base URL."""
    model, procs = fleet_servers
    return model, {name: p.url for name, p in procs.items()}


@pytest.fixture(scope="session")
def second_generate(fleet_servers, weight_dir):
    """A second generate process (the one extra engine a session may start), for affinity and
    control fan-out; it reads weight updates from the same folder as the first."""
    model, _ = fleet_servers
    with tandem_generate(model, weight_dir) as proc:
        proc.wait_healthy(timeout=300)
        yield proc


@pytest.fixture(scope="session")
def front_door(fleet_servers, second_generate):
    """The front door (2 workers) over our render and both generate processes: its URL, and
    the generate URLs in the order given."""
    model, procs = fleet_servers
    generate_urls = [procs["generate"].url, second_generate.url]
    with tandem_front(
        model, procs["render"].url, generate_urls, "--enable-control-routes", workers=2
    ) as proc:
        proc.wait_healthy(timeout=120)
        yield proc.url, generate_urls

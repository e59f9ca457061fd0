"""The door as a process over a name whose addresses change while it runs: its generate nodes
are ``dns+http://gen.test:PORT``, resolved from a hosts file (``--discovery-hosts-file``) the
test rewrites. The nodes are stand-in processes (tests/support/standin_node.py) on one port at
127.0.0.2-4, as pods behind a headless Service are: no engine is started."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tools.servers import ServerProcess, free_port, python_module, serving, tandem_front
from tools.tiny_models import ensure_model

pytestmark = [pytest.mark.integration, pytest.mark.vllm]  # the door loads vLLM's tokenizer

KEYS = [f"req-{i}" for i in range(30)]
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def standin(host: str, port: int, version: str) -> ServerProcess:
    args = ["--host", host, "--port", str(port), "--version", version]
    proc = ServerProcess(
        f"standin-{host}", python_module("tests.support.standin_node", *args), port
    )
    proc.url = f"http://{host}:{port}"
    return proc


@pytest.fixture
def nodes() -> Iterator[tuple[int, dict[str, ServerProcess]]]:
    port = free_port()
    procs = {a: standin(a, port, "base" if a == "127.0.0.4" else "step-1") for a in ADDRESSES}
    procs["render"] = standin("127.0.0.1", free_port(), "-")
    with serving(procs.values(), timeout=60):
        yield port, procs


def placement(door: str) -> dict[str, str]:
    out = {}
    for key in KEYS:
        body = {"request_id": key, "token_ids": [1, 2], "sampling_params": {}}
        r = httpx.post(f"{door}/inference/v1/generate", json=body, timeout=30)
        assert r.status_code == 200, r.text
        out[key] = r.json()["node"]
    return out


def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def listed(door: str) -> set[str]:
    """The generate nodes the door knows now (its /weight_info asks every one)."""
    info = httpx.get(f"{door}/weight_info", timeout=30).json()
    return {httpx.URL(n["url"]).host for n in info["nodes"]}


def test_the_door_follows_the_name_and_admits_a_new_node_at_the_fleet_s_version(nodes, tmp_path):
    port, procs = nodes
    hosts = tmp_path / "hosts"

    def name(*addresses: str) -> None:
        tmp = Path(f"{hosts}.new")
        tmp.write_text("".join(f"{a} gen.test\n" for a in addresses))
        tmp.replace(hosts)  # whole, as a lookup may read it any time

    name("127.0.0.2", "127.0.0.3")
    model = str(ensure_model("qwen2-vl"))
    with tandem_front(
        model,
        procs["render"].url,
        f"dns+http://gen.test:{port}",
        "--enable-control-routes",
        "--discovery-hosts-file",
        str(hosts),
        "--discovery-interval-s",
        "0.2",
    ) as door:
        door.wait_healthy(timeout=120)
        before = placement(door.url)
        assert set(before.values()) == {"127.0.0.2", "127.0.0.3"}

        # A node joins at the base weights: known to the door, no inference work.
        name(*ADDRESSES)
        until(lambda: "127.0.0.4" in listed(door.url), "the door sees the new node")
        assert placement(door.url) == before

        # At the fleet's version it gets the keys it wins, and only those move.
        httpx.post(
            f"{procs['127.0.0.4'].url}/update_weight_version", json={"new_version": "step-1"}
        )
        until(lambda: "127.0.0.4" in placement(door.url).values(), "the new node gets work")
        after = placement(door.url)
        assert {after[k] for k in KEYS if after[k] != before[k]} == {"127.0.0.4"}

        # A node leaves the name while still up: no more work, only its keys move.
        name("127.0.0.2", "127.0.0.4")
        until(lambda: "127.0.0.3" not in listed(door.url), "the door drops the node")
        served = len(httpx.get(f"{procs['127.0.0.3'].url}/seen").json())
        last = placement(door.url)
        assert len(httpx.get(f"{procs['127.0.0.3'].url}/seen").json()) == served
        assert all(last[k] == after[k] for k in KEYS if after[k] != "127.0.0.3")

"""Admin keys on real processes: two generate nodes behind the door, each with inference and
admin keys. Every state-changing control route called with an inference key, at the door and
at each node, is refused 403 ``admin_required`` and leaves the engines as they were (not
paused, the same weight version, no update left started, a running request running to its
end); an admin's calls through the door reach both nodes under the door's upstream admin key.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tools.servers import serving, tandem_front, tandem_generate, tandem_render
from tools.tiny_models import ensure_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # two engines of its own: run before the shared fleet exists
]

NODE_KEY, NODE_ADMIN = "node-inference", "node-admin"
DOOR_KEY, DOOR_ADMIN = "door-inference", "door-admin"
STATE_CHANGING: list[tuple[str, Any]] = [
    ("/abort_requests", {}),
    ("/pause", None),
    ("/resume", None),
    ("/reset_prefix_cache", None),
    ("/init_weight_transfer_engine", {"init_info": {}}),
    ("/start_weight_update", {}),
    ("/update_weights", {"update_info": {"path": "x.safetensors"}}),
    ("/finish_weight_update", {"weight_version": "stolen"}),
    ("/update_weight_version", {"new_version": "stolen"}),
]
LONG = {"max_tokens": 4000, "ignore_eos": True, "temperature": 0.0}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed_fleet(tmp_path_factory):
    """The door's URL and the two generate nodes' URLs; each node serves NODE_KEY and
    NODE_ADMIN, the door DOOR_KEY and DOOR_ADMIN and sends the nodes theirs."""
    model = str(ensure_model("qwen2-vl"))
    weights = str(tmp_path_factory.mktemp("weights"))
    keys = ("--api-key", NODE_KEY, "--admin-api-key", NODE_ADMIN)
    procs = [tandem_render(model), *(tandem_generate(model, weights, *keys) for _ in (1, 2))]
    urls = [p.url for p in procs[1:]]
    door_keys = ("--api-key", DOOR_KEY, "--admin-api-key", DOOR_ADMIN)
    upstream = ("--upstream-api-key", NODE_KEY, "--upstream-admin-api-key", NODE_ADMIN)
    # The render node has no key: the door's upstream key is the generate nodes'. The door
    # starts with the nodes: its /health answers once theirs do.
    door = tandem_front(model, procs[0].url, urls, *door_keys, *upstream)
    with serving([*procs, door], timeout=300):
        yield door.url, urls


def node_state(url: str) -> tuple[bool, str]:
    paused = httpx.get(f"{url}/is_paused", headers=bearer(NODE_KEY), timeout=10).json()
    info = httpx.get(f"{url}/weight_info", headers=bearer(NODE_KEY), timeout=10).json()
    return paused["is_paused"], info["weight_version"]


def stream_to_its_end(door: str, body: dict, first: threading.Event, out: dict) -> None:
    """Streams ``body`` through the door: ``first`` is set once a token came back (the request
    runs in the engine), and ``out`` gets the status, the tokens, the finish reason and when
    the last chunk came."""
    tokens: list[int] = []
    with httpx.stream(
        "POST",
        f"{door}/inference/v1/generate",
        json={**body, "stream": True},
        headers=bearer(DOOR_KEY),
        timeout=300,
    ) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line.removeprefix("data: "))["choices"][0]
            tokens += choice.get("token_ids") or []
            out["finish"] = choice.get("finish_reason") or out.get("finish")
            if tokens:
                first.set()
    out.update(tokens=len(tokens), ended=time.monotonic())
    first.set()  # also when it failed: the test reads why


def test_inference_keys_change_nothing_and_admins_reach_every_node(keyed_fleet):
    door, nodes = keyed_fleet
    assert [node_state(u) for u in nodes] == [(False, "default")] * 2
    body = {"token_ids": [1017, 82, 88, 282, 1018], "sampling_params": LONG}
    first, out = threading.Event(), {}
    request = threading.Thread(target=stream_to_its_end, args=(door, body, first, out))
    request.start()
    assert first.wait(timeout=120) and out.get("status", 200) == 200, out
    # Held in flight by an admin (vLLM's keep pause on both nodes at once: it waits, neither
    # aborted nor finished), so every refusal below meets it running, however slowly a busy
    # node answers.
    keep = {"mode": "keep", "clear_cache": "false"}
    r = httpx.post(f"{door}/pause", params=keep, headers=bearer(DOOR_ADMIN), timeout=60)
    assert r.status_code == 200, r.text
    assert "ended" not in out, "the request ended before it could be held"

    # Every state-changing route, with an inference key: at the door, then at each node.
    targets = [(door, DOOR_KEY), *((u, NODE_KEY) for u in nodes)]
    for path, payload in STATE_CHANGING:
        for base, key in targets:
            r = httpx.post(f"{base}{path}", json=payload, headers=bearer(key), timeout=30)
            assert r.status_code == 403, (base, path, r.text)
            assert r.json()["error"]["type"] == "admin_required", (base, path)
    assert [node_state(u) for u in nodes] == [(True, "default")] * 2
    assert "ended" not in out
    r = httpx.post(f"{door}/resume", headers=bearer(DOOR_ADMIN), timeout=60)
    assert r.status_code == 200, r.text
    request.join(timeout=240)
    # Not aborted: once resumed it ran to its end.
    assert (out["status"], out["finish"], out["tokens"]) == (200, "length", 4000)
    assert [node_state(u) for u in nodes] == [(False, "default")] * 2

    # An admin through the door reaches both nodes (the door sends its upstream admin key).
    admin = bearer(DOOR_ADMIN)
    assert httpx.post(f"{door}/pause", headers=admin, timeout=60).status_code == 200
    assert [node_state(u)[0] for u in nodes] == [True, True]
    assert httpx.post(f"{door}/resume", headers=admin, timeout=60).status_code == 200
    # No update was left started by the refused calls: the admin's start is no conflict.
    r = httpx.post(f"{door}/start_weight_update", json={}, headers=admin, timeout=60)
    assert r.status_code == 200, r.text
    finish = {"weight_version": "v-admin"}
    r = httpx.post(f"{door}/finish_weight_update", json=finish, headers=admin, timeout=120)
    assert r.status_code == 200, r.text
    assert [node_state(u) for u in nodes] == [(False, "v-admin")] * 2

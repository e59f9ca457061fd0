"""Admin keys on real processes: two generate nodes behind the door, each with inference and
admin keys. Every state-changing control route called with an inference key, at the door and
at each node, is refused 403 ``admin_required`` and leaves the engines as they were (not
paused, the same weight version, no update left started, a running request running to its
end); an admin's calls through the door reach both nodes under the door's upstream admin key.
"""

from __future__ import annotations

import re
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
LONG = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0.0}


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
    with serving(procs, timeout=300):
        urls = [p.url for p in procs[1:]]
        door_keys = ("--api-key", DOOR_KEY, "--admin-api-key", DOOR_ADMIN)
        upstream = ("--upstream-api-key", NODE_KEY, "--upstream-admin-api-key", NODE_ADMIN)
        # The render node has no key: the door's upstream key is the generate nodes'.
        with tandem_front(model, procs[0].url, urls, *door_keys, *upstream) as door:
            door.wait_healthy(timeout=120)
            yield door.url, urls


def running(url: str) -> float:
    """The engine's own gauge of requests running on a node."""
    text = httpx.get(f"{url}/metrics", headers=bearer(NODE_KEY), timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if re.match(r"vllm:num_requests_running\{", line)
    )


def node_state(url: str) -> tuple[bool, str]:
    paused = httpx.get(f"{url}/is_paused", headers=bearer(NODE_KEY), timeout=10).json()
    info = httpx.get(f"{url}/weight_info", headers=bearer(NODE_KEY), timeout=10).json()
    return paused["is_paused"], info["weight_version"]


def test_inference_keys_change_nothing_and_admins_reach_every_node(keyed_fleet):
    door, nodes = keyed_fleet
    assert [node_state(u) for u in nodes] == [(False, "default")] * 2
    answers: list[httpx.Response] = []
    body = {"token_ids": [1017, 82, 88, 282, 1018], "sampling_params": LONG}
    request = threading.Thread(
        target=lambda: answers.append(
            httpx.post(
                f"{door}/inference/v1/generate",
                json=body,
                headers=bearer(DOOR_KEY),
                timeout=300,
            )
        )
    )
    request.start()
    deadline = time.monotonic() + 60
    while sum(running(u) for u in nodes) < 1:
        assert time.monotonic() < deadline and request.is_alive(), "the request never ran"
        time.sleep(0.05)

    # Every state-changing route, with an inference key: at the door, then at each node;
    # aborts first, while the request surely runs.
    targets = [(door, DOOR_KEY), *((u, NODE_KEY) for u in nodes)]
    for path, payload in STATE_CHANGING:
        for base, key in targets:
            r = httpx.post(f"{base}{path}", json=payload, headers=bearer(key), timeout=30)
            assert r.status_code == 403, (base, path, r.text)
            assert r.json()["error"]["type"] == "admin_required", (base, path)
        if path == "/abort_requests":
            assert request.is_alive() and sum(running(u) for u in nodes) == 1
    assert [node_state(u) for u in nodes] == [(False, "default")] * 2
    request.join(timeout=240)
    (answer,) = answers
    assert answer.status_code == 200, answer.text[:500]
    choice = answer.json()["choices"][0]
    assert (choice["finish_reason"], len(choice["token_ids"])) == ("length", 3000)

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

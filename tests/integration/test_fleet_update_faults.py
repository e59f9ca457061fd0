"""A weight update through the door over two real generate nodes, one node SIGKILLed between
update and finish: the caller is told which node failed and how, the survivor serves the new
weights under the new label, and the killed node, restarted with its checkpoint, gets no
request until an update brings it to the fleet's version. Every completion's label is checked
against the tokens of weights known to be loaded (the restarted node's checkpoint, and the same
node after the fleet update)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.support.greedy_probe import completion
from tools.servers import free_port, serving, tandem_front, tandem_generate
from tools.tiny_models import ensure_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # two engines of its own: run before the shared fleet exists
]


def perturbed_head(model: str) -> dict:
    import torch
    from safetensors.torch import load_file

    head = load_file(f"{model}/model.safetensors")["lm_head.weight"]
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(head.shape, generator=gen) * (head.float().std() + 0.01) * 4
    return {"lm_head.weight": (head.float() + noise).to(head.dtype)}


def served(url: str) -> float:
    """Requests the node's engine finished (its own counter)."""
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total{")
    )


@pytest.fixture
def two_nodes(tmp_path):
    model = str(ensure_model("qwen2-vl"))
    weights = tmp_path / "weights"
    weights.mkdir()
    nodes = [tandem_generate(model, str(weights)), tandem_generate(model, str(weights))]
    with serving(nodes, timeout=300):  # also stops the restarted node the test puts in
        yield model, weights, nodes


def test_a_node_killed_between_update_and_finish_is_fenced_and_no_label_lies(two_nodes):
    from safetensors.torch import save_file

    model, weights, nodes = two_nodes
    a, b = nodes
    checkpoint_tokens, label = completion(a.url, "probe-0")
    assert label == "default"
    save_file(perturbed_head(model), str(weights / "step-1.safetensors"))
    dead_render = f"http://127.0.0.1:{free_port()}"  # the door's generate side alone is used
    flags = ("--enable-control-routes", "--fence-poll-s", "0.5")
    with tandem_front(model, dead_render, [a.url, b.url], *flags) as door:
        door.wait_healthy(timeout=120, path="/weight_info")
        ctl = httpx.Client(base_url=door.url, timeout=120)
        assert ctl.post("/start_weight_update", json={}).status_code == 200
        r = ctl.post("/update_weights", json={"update_info": {"path": "step-1.safetensors"}})
        assert r.status_code == 200, r.text
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait(timeout=30)
        r = ctl.post("/finish_weight_update", json={"weight_version": "step-1"})
        # The caller is told the finish failed on B, and how: not a success, not A's answer.
        assert r.status_code == 502
        error = r.json()["error"]
        assert [(f["url"], f["status"], f["type"]) for f in error["details"]["failed"]] == [
            (b.url, 0, "unreachable")
        ]
        assert error["details"]["succeeded"] == [a.url]
        info = ctl.get("/weight_info").json()
        assert info["weight_version"] == "step-1" and info["fenced"] == [b.url]

        new_tokens, label = completion(a.url, "probe-1")
        assert (label, new_tokens != checkpoint_tokens) == ("step-1", True)
        # Through the door, every request (on the keys that went to B before) is A's.
        for i in range(6):
            assert completion(door.url, f"req-{i}") == (new_tokens, "step-1")

        # B comes back with its checkpoint: it tells its own label truly, and gets no work.
        b.stop()
        b2 = b.restarted()
        nodes[1] = b2
        b2.wait_healthy(timeout=300)
        assert completion(b2.url, "probe-2") == (checkpoint_tokens, "default")
        time.sleep(1.5)  # a few of the door's version polls
        assert ctl.get("/weight_info").json()["fenced"] == [b2.url]
        before = served(b2.url)
        for i in range(6):
            assert completion(door.url, f"req-{i}") == (new_tokens, "step-1")
        assert served(b2.url) == before

        # The next fleet update (the same file) reaches B: both now compute what A computed
        # under step-1, so that label named those weights; B is unfenced and serves again.
        assert ctl.post("/start_weight_update", json={}).status_code == 200
        r = ctl.post("/update_weights", json={"update_info": {"path": "step-1.safetensors"}})
        assert r.status_code == 200, r.text
        r = ctl.post("/finish_weight_update", json={"weight_version": "step-2"})
        assert r.status_code == 200, r.text
        assert completion(b2.url, "probe-3") == (new_tokens, "step-2")
        assert ctl.get("/weight_info").json()["fenced"] == []
        # The door may still hold B back: a worker that read the versions mid-update keeps it
        # fenced until its next poll (every 0.5 s here), and the polls that failed while B was
        # down cooled it down for node_cooldown_s (5 s) past the last of them. Requests go on
        # until B serves one, each answered under step-2, within a bound far past both.
        before = served(b2.url)
        deadline = time.monotonic() + 60
        sent = 0
        while served(b2.url) == before:
            assert time.monotonic() < deadline, f"B got none of {sent} requests once unfenced"
            assert completion(door.url, f"req-{sent % 12}") == (new_tokens, "step-2")
            sent += 1

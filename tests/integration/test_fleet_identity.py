"""TRL's weight-update sequence through the door over two real generate nodes, as TRL 1.16
sends it (pause keep, start, one chunk, finish with ``{}``: the label never changes, resume),
node B's chunk failing (its weight folder lacks the file). The door must route by what each
node loaded, not by the label both still carry: no answer comes from B's old weights. Then A
is killed: within the node timeout B is the fleet, the door updates it and it serves the new
weights. The new weights are a zeroed ``lm_head``: every logit is 0, so their greedy answer is
token 0 again and again, unlike the checkpoint's."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx
import pytest

from tests.support.greedy_probe import PROMPT, completion
from tools.servers import free_port, serving, tandem_front, tandem_generate
from tools.tiny_models import ensure_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.vllm,
    pytest.mark.engine,
    pytest.mark.own_fleet,  # two engines of its own: run before the shared fleet exists
]

ZEROED = [0] * 8
NODE_TIMEOUT_S = 3.0


def zeroed_head(model: str) -> dict:
    import torch
    from safetensors.torch import load_file

    head = load_file(f"{model}/model.safetensors")["lm_head.weight"]
    return {"lm_head.weight": torch.zeros_like(head)}


def trl_update(door: str, path: str) -> list[int]:
    """TRL 1.16's calls for one update (its ``weight_update()`` block between a keep pause
    and a resume); each step's status."""
    ctl = httpx.Client(base_url=door, timeout=120)
    steps = [
        ctl.post("/pause", params={"mode": "keep"}),
        ctl.post("/start_weight_update", json={}),
        ctl.post("/update_weights", json={"update_info": {"path": path}}),
        ctl.post("/finish_weight_update", json={}),
        ctl.post("/resume"),
    ]
    return [r.status_code for r in steps]


@pytest.fixture
def two_nodes(tmp_path):
    model = str(ensure_model("qwen2-vl"))
    dirs = [tmp_path / "weights-a", tmp_path / "weights-b"]
    for d in dirs:
        d.mkdir()
    nodes = [tandem_generate(model, str(d)) for d in dirs]
    with serving(nodes, timeout=300):
        yield model, dirs, nodes


def test_trl_s_unlabelled_updates_never_serve_old_weights_and_the_fleet_outlives_a_dead_node(
    two_nodes,
):
    from safetensors.torch import save_file

    model, (dir_a, dir_b), (a, b) = two_nodes
    checkpoint_tokens, _ = completion(a.url, "probe-0")
    assert checkpoint_tokens != ZEROED
    save_file(zeroed_head(model), str(dir_a / "step.safetensors"))  # B's folder lacks it
    dead_render = f"http://127.0.0.1:{free_port()}"  # the door's generate side alone is used
    flags = ("--enable-control-routes", "--fence-poll-s", "0.5")
    flags += ("--node-timeout-s", str(NODE_TIMEOUT_S), "--control-timeout-s", "5")
    with tandem_front(model, dead_render, [a.url, b.url], *flags) as door:
        door.wait_healthy(timeout=120, path="/weight_info")
        # B refuses its chunk: the chunk's answer names it, and B's update is ended; the
        # finish goes to the nodes still in the update (A), which finishes, label unchanged.
        assert trl_update(door.url, "step.safetensors") == [200, 200, 502, 200, 200]
        assert completion(a.url, "probe-1") == (ZEROED, "default")
        assert completion(b.url, "probe-2") == (checkpoint_tokens, "default")
        info = httpx.get(f"{door.url}/weight_info").json()
        assert info["fenced"] == [b.url] and info["weight_version"] == "default"
        # Fenced at once for its failed step, then for what its next /weight_info tells.
        assert [n["reason"] for n in info["nodes"]][0] is None
        assert info["nodes"][1]["reason"] in ("update_step_failed", "other_weights")
        assert _reasons_settle(door.url, [None, "other_weights"])
        # Every answer through the door is A's, on the keys that went to B before as well.
        for i in range(12):
            assert completion(door.url, f"req-{i}") == (ZEROED, "default")

        # A dies. Within the node timeout (and a poll) B alone is the fleet and serves.
        os.killpg(a.proc.pid, signal.SIGKILL)
        a.proc.wait(timeout=30)
        died = time.monotonic()
        served = None
        while served is None and time.monotonic() - died < NODE_TIMEOUT_S + 10:
            body = {"token_ids": PROMPT, "sampling_params": {"temperature": 0.0, "max_tokens": 8}}
            r = httpx.post(f"{door.url}/inference/v1/generate", json=body, timeout=60)
            if r.status_code == 200:
                served = r.json()["choices"][0]["token_ids"]
            else:
                assert (r.status_code, r.json()["error"]["type"]) == (503, "upstream_unavailable")
                time.sleep(0.2)
        assert served == checkpoint_tokens, "B did not take over once A had left the fleet"
        assert time.monotonic() - died < NODE_TIMEOUT_S + 10

        # The next update goes to B alone (A has left the quorum) and B serves it.
        shutil.copy(dir_a / "step.safetensors", dir_b / "step.safetensors")
        assert trl_update(door.url, "step.safetensors") == [200, 200, 200, 200, 200]
        for i in range(6):
            assert completion(door.url, f"after-{i}") == (ZEROED, "default")
        info = httpx.get(f"{door.url}/weight_info").json()
        assert [(n["url"], n["reason"]) for n in info["nodes"]] == [
            (a.url, "unreachable"),
            (b.url, None),
        ]

        # A comes back on its checkpoint, a new process that lost the fleet's updates: fenced
        # as restarted (it tells less than it had), never the fleet's reference.
        a2 = a.restarted()
        two_nodes[2][0] = a2
        a2.wait_healthy(timeout=300)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            info = httpx.get(f"{door.url}/weight_info").json()
            if info["nodes"][0]["reason"] != "unreachable":
                break
            time.sleep(0.3)
        assert info["fenced"] == [a2.url] and info["nodes"][0]["reason"] == "restarted"
        for i in range(6):
            assert completion(door.url, f"back-{i}") == (ZEROED, "default")


def _reasons_settle(door: str, expected: list[str | None], within_s: float = 10.0) -> bool:
    """Whether the door's fencing reasons become ``expected`` within ``within_s`` (its polls
    are 0.5 s apart)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        nodes = httpx.get(f"{door}/weight_info").json()["nodes"]
        if [n["reason"] for n in nodes] == expected:
            return True
        time.sleep(0.2)
    return False

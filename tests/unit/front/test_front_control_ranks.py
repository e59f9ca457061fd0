"""The door's RL control routes over several generate nodes: each node's workers get their own
NCCL ranks in ``/init_weight_transfer_engine``; world sizes and weight versions need every
node's answer. The nodes here are stand-ins that tell a world size and a weight version and
record the init bodies they get (real nodes: tests/integration/test_front_ranks.py)."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tandem_front.app import create_app
from tests.support.asgi import app_client

from .test_front_routing import Fleet, Texts, settings

pytestmark = pytest.mark.anyio

INIT = "/init_weight_transfer_engine"


class RlNode:
    """A generate node as the control routes see it: ``world_size`` workers (None: it answers
    /get_world_size with an error), a weight version, and every init body it received."""

    def __init__(self, world_size: int | None = 1, version: str = "default") -> None:
        self.world_size = world_size
        self.version = version
        self.inits: list[bytes] = []
        self.paths: list[str] = []
        self.size_answer: dict | None = None
        """When set, /get_world_size answers this instead."""

    async def handle(self, request: Request) -> Response:
        self.paths.append(request.url.path)
        if request.url.path == INIT:
            self.inits.append(await request.body())
            return JSONResponse({"message": "Weight transfer initialized"})
        if request.url.path == "/weight_info":
            return JSONResponse({"weight_version": self.version})
        if self.size_answer is not None:
            return JSONResponse(self.size_answer)
        if self.world_size is None:
            return JSONResponse({"error": {"type": "internal_error", "message": "x"}}, 500)
        return JSONResponse({"world_size": self.world_size})

    def ranks(self) -> list[int]:
        """The rank each worker would join with, as vLLM computes it (worker rank + offset)."""
        offset = json.loads(self.inits[-1])["init_info"]["rank_offset"]
        return [offset + w for w in range(self.world_size or 0)]

    def app(self) -> Starlette:
        paths = ["/get_world_size", "/weight_info", INIT]
        return Starlette(routes=[Route(p, self.handle, methods=["GET", "POST"]) for p in paths])


def door(*nodes: RlNode) -> tuple[Fleet, object]:
    names = [f"g{i + 1}" for i in range(len(nodes))]
    fleet = Fleet(dict(zip(names, nodes, strict=True)))
    urls = tuple(f"http://{n}" for n in names)
    return fleet, create_app(settings(generate_urls=urls), Texts(), fleet)


def trl_init(world_size: int) -> dict:
    """The body TRL's VLLMClient.init_communicator posts (trainer at rank 0, workers after)."""
    info = {
        "master_address": "10.0.0.7",
        "master_port": 51216,
        "rank_offset": 1,
        "world_size": world_size,
        "packed": True,
    }
    return {"init_info": info}


@pytest.mark.parametrize("sizes", [(1, 1), (2, 3), (4, 1, 2)])
async def test_each_node_s_workers_get_their_own_ranks_in_the_configured_order(sizes):
    nodes = [RlNode(s) for s in sizes]
    _, app = door(*nodes)
    async with app_client(app) as c:
        group = (await c.get("/get_world_size")).json()["world_size"] + 1
        r = await c.post(INIT, json=trl_init(group))
    assert r.status_code == 200, r.text
    offsets = [json.loads(n.inits[0])["init_info"]["rank_offset"] for n in nodes]
    expected = [1 + sum(sizes[:i]) for i in range(len(sizes))]
    assert offsets == expected
    # Every worker of the fleet on its own rank, together exactly the ranks after the trainer.
    ranks = [r for n in nodes for r in n.ranks()]
    assert sorted(ranks) == list(range(1, group))
    # The rest of the body as the caller sent it; world_size the whole group on every node.
    for n, offset in zip(nodes, offsets, strict=True):
        assert json.loads(n.inits[0]) == {
            "init_info": {**trl_init(group)["init_info"], "rank_offset": offset}
        }


async def test_world_sizes_are_asked_when_init_arrives_not_remembered():
    a, b = RlNode(3), RlNode(1)
    _, app = door(a, b)
    async with app_client(app) as c:
        assert (await c.get("/get_world_size")).json() == {"world_size": 4}
        a.world_size = 1  # the node restarted with fewer workers
        r = await c.post(INIT, json=trl_init(3))
    assert r.status_code == 200, r.text
    assert (a.ranks(), b.ranks()) == ([1], [2])


@pytest.mark.parametrize("how", ["unreachable", "error", "no world size"])
async def test_init_is_sent_to_no_node_when_one_does_not_tell_its_world_size(how):
    nodes = [RlNode(1), RlNode(2), RlNode(1)]
    fleet, app = door(*nodes)
    if how == "unreachable":
        fleet.down.add("g2")
    elif how == "error":
        nodes[1].world_size = None
    else:
        nodes[1].size_answer = {"size": 2}
    async with app_client(app) as c:
        r = await c.post(INIT, json=trl_init(5))
    err = r.json()["error"]
    assert r.status_code == 502
    assert err["type"] == (
        "upstream_error" if how == "no world size" else "control_partial_failure"
    )
    assert "http://g2" in err["message"] and "http://g1" not in err["message"]
    assert not any(n.inits for n in nodes)


async def test_a_group_too_small_for_the_nodes_workers_is_refused_before_any_is_sent():
    nodes = [RlNode(2), RlNode(2)]
    _, app = door(*nodes)
    async with app_client(app) as c:
        r = await c.post(INIT, json=trl_init(4))  # needs 1 + 2 + 2 = 5
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request"
    assert r.json()["error"]["param"] == "init_info.world_size"
    assert not any(n.inits for n in nodes)


async def test_an_init_without_ranks_goes_to_every_node_as_sent():
    nodes = [RlNode(1), RlNode(1)]
    _, app = door(*nodes)
    raw = b'{"init_info": {}}'
    async with app_client(app) as c:
        r = await c.post(INIT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 200
    assert [n.inits for n in nodes] == [[raw], [raw]]
    # No world size asked (the door's own /weight_info polls aside).
    assert all([p for p in n.paths if p != "/weight_info"] == [INIT] for n in nodes)


async def test_a_rank_offset_that_is_not_a_number_is_refused():
    nodes = [RlNode(1), RlNode(1)]
    _, app = door(*nodes)
    body = trl_init(3)
    body["init_info"]["rank_offset"] = "1"
    async with app_client(app) as c:
        r = await c.post(INIT, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "init_info.rank_offset"
    assert not any(n.inits for n in nodes)


async def test_world_size_adds_up_the_nodes_and_a_silent_node_is_an_error():
    fleet, app = door(RlNode(2), RlNode(3))
    async with app_client(app) as c:
        assert (await c.get("/get_world_size")).json() == {"world_size": 5}
        fleet.down.add("g2")
        r = await c.get("/get_world_size")
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["type"] == "control_partial_failure" and "http://g2" in err["message"]
    assert err["details"]["succeeded"] == ["http://g1"]


async def test_weight_info_lists_every_node_s_version():
    a, b = RlNode(version="step-3"), RlNode(version="step-3")
    fleet, app = door(a, b)
    async with app_client(app) as c:
        agreed = (await c.get("/weight_info")).json()
        b.version = "step-2"  # nodes that disagree, neither updated since it started
        split = (await c.get("/weight_info")).json()
        fleet.down.add("g1")
        r = await c.get("/weight_info")

    def listed(answer):
        return [(n["url"], n["weight_version"], n["fenced"], n["reason"]) for n in answer["nodes"]]

    # Nodes that report only a label (upstream vLLM's /weight_info) hold the weights it names.
    assert agreed["weight_version"] == "step-3" and agreed["fenced"] == []
    assert listed(agreed) == [
        ("http://g1", "step-3", False, None),
        ("http://g2", "step-3", False, None),
    ]
    # Two labels and no update behind either: one set of weights is the fleet's (the same on
    # every router), the other node is fenced and says why.
    assert split["weight_version"] == "step-3" and split["fenced"] == ["http://g2"]
    assert listed(split)[1] == ("http://g2", "step-2", True, "other_weights")
    # A node that does not answer is listed as last known (a report, not an error): within the
    # node timeout it still counts.
    assert r.status_code == 200 and listed(r.json())[0] == ("http://g1", "step-3", False, None)

"""Who may serve behind the door when nodes hang, restart, stay paused or start up (issue 41):
the SEQ order outlives nodes that leave and restart, a restarted node is never the newest, a
hung node delays no other node's judgement, a node that fails a finish is fenced at once, a
paused node gets nothing while another may serve, a read timeout cools a node down, and
nothing is served before each node answered once. The nodes are the stand-ins of
``tests/support/fleet_nodes`` (the real node record); the door is the real one, in-process."""

from __future__ import annotations

import anyio
import httpx
import pytest

from tandem_client.routing import ROUTE_KEY_HEADER, rendezvous_order
from tandem_front.app import create_app
from tests.support.asgi import app_client
from tests.support.fleet_nodes import GenFleet, GenNode

from .test_front_routing import Texts, settings

pytestmark = pytest.mark.anyio

KEYS = [f"key-{i}" for i in range(24)]
BODY = {"token_ids": [1], "sampling_params": {}}


def door(f: GenFleet, urls=("http://g1", "http://g2"), **kw):
    # No cool-down and no poll of its own unless a test asks: what keeps requests off a node
    # is what the door judged from the nodes' answers.
    base = dict(generate_urls=urls, fence_poll_s=3600.0, node_cooldown_s=0.0)
    return create_app(settings(**{**base, **kw}), Texts(), f)


async def generate_many(c, keys=KEYS) -> list[int]:
    statuses = []
    for key in keys:
        r = await c.post("/inference/v1/generate", json=BODY, headers={ROUTE_KEY_HEADER: key})
        statuses.append(r.status_code)
    return statuses


async def push(c, name: str) -> list[int]:
    """TRL's sequence (start, one chunk of every tensor, finish with ``{}``): each status."""
    codes = []
    for path, body in (
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": {"path": name}}),
        ("/finish_weight_update", {}),
    ):
        codes.append((await c.post(path, json=body)).status_code)
    return codes


def upstreams(app):
    return app.state.forwarder.upstreams  # the door's own record of the nodes


async def test_an_update_after_a_restart_outranks_a_node_that_was_away():
    # The live repro of hole 1: A and B take u1-u3; B stops answering past the node timeout;
    # A restarts (its record empty); u4 goes through the door; B comes back with u3.
    a, b = GenNode("g1"), GenNode("g2")
    app = door(GenFleet(a, b), node_timeout_s=0.05)
    async with app_client(app) as c:
        for name in ("u1", "u2", "u3"):
            assert await push(c, name) == [200, 200, 200]
        b.down = True
        await c.get("/weight_info")  # the door finds B unreachable
        await anyio.sleep(0.1)  # past the node timeout: B has left the fleet
        a.restart()  # a new process on its checkpoint: it applied nothing
        info = (await c.get("/weight_info")).json()
        # A is a restarted node, not the newest: its checkpoint is not the fleet's weights.
        assert [n["reason"] for n in info["nodes"]] == ["restarted", "unreachable"]
        assert set(await generate_many(c, KEYS[:4])) == {503} and a.generated == []
        assert await push(c, "u4") == [200, 200, 200]
        assert a.ledger.info("", None).applied_seqs == [4]  # minted above every SEQ seen
        b.down = False  # B comes back, holding u3
        info = (await c.get("/weight_info")).json()
        assert info["applied_seqs"] == [4] and info["fenced"] == ["http://g2"]
        assert set(await generate_many(c)) == {200}
    assert b.generated == [] and a.computed_with() == {"u4"}


async def test_a_node_that_fails_its_finish_is_fenced_while_a_hung_node_holds_the_step():
    a, b, h = GenNode("g1"), GenNode("g2"), GenNode("g3")
    app = door(GenFleet(a, b, h), urls=("http://g1", "http://g2", "http://g3"))
    async with app_client(app) as c:
        for path, body in (
            ("/start_weight_update", {}),
            ("/update_weights", {"update_info": {"path": "v1"}}),
        ):
            assert (await c.post(path, json=body)).status_code == 200
        b.fail["finish_weight_update"] = "refuse"
        h.fail["finish_weight_update"] = "hang"  # H never answers the finish
        ups = upstreams(app)
        async with anyio.create_task_group() as tg:

            async def finish() -> None:
                await c.post("/finish_weight_update", json={})

            tg.start_soon(finish)
            with anyio.fail_after(30):  # the finish itself waits the read timeout for H
                while ups.view().reasons["http://g2"] is None:
                    await anyio.sleep(0.01)
            # While H holds the finish: B (failed it) and H (still loading) get nothing.
            b.generated.clear(), h.generated.clear()
            assert set(await generate_many(c)) == {200}
            assert b.generated == [] and h.generated == [] and a.computed_with() == {"v1"}
            tg.cancel_scope.cancel()


async def test_a_hung_node_delays_no_other_node_s_judgement():
    a, b = GenNode("g1"), GenNode("g2")
    app = door(GenFleet(a, b), fence_poll_s=0.05, control_timeout_s=3600.0)
    async with app_client(app) as c:
        assert await push(c, "v1") == [200, 200, 200]
        b.fail["weight_info"] = "hang"  # B's polls never come back
        a.restart()  # A restarted on its checkpoint: the door must fence it all the same
        ups = upstreams(app)
        with anyio.fail_after(30):
            while ups.view().reasons["http://g1"] is None:
                await anyio.sleep(0.01)
        a.generated.clear()
        assert set(await generate_many(c)) == {200}
        assert a.generated == [] and b.computed_with() == {"v1"}


async def test_a_node_that_missed_the_resume_gets_nothing_while_another_may_serve():
    a, b = GenNode("g1"), GenNode("g2")
    async with app_client(door(GenFleet(a, b))) as c:
        assert (await c.post("/pause?mode=keep")).status_code == 200
        # Every node paused: requests still go to them (they wait there for the resume).
        await c.get("/weight_info")
        assert set(await generate_many(c)) == {200} and a.generated and b.generated
        b.down = True
        assert (await c.post("/resume")).status_code == 502  # B was away
        b.down = False  # back, and still paused
        info = (await c.get("/weight_info")).json()
        b.generated.clear()
        assert set(await generate_many(c)) == {200}
        assert b.generated == [] and a.generated
        assert [n["paused"] for n in info["nodes"]] == [False, True]


async def test_a_resume_wakes_its_nodes_at_once_not_at_the_next_poll():
    # Seed 76 of the nemesis: C died; the pause and the resume reached A and B only. The door
    # still judged A and B paused (its last poll said so) and C awake, so until its next
    # poll every request went to C, and was answered 503 as C refused it.
    a, b, c = GenNode("g1"), GenNode("g2"), GenNode("g3")
    urls = ("http://g1", "http://g2", "http://g3")
    async with app_client(door(GenFleet(a, b, c), urls=urls)) as client:
        await client.get("/weight_info")
        c.down = True
        assert (await client.post("/pause?mode=keep")).status_code == 502  # C was away
        await client.get("/weight_info")  # a poll between: A and B told they are paused
        assert (await client.post("/resume")).status_code == 502
        assert set(await generate_many(client)) == {200}
        assert a.generated and b.generated


async def test_while_paused_a_request_waits_on_a_paused_node_not_on_one_that_refuses():
    # TRL's pause (keep) reached A and B; C died before it, awake when it last told. Its
    # refusals cool it down: requests then wait on A or B for the resume, as on one vLLM.
    a, b, c = GenNode("g1"), GenNode("g2"), GenNode("g3")
    urls = ("http://g1", "http://g2", "http://g3")
    async with app_client(door(GenFleet(a, b, c), urls=urls, node_cooldown_s=3600.0)) as client:
        await client.get("/weight_info")
        c.down = True
        assert (await client.post("/pause?mode=keep")).status_code == 502
        assert set(await generate_many(client)) == {200}
        assert a.generated and b.generated and c.generated == []


async def test_a_read_timeout_cools_the_node_down_as_a_refused_connection_does():
    a, b = GenNode("g1"), GenNode("g2")
    urls = ["http://g1", "http://g2"]
    b_first = [k for k in KEYS if rendezvous_order(k, urls)[0] == "http://g2"]
    async with app_client(door(GenFleet(a, b), node_cooldown_s=3600.0)) as c:
        b.fail["inference/v1/generate"] = "timeout"
        assert await generate_many(c, b_first[:1]) == [504]
        b.fail.clear()
        assert set(await generate_many(c, b_first)) == {200}
    assert b.generated == [] and len(a.generated) == len(b_first)


class SlowToTell(httpx.AsyncBaseTransport):
    """The nodes answer ``/weight_info`` a second late (within the control timeout)."""

    def __init__(self, fleet: GenFleet) -> None:
        self.fleet = fleet

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            await anyio.sleep(1.0)
        return await self.fleet.handle_async_request(request)


async def test_nothing_is_served_before_every_node_answered_once():
    # B's caches are not whole; until the door has heard it, it cannot know.
    a, b = GenNode("g1"), GenNode("g2")
    b.ledger.cache_not_reset()
    async with app_client(door(SlowToTell(GenFleet(a, b)))) as c:
        assert set(await generate_many(c)) == {200}
    assert b.generated == [] and a.generated

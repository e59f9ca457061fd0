"""tandem_client's weight update over two generate nodes, with a fault at each step: it starts
on every node or on none, a node that fails while the other loads is fenced (the client sends
it no request until it holds the fleet's version), and FleetPartialFailure names that node's
own failure. The nodes are stand-ins with generate's update state machine (tests/support)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tandem_client import AsyncTandemClient, FleetPartialFailure, TransportError
from tandem_wire import GenerateRequest
from tests.support.fleet_nodes import GenFleet, GenNode

pytestmark = pytest.mark.anyio

WEIGHTS = {"lm_head.weight": np.zeros((2, 2), dtype=np.float32)}


def client(f: GenFleet, weight_dir) -> AsyncTandemClient:
    return AsyncTandemClient(
        "http://r",
        ["http://g1", "http://g2"],
        binary=False,
        weight_dir=weight_dir,
        node_cooldown_s=0.0,  # what keeps requests off a node here is fencing alone
        max_retries=0,
        transport=f,
    )


async def generate_many(c: AsyncTandemClient) -> None:
    for i in range(24):
        await c.generate(GenerateRequest(token_ids=[1], request_id=f"req-{i}"))


@pytest.mark.parametrize("fault", ["refuse", "timeout", "late", "down"])
async def test_a_start_that_fails_on_one_node_is_undone_on_the_others(fault, tmp_path):
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["start_weight_update"] = fault
    async with client(GenFleet(a, b), tmp_path) as c:
        with pytest.raises(FleetPartialFailure) as err:
            await c.update_weights(WEIGHTS, version="v1")
    assert [(f["url"], f["step"]) for f in err.value.failed] == [("http://g2", "start")]
    assert err.value.failed[0]["type"] == ("internal_error" if fault == "refuse" else "unreachable")
    assert "/abort_weight_update" in a.paths and not a.updating and not b.updating
    assert "/update_weights" not in a.paths + b.paths
    assert (a.version, a.weights, b.version, b.weights) == ("v0", "v0", "v0", "v0")


@pytest.mark.parametrize("step", ["update_weights", "finish_weight_update"])
@pytest.mark.parametrize("fault", ["refuse", "timeout", "down"])
async def test_a_node_that_fails_after_the_other_loaded_is_fenced_until_it_holds_the_version(
    step, fault, tmp_path
):
    a, b = GenNode("g1"), GenNode("g2")
    async with client(GenFleet(a, b), tmp_path) as c:
        await generate_many(c)
        assert a.generated and b.generated
        b.fail[step] = fault
        with pytest.raises(FleetPartialFailure) as err:
            await c.update_weights(WEIGHTS, version="v1")
        [failed] = err.value.failed
        assert (failed["url"], failed["step"]) == ("http://g2", step.split("_")[0])
        status = 500 if fault == "refuse" else 0
        kind = "internal_error" if fault == "refuse" else "unreachable"
        assert (failed["status"], failed["type"]) == (status, kind)
        assert err.value.details["weight_version"] == "v1"
        assert err.value.details["fenced"] == ["http://g2"]
        assert a.version == "v1" and a.weights != "v0"  # A loaded the new weights
        assert b.weights == "v0" and b.version == "v0"  # B's label never names them
        assert c.fenced() == ["http://g2"]
        served_by_b = len(b.generated)
        await generate_many(c)
        assert len(b.generated) == served_by_b
        # B back (restarted with its checkpoint, or as it was): still fenced.
        b.restart() if fault == "down" else b.fail.clear()
        await generate_many(c)
        assert len(b.generated) == served_by_b
        # The next update reaches B: it holds the fleet's version and gets requests again.
        await c.update_weights(WEIGHTS, version="v2")
        assert c.fenced() == [] and b.version == "v2"
        await generate_many(c)
        assert len(b.generated) > served_by_b


async def test_a_file_every_node_refuses_loads_nothing_and_raises_the_refusal(tmp_path):
    a, b = GenNode("g1"), GenNode("g2")
    for n in (a, b):
        n.fail["update_weights"] = "refuse"
    async with client(GenFleet(a, b), tmp_path) as c:
        with pytest.raises(Exception) as err:
            await c.update_weights(WEIGHTS, version="v1")
        assert not isinstance(err.value, FleetPartialFailure)
        assert getattr(err.value, "type", None) == "internal_error"
        assert c.fenced() == []
    assert (a.version, a.weights, b.version, b.weights) == ("v0", "v0", "v0", "v0")
    assert not a.updating and not b.updating


async def test_a_node_back_after_the_node_timeout_gets_work_again(tmp_path):
    # The client has no poll of its own: a node that left the fleet must be asked again once
    # its cool-down is over, or it never comes back (and a one-node client never serves).
    a = GenNode("g1")
    f = GenFleet(a)
    c = AsyncTandemClient(
        "http://r",
        ["http://g1"],
        binary=False,
        node_cooldown_s=0.0,
        node_timeout_s=0.05,
        max_retries=0,
        transport=f,
    )
    await c.generate(GenerateRequest(token_ids=[1], request_id="before"))
    a.down = True
    with pytest.raises(TransportError):
        await c.generate(GenerateRequest(token_ids=[1], request_id="down"))
    await asyncio.sleep(0.1)  # unreachable past the node timeout: it has left the fleet
    a.down = False
    await c.generate(GenerateRequest(token_ids=[1], request_id="back"))
    assert a.generated[-1] == "v0:v0"
    await c.aclose()


async def test_an_update_a_crashed_trainer_left_on_the_nodes_does_not_block_the_next(tmp_path):
    # Another trainer started an update and died: every node is mid-update.
    from tandem_wire.control import UpdateId

    a, b = GenNode("g1"), GenNode("g2")
    for n in (a, b):
        n.ledger.start(UpdateId(1, "0a0b0c0d"))
    async with client(GenFleet(a, b), tmp_path) as c:
        await c.update_weights(WEIGHTS, version="v1")
        assert c.fenced() == []
    assert (a.version, b.version) == ("v1", "v1") and not a.updating and not b.updating


async def test_a_node_that_took_other_chunks_than_the_client_sent_is_refused_the_finish(
    tmp_path,
):
    # B's receipt is not the client's (what B took is not what the client sent): it must not
    # load, whatever the chunk's answer said.
    import httpx

    a, b = GenNode("g1"), GenNode("g2")
    real = b.handle

    def with_a_stray_chunk(request: httpx.Request) -> httpx.Response:
        answer = real(request)
        if request.url.path == "/update_weights":  # another caller's chunk lands after it
            stray = {"update_info": {"path": "another", "names": ["lm_head.weight"]}}
            real(httpx.Request("POST", "http://g2/update_weights", json=stray))
        return answer

    b.handle = with_a_stray_chunk
    async with client(GenFleet(a, b), tmp_path) as c:
        with pytest.raises(FleetPartialFailure) as err:
            await c.update_weights(WEIGHTS, version="v1")
        [failed] = err.value.failed
        assert (failed["url"], failed["step"], failed["type"]) == (
            "http://g2",
            "finish",
            "weight_update_incomplete",
        )
        assert c.fenced() == ["http://g2"]
    assert (a.version, b.version, b.weights) == ("v1", "v0", "v0") and not b.updating

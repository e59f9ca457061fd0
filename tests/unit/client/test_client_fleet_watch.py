"""tandem_client judges the fleet as the front door does (issue 41): it asks every node what it
holds before its first request and again every ``fence_poll_s``, so a node it did not see fail
(unclean from the start, restarted while the client idled) gets nothing; and the SEQ order of
its updates outlives nodes that leave and restart. The nodes are the stand-ins of
``tests/support/fleet_nodes`` (the real node record)."""

from __future__ import annotations

import asyncio

import anyio
import numpy as np
import pytest

from tandem_client import AsyncTandemClient, TransportError
from tandem_wire import GenerateRequest
from tandem_wire.control import WeightTransferState
from tests.support.fleet_nodes import GenFleet, GenNode

pytestmark = pytest.mark.anyio

WEIGHTS = {"lm_head.weight": np.zeros((2, 2), dtype=np.float32)}
FILE = WeightTransferState("tandem_file", True)


def client(f: GenFleet, weight_dir=None, **kw) -> AsyncTandemClient:
    base = dict(binary=False, node_cooldown_s=0.0, max_retries=0, fence_poll_s=3600.0)
    return AsyncTandemClient(
        "http://r",
        ["http://g1", "http://g2"],
        weight_dir=weight_dir,
        transport=f,
        **{**base, **kw},
    )


async def generate_many(c: AsyncTandemClient) -> None:
    for i in range(24):
        await c.generate(GenerateRequest(token_ids=[1], request_id=f"req-{i}"))


async def test_a_fresh_client_sends_nothing_to_a_node_that_is_not_whole():
    a, b = GenNode("g1"), GenNode("g2")
    b.ledger.cache_not_reset()
    async with client(GenFleet(a, b)) as c:
        await generate_many(c)
    assert b.generated == [] and len(a.generated) == 24


async def test_a_node_restarted_while_the_client_idled_is_fenced_by_the_client_s_own_poll(
    tmp_path,
):
    a, b = GenNode("g1"), GenNode("g2")
    async with client(GenFleet(a, b), tmp_path, fence_poll_s=0.05) as c:
        await c.update_weights(WEIGHTS, version="v1")
        assert c.fenced() == []
        b.restart()  # never seen failing: nothing the client sent went wrong
        with anyio.fail_after(30):
            while c.fenced() != ["http://g2"]:
                await anyio.sleep(0.01)
        b.generated.clear()
        await generate_many(c)
    assert b.generated == [] and a.computed_with() != {"v0"}


async def test_an_update_after_a_restart_outranks_a_node_that_was_away(tmp_path):
    a, b = GenNode("g1"), GenNode("g2")
    async with client(GenFleet(a, b), tmp_path, node_timeout_s=0.05) as c:
        for version in ("u1", "u2", "u3"):
            await c.update_weights(WEIGHTS, version=version)
        b.down = True
        with pytest.raises(TransportError):
            await c.weight_versions()  # B does not answer
        await asyncio.sleep(0.1)  # past the node timeout: B has left the fleet
        a.restart()  # A restarts on its checkpoint: its record is empty
        await c.update_weights(WEIGHTS, version="u4")
        assert a.ledger.info("u4", FILE).applied_seqs == [4]  # above every SEQ seen
        b.down = False  # B comes back with u3
        with anyio.fail_after(30):
            await c.weight_versions()
        assert c.fenced() == ["http://g2"]
        b.generated.clear()
        await generate_many(c)
    assert b.generated == [] and {g.split(":")[0] for g in a.generated} == {"u4"}


async def test_a_resume_wakes_its_nodes_at_once_not_at_the_next_poll():
    # As at the door: C died, the pause and the resume reached A and B only, and a poll
    # between told A and B paused. Until the next poll, C (awake when it last told) got
    # every request, and refused it.
    a, b, gone = GenNode("g1"), GenNode("g2"), GenNode("g3")
    urls = ["http://g1", "http://g2", "http://g3"]
    async with AsyncTandemClient(
        "http://r",
        urls,
        transport=GenFleet(a, b, gone),
        binary=False,
        node_cooldown_s=0.0,
        max_retries=0,
        fence_poll_s=3600.0,
    ) as c:
        await c.weight_versions()
        gone.down = True
        with pytest.raises(TransportError):
            await c.pause()
        with pytest.raises(TransportError):
            await c.weight_versions()  # A and B tell they are paused
        with pytest.raises(TransportError):
            await c.resume()
        await generate_many(c)
    assert a.generated and b.generated and gone.generated == []

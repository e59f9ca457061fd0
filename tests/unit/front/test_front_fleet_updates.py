"""A weight update through the door over two generate nodes, with a fault at each step: it
starts on every node or on none, a node that fails while the other loads is fenced (no
request reaches it until it holds the fleet's version), and the caller gets that node's own
failure. The nodes are stand-ins with generate's update state machine (tests/support)."""

from __future__ import annotations

import time

import anyio
import pytest

from tandem_client.routing import ROUTE_KEY_HEADER
from tandem_front.app import create_app
from tests.support.asgi import app_client
from tests.support.fleet_nodes import GenFleet, GenNode

from .test_front_routing import Texts, settings

pytestmark = pytest.mark.anyio

KEYS = [f"key-{i}" for i in range(24)]


def door(f: GenFleet, **kw):
    # No cool-down: what keeps requests off a node here is fencing alone.
    base = dict(generate_urls=("http://g1", "http://g2"), fence_poll_s=3600.0, node_cooldown_s=0.0)
    return create_app(settings(**{**base, **kw}), Texts(), f)


async def generate_many(c) -> list[int]:
    statuses = []
    for key in KEYS:
        r = await c.post(
            "/inference/v1/generate",
            json={"token_ids": [1], "sampling_params": {}},
            headers={ROUTE_KEY_HEADER: key},
        )
        statuses.append(r.status_code)
    return statuses


async def push(c, version: str) -> list:
    """start -> update -> finish as a trainer sends them; each step's (status, body)."""
    steps = []
    for path, body in (
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": {"path": version}}),
        ("/finish_weight_update", {"weight_version": version}),
    ):
        r = await c.post(path, json=body)
        steps.append((r.status_code, r.json()))
        if path == "/start_weight_update" and r.status_code != 200:
            break
    return steps


def failed_nodes(answer: dict) -> list[tuple[str, int, str]]:
    return [(f["url"], f["status"], f["type"]) for f in answer["error"]["details"]["failed"]]


@pytest.mark.parametrize(
    ("fault", "status", "type_"),
    [
        ("refuse", 500, "internal_error"),
        ("timeout", 0, "unreachable"),
        ("late", 0, "unreachable"),  # B started, but its answer was lost: undone too
        ("down", 0, "unreachable"),
    ],
)
async def test_a_start_that_fails_on_one_node_is_undone_on_the_others(fault, status, type_):
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["start_weight_update"] = fault
    f = GenFleet(a, b)
    async with app_client(door(f)) as c:
        [(code, answer)] = await push(c, "v1")
        assert code == 502
        assert failed_nodes(answer) == [("http://g2", status, type_)]
        assert "undone" in answer["error"]["message"]
        # Nothing started anywhere: a new update starts on A at once, and nothing was loaded.
        assert "/abort_weight_update" in a.paths and not a.updating and not b.updating
        assert (a.version, a.weights, b.version, b.weights) == ("v0", "v0", "v0", "v0")
        b.fail.clear()
        b.down = False
        steps = await push(c, "v1")
        assert [s for s, _ in steps] == [200, 200, 200]
    assert (a.version, a.weights, b.version, b.weights) == ("v1", "v1", "v1", "v1")


@pytest.mark.parametrize("step", ["update_weights", "finish_weight_update"])
@pytest.mark.parametrize("fault", ["refuse", "timeout", "down"])
async def test_a_node_that_fails_after_the_other_loaded_is_fenced_until_it_holds_the_version(
    step, fault
):
    a, b = GenNode("g1"), GenNode("g2")
    f = GenFleet(a, b)
    async with app_client(door(f)) as c:
        assert set(await generate_many(c)) == {200}
        assert a.generated and b.generated  # both nodes serve before the update
        b.fail[step] = fault
        steps = await push(c, "v1")
        failed_at = ["/start_weight_update", "/update_weights", "/finish_weight_update"].index(
            f"/{step}"
        )
        code, answer = steps[failed_at]
        # The caller sees B's own failure at the step it happened, not a later 409.
        assert code == 502
        status = 500 if fault == "refuse" else 0
        kind = "internal_error" if fault == "refuse" else "unreachable"
        assert failed_nodes(answer) == [("http://g2", status, kind)]
        assert a.version == a.weights == "v1"  # A finished: it holds the new weights
        assert b.weights == "v0"
        info = (await c.get("/weight_info")).json()
        assert info["weight_version"] == "v1" and info["fenced"] == ["http://g2"]
        served_by_b = len(b.generated)
        assert set(await generate_many(c)) == {200}
        assert len(b.generated) == served_by_b  # fenced: no request reached B
        # B comes back (restarted with its checkpoint, or as it was): still fenced.
        b.restart() if fault == "down" else b.fail.clear()
        await c.get("/weight_info")
        await generate_many(c)
        assert len(b.generated) == served_by_b
        # The next fleet update reaches B too: it holds the fleet's version and gets work.
        assert [s for s, _ in await push(c, "v2")] == [200, 200, 200]
        assert (await c.get("/weight_info")).json()["fenced"] == []
        await generate_many(c)
        assert len(b.generated) > served_by_b
    assert a.lying() == [] and b.lying() == []


async def push_unlabelled(c, version: str, names: list[str] | None = None) -> list:
    """TRL's sequence: start, one chunk, finish with an empty body (the label stays)."""
    info = {"path": version, **({"names": names} if names else {})}
    steps = []
    for path, body in (
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": info}),
        ("/finish_weight_update", {}),
    ):
        r = await c.post(path, json=body)
        steps.append((r.status_code, r.json()))
    return steps


async def test_unlabelled_updates_fence_by_what_each_node_loaded():
    # TRL finishes with {}: every label stays "v0", so labels cannot tell A from B.
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["update_weights"] = "refuse"
    f = GenFleet(a, b)
    async with app_client(door(f)) as c:
        steps = await push_unlabelled(c, "u1")
        # B's failed chunk ended its update (the 502 names it); the finish goes to the nodes
        # still in the update, and all of them finish.
        assert [s for s, _ in steps] == [200, 502, 200]
        assert (a.version, a.weights, b.version, b.weights) == ("v0", "u1", "v0", "v0")
        info = (await c.get("/weight_info")).json()
        assert info["fenced"] == ["http://g2"]
        [node_b] = [n for n in info["nodes"] if n["url"] == "http://g2"]
        assert (node_b["reason"], node_b["weight_version"]) == ("other_weights", "v0")
        assert node_b["missed_seqs"] == [1] and info["applied_seqs"] == [1]
        b.generated.clear()
        assert set(await generate_many(c)) == {200}
        assert b.generated == [] and a.computed_with() == {"u1"}


async def test_a_fenced_node_rejoins_only_once_every_tensor_it_missed_is_written_again():
    a, b = GenNode("g1"), GenNode("g2")
    f = GenFleet(a, b)
    head, layer = ["lm_head.weight"], ["model.layers.0.mlp.weight", "lm_head.weight"]
    async with app_client(door(f)) as c:
        b.fail["update_weights"] = "refuse"
        await push_unlabelled(c, "u1", layer)  # B misses a layer and the head
        b.fail.clear()
        # The head alone reaches both: B still holds the old layer, and stays fenced.
        assert [s for s, _ in await push_unlabelled(c, "u2", head)] == [200, 200, 200]
        assert b.tensors != a.tensors
        assert (await c.get("/weight_info")).json()["fenced"] == ["http://g2"]
        b.generated.clear()
        await generate_many(c)
        assert b.generated == []
        # Now the layer too: every tensor B missed has been written since; it serves again.
        assert [s for s, _ in await push_unlabelled(c, "u3", layer[:1])] == [200, 200, 200]
        assert b.tensors == a.tensors
        assert (await c.get("/weight_info")).json()["fenced"] == []
        await generate_many(c)
        assert b.generated


async def test_a_node_fenced_by_a_read_during_an_update_is_let_back_in_soon():
    # The door's own period is an hour here: only the early re-check can unfence B in time.
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["finish_weight_update"] = "defer"  # B is slow: it finishes after the door's read
    f = GenFleet(a, b)
    async with app_client(door(f)) as c:
        await push(c, "v1")  # the finish's read: A on v1, B behind, fenced
        assert (await c.get("/weight_info")).json()["fenced"] == ["http://g2"]
        b.catch_up()  # the update reaches B after all
        before = len(b.generated)
        deadline = time.monotonic() + 30
        while len(b.generated) == before and time.monotonic() < deadline:
            await generate_many(c)
            await anyio.sleep(0.05)
    assert len(b.generated) > before, "B stayed fenced until the door's next period"
    assert a.lying() == [] and b.lying() == []


async def test_with_the_fleet_s_node_unreachable_a_fenced_node_gets_nothing_until_it_is_gone():
    a, b = GenNode("g1"), GenNode("g2")
    a.fail["update_weights"] = "refuse"
    f = GenFleet(a, b)
    async with app_client(door(f, node_timeout_s=0.3)) as c:
        await push(c, "v1")  # B holds v1, A failed its chunk: A fenced
        a.fail.clear()
        b.down = True
        r = await c.post("/inference/v1/generate", json={"token_ids": [1], "sampling_params": {}})
        assert r.status_code == 503  # rather than A's old weights, while B may come back
        assert a.generated == []
        await anyio.sleep(0.4)  # B unreachable past the node timeout: it has left the fleet
        await c.get("/weight_info")
        assert set(await generate_many(c)) == {200}
        assert a.computed_with() == {"v0"}
        # The next update goes on without B, and A serves it.
        assert [s for s, _ in await push(c, "v2")] == [200, 200, 200]
        a.generated.clear()
        await generate_many(c)
        assert a.computed_with() == {"v2"}
        # B comes back restarted on its checkpoint: fenced (it holds neither v1 nor v2).
        b.restart()
        info = (await c.get("/weight_info")).json()
        assert info["fenced"] == ["http://g2"] and info["weight_version"] == "v2"
    assert a.lying() == [] and b.lying() == []


async def test_a_finish_whose_answer_is_lost_names_the_node_but_fences_it_only_if_behind():
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["finish_weight_update"] = "late"  # B loaded v1; the door never heard
    f = GenFleet(a, b)
    async with app_client(door(f)) as c:
        steps = await push(c, "v1")
        assert steps[2][0] == 502 and failed_nodes(steps[2][1]) == [("http://g2", 0, "unreachable")]
        assert (await c.get("/weight_info")).json()["fenced"] == []  # B reports v1: it holds it
        await generate_many(c)
    assert b.generated and a.lying() == [] and b.lying() == []


async def test_a_hung_node_holds_no_update_step_past_the_control_timeout():
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["weight_info"] = "hang"  # every version poll and each step's own read hang on B
    f = GenFleet(a, b)
    async with app_client(door(f, control_timeout_s=0.2)) as c:
        with anyio.fail_after(30):  # 600 s each with the read timeout
            steps = await push(c, "v1")
    assert [code for code, _ in steps] == [200, 200, 200]
    assert (a.weights, b.weights) == ("v1", "v1")


async def test_the_version_watch_outlives_a_round_that_fails(monkeypatch):
    a, b = GenNode("g1"), GenNode("g2")
    calls = []
    app = door(GenFleet(a, b), fence_poll_s=0.05)
    async with app_client(app):
        ups = app.state.forwarder.upstreams  # the door's own node state
        real = ups.poller.refresh

        async def flaky():
            calls.append(None)
            if len(calls) == 1:
                raise RuntimeError("one bad round")
            return await real()

        monkeypatch.setattr(ups.poller, "refresh", flaky)
        with anyio.fail_after(30):
            while len(calls) < 3:
                await anyio.sleep(0.05)


async def test_a_node_that_lost_a_chunk_and_its_abort_loads_nothing_of_the_update():
    # Chunk 2 of 3 and the door's abort of it never reach B; chunk 3 and the finish do. The
    # door keeps nothing between steps, so the finish itself must tell B what it lacks.
    a, b = GenNode("g1"), GenNode("g2")
    chunks = [["model.embed_tokens.weight"], ["model.layers.0.mlp.weight"], ["lm_head.weight"]]
    async with app_client(door(GenFleet(a, b))) as c:
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        statuses = []
        for i, names in enumerate(chunks):
            if i == 1:
                b.fail.update(update_weights="timeout", abort_weight_update="timeout")
            info = {"update_info": {"path": "u1", "names": names}}
            statuses.append((await c.post("/update_weights", json=info)).status_code)
            b.fail.clear()
        r = await c.post("/finish_weight_update", json={})  # TRL's finish: no count of its own
        assert statuses == [200, 502, 200]
        assert r.status_code == 502
        assert failed_nodes(r.json()) == [("http://g2", 409, "weight_update_incomplete")]
        assert a.weights == "u1" and b.weights == "v0"  # B loaded nothing of it
        assert not b.updating and b.ledger.info("v0", None).applied_seqs == []
        assert (await c.get("/weight_info")).json()["fenced"] == ["http://g2"]
        b.generated.clear()
        assert set(await generate_many(c)) == {200}
        assert b.generated == [] and a.computed_with() == {"u1"}


async def test_an_update_its_trainer_left_mid_way_is_ended_by_the_next_one():
    # The trainer crashes after its chunk: every node is left mid-update. A new trainer's
    # update goes through at once, with no operator.
    a, b = GenNode("g1"), GenNode("g2")
    async with app_client(door(GenFleet(a, b))) as c:
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        r = await c.post("/update_weights", json={"update_info": {"path": "u1"}})
        assert r.status_code == 200 and a.updating and b.updating
        assert [s for s, _ in await push_unlabelled(c, "u2")] == [200, 200, 200]
        assert (a.weights, b.weights) == ("u2", "u2")
        assert (await c.get("/weight_info")).json()["fenced"] == []
        await generate_many(c)
    assert a.computed_with() == b.computed_with() == {"u2"}


async def test_a_node_that_missed_the_start_fails_none_of_the_trainer_s_later_steps():
    # B is past the node timeout at the start and back before the chunk: the chunk and the
    # finish go to the nodes that started, and succeed; B stays fenced until a later update.
    a, b = GenNode("g1"), GenNode("g2")
    async with app_client(door(GenFleet(a, b), node_timeout_s=0.05)) as c:
        b.down = True
        await c.get("/weight_info")  # B stops answering now
        await anyio.sleep(0.1)  # past the node timeout: it has left the fleet
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        assert a.updating and not b.updating
        b.down = False
        r = await c.post("/update_weights", json={"update_info": {"path": "v1"}})
        assert r.status_code == 200, r.json()
        r = await c.post("/finish_weight_update", json={"weight_version": "v1"})
        assert r.status_code == 200, r.json()
        assert (a.weights, b.weights) == ("v1", "v0")
        assert "/update_weights" not in b.paths and "/finish_weight_update" not in b.paths
        info = (await c.get("/weight_info")).json()
        assert info["fenced"] == ["http://g2"] and info["weight_version"] == "v1"
        b.generated.clear()
        assert set(await generate_many(c)) == {200}
        assert b.generated == []
        assert [s for s, _ in await push(c, "v2")] == [200, 200, 200]
        assert (await c.get("/weight_info")).json()["fenced"] == []
    assert a.lying() == [] and b.lying() == []


async def test_a_start_whose_seq_a_node_has_seen_is_minted_again_above_it():
    # Another router's start reaches B between this door's look at the nodes and its own
    # start, with the same SEQ: B refuses it (409 weight_update_seq_seen), and the door starts
    # again above, on both nodes, with one id.
    a, b = GenNode("g1"), GenNode("g2")
    b.fail["start_weight_update"] = "raced"
    async with app_client(door(GenFleet(a, b))) as c:
        r = await c.post("/start_weight_update", json={})
        assert r.status_code == 200, r.json()
        assert r.json()["update_id"].startswith("2-")
        assert a.ledger.current == b.ledger.current and a.ledger.current.seq == 2
        r = await c.post("/update_weights", json={"update_info": {"path": "u1"}})
        assert r.status_code == 200
        assert (await c.post("/finish_weight_update", json={})).status_code == 200
    assert a.weights == b.weights == "u1"
    assert a.ledger.info("v0", None).applied_seqs == b.ledger.info("v0", None).applied_seqs == [2]


async def test_a_node_discovery_finds_mid_update_takes_no_part_in_it():
    # The name resolves to A and B at the start, and to C too before the chunk: the chunk and
    # the finish reach A and B only, and succeed; C serves once it holds the fleet's weights.
    a, b, new = GenNode("10.0.0.1"), GenNode("10.0.0.2"), GenNode("10.0.0.3")
    names = ["10.0.0.1", "10.0.0.2"]

    async def resolve(name: str, port: int) -> list[str]:
        return list(names)

    kw = dict(generate_urls=("dns+http://gen.test:8200",), discovery_interval_s=3600.0)
    app = create_app(settings(**kw), Texts(), GenFleet(a, b, new), resolve=resolve)
    async with app_client(app) as c:
        assert (await c.post("/start_weight_update", json={})).status_code == 200
        names.append("10.0.0.3")
        await app.state.node_watch.refresh()
        steps = [
            await c.post("/update_weights", json={"update_info": {"path": "v1"}}),
            await c.post("/finish_weight_update", json={"weight_version": "v1"}),
        ]
        assert [r.status_code for r in steps] == [200, 200], steps[-1].json()
        assert "/update_weights" not in new.paths and (a.weights, new.weights) == ("v1", "v0")
        info = (await c.get("/weight_info")).json()
        assert info["fenced"] == ["http://10.0.0.3:8200"]
        assert [s for s, _ in await push(c, "v2")] == [200, 200, 200]
        assert (await c.get("/weight_info")).json()["fenced"] == []

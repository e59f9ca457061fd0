"""The fault table of docs/rl.md, made by running each fault:
``python -m tests.support.fault_table`` prints it, ``--write`` puts it into the page (between
its ``fault-table`` markers).

A weight update through the front door over two generate nodes, A and B, with one fault on B
at one step: B refuses the step, times out on it, is killed at it, is killed and comes back
(restarted on its checkpoint) once the update is over, hangs from that step on (SIGSTOP: it
takes connections and answers nothing, polls and requests included), or restarts at it (the
call is lost, and B is back on its checkpoint for the next one), or the door's connections
are all in use for the call (it never leaves the door); the trainer sends every step
(start, one chunk, finish) unless the start fails, with a label (``{"weight_version": "new"}``) or
without (``{}``, as TRL does). Two more: one of three chunks and the door's abort of it are
both lost on the way to B (the trainer sends the rest), and a trainer that crashes after its
chunk, leaving both nodes mid-update, followed by a new trainer's update. Three more: B is
unreachable past the node timeout at the start and back before the chunk; another router's
start with the same SEQ reaches B first; an answer B gave before the update arrives after
it. The nodes are the
stand-ins of ``tests/support/fleet_nodes``, which keep the real node record
(``tandem_generate.weight_ledger``); the door is the real one, in-process.
``tests/unit/front/test_fleet_fault_table.py`` checks the page against a new run.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

from tandem_client.routing import ROUTE_KEY_HEADER
from tandem_front.app import create_app
from tandem_front.settings import FrontSettings
from tests.support.asgi import app_client
from tests.support.fleet_nodes import HOLD_HEADER, TENSORS, GenFleet, GenNode

PAGE = Path(__file__).resolve().parents[2] / "docs" / "rl.md"
BEGIN, END = "<!-- fault-table -->", "<!-- /fault-table -->"

STEPS = ("start_weight_update", "update_weights", "finish_weight_update")
FAULTS = {
    "refuses": "refuse",
    "times out": "timeout",
    "is killed": "down",
    "comes back": "down",
    "hangs": "hang",
    "restarts": "down",
    "finds the door's pool full": "pool",
}
HUNG = ("weight_info", "inference/v1/generate", *STEPS)
"""What a hung node does not answer: anything (each wait ends at the door's timeouts)."""


class _NoRender:
    """The door's tokenizer stand-in: the table uses its generate side only."""


def _door(fleet: GenFleet, node_timeout_s: float = 10.0) -> object:
    settings = FrontSettings(
        node_timeout_s=node_timeout_s,
        render_urls=("http://r",),
        generate_urls=("http://g1", "http://g2"),
        model="m",
        enable_control_routes=True,
        fence_poll_s=3600.0,
        node_cooldown_s=0.0,
        # A hung node's calls end here (the door's defaults are 10 s and 600 s).
        control_timeout_s=0.2,
        read_timeout_s=0.2,
    )
    return create_app(settings, _NoRender(), fleet)


async def _scenario(step: str, fault: str, labelled: bool) -> dict[str, str]:
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    if fault != "hangs":  # a hang begins at its step (the door has heard B by then)
        b.fail[step] = FAULTS[fault]
    async with app_client(_door(GenFleet(a, b))) as c:
        seen = []
        finish = {"weight_version": "new"} if labelled else {}
        for path, body in (
            ("/start_weight_update", {}),
            ("/update_weights", {"update_info": {"path": "new"}}),
            ("/finish_weight_update", finish),
        ):
            if fault == "hangs" and path.strip("/") == step:
                b.fail.update(dict.fromkeys(HUNG, "hang"))
            r = await c.post(path, json=body)
            seen.append(_seen(r.status_code, r.json()))
            if fault == "restarts" and b.down:
                b.restart("old")  # a new process on its checkpoint, at once
            if path == "/start_weight_update" and r.status_code != 200:
                break
        if fault == "comes back":
            b.restart("old")  # a new process on its checkpoint
        if fault != "hangs":
            b.fail.clear()
        return await _outcome(c, a, b, " · ".join(seen), _how(fault))


async def _lost_abort(labelled: bool) -> dict[str, str]:
    """Chunk 2 of 3 and the door's abort of it never reach B; the rest does."""
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    async with app_client(_door(GenFleet(a, b))) as c:
        r = await c.post("/start_weight_update", json={})
        seen, chunks = [_seen(r.status_code, r.json())], []
        for i, names in enumerate(([TENSORS[0]], [TENSORS[1]], [TENSORS[2]])):
            if i == 1:
                b.fail.update(update_weights="timeout", abort_weight_update="timeout")
            body = {"update_info": {"path": "new", "names": names}}
            r = await c.post("/update_weights", json=body)
            chunks.append(_seen(r.status_code, r.json()))
            b.fail.clear()
        r = await c.post("/finish_weight_update", json=_finish(labelled))
        seen += [", ".join(chunks), _seen(r.status_code, r.json())]
        return await _outcome(c, a, b, " · ".join(seen))


async def _crashed_trainer(labelled: bool) -> dict[str, str]:
    """A trainer starts an update on both nodes, sends its chunk and dies; a new trainer
    runs a whole update."""
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    async with app_client(_door(GenFleet(a, b))) as c:
        seen = []
        for path, body in (
            ("/start_weight_update", {}),
            ("/update_weights", {"update_info": {"path": "lost"}}),
            ("/start_weight_update", {}),
            ("/update_weights", {"update_info": {"path": "new"}}),
            ("/finish_weight_update", _finish(labelled)),
        ):
            r = await c.post(path, json=body)
            seen.append(_seen(r.status_code, r.json()))
        caller = f"{' · '.join(seen[:2])} · (none); then {' · '.join(seen[2:])}"
        return await _outcome(c, a, b, caller)


async def _missed_start(labelled: bool) -> dict[str, str]:
    """B is unreachable past the node timeout at the start and back, as it was, before the
    chunk."""
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    async with app_client(_door(GenFleet(a, b), node_timeout_s=0.05)) as c:
        b.down = True
        await c.get("/weight_info")
        await asyncio.sleep(0.1)
        return await _outcome(c, a, b, await _update(c, labelled, lambda: _back(b)))


def _back(b: GenNode) -> None:
    b.down = False


async def _late_answer(labelled: bool) -> dict[str, str]:
    """A ``/weight_info`` answer of B from before the update arrives after the update's own."""
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    async with app_client(_door(GenFleet(a, b))) as c:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(c.get("/weight_info", headers={HOLD_HEADER: "g2"}))
            while not b.holding:  # until B's answer is made, as it is now, and held back
                await asyncio.sleep(0.001)
            caller = await _update(c, labelled)
            b.release.set()
        return await _outcome(c, a, b, caller)


async def _raced_seq(labelled: bool) -> dict[str, str]:
    """Another router's start, with the SEQ the door mints, reaches B first (and its abort)."""
    a, b = GenNode("g1", "old"), GenNode("g2", "old")
    b.fail["start_weight_update"] = "raced"
    async with app_client(_door(GenFleet(a, b))) as c:
        return await _outcome(c, a, b, await _update(c, labelled))


async def _update(c, labelled: bool, after_start=lambda: None) -> str:
    """start, one chunk, finish; what the caller saw of each."""
    seen = []
    for path, body in (
        ("/start_weight_update", {}),
        ("/update_weights", {"update_info": {"path": "new"}}),
        ("/finish_weight_update", _finish(labelled)),
    ):
        r = await c.post(path, json=body)
        seen.append(_seen(r.status_code, r.json()))
        if path == "/start_weight_update":
            after_start()
    return " · ".join(seen)


def _finish(labelled: bool) -> dict[str, str]:
    return {"weight_version": "new"} if labelled else {}


def _how(fault: str) -> str:
    if fault in ("comes back", "restarts"):
        return " (restarted)"
    return " (hung)" if fault == "hangs" else ""


async def _outcome(c, a: GenNode, b: GenNode, caller: str, how: str = "") -> dict:
    """What the nodes hold and serve once the trainer is done (``caller``: what it saw)."""
    info = (await c.get("/weight_info")).json()
    for i in range(24):
        body = {"token_ids": [1], "sampling_params": {}}
        await c.post("/inference/v1/generate", json=body, headers={ROUTE_KEY_HEADER: str(i)})
    reason = {n["url"]: n["reason"] for n in info["nodes"]}["http://g2"]
    labels = {g.split(":")[0] for g in a.generated + b.generated}
    return {
        "caller": caller,
        "A": a.weights if not a.updating else f"{a.weights} (mid-update)",
        "B": "down" if b.down else b.weights + how,
        "B serves": "yes" if reason is None else f"no: {reason}",
        "label": "/".join(sorted(labels)),
        "served": "/".join(sorted(g.split(":")[1] for g in set(a.generated + b.generated))),
    }


def _seen(status: int, body: dict) -> str:
    if status == 200:
        return "200"
    failed = body.get("error", {}).get("details", {}).get("failed", [])
    named = ", ".join(f"B {f['type']}" for f in failed if f["url"] == "http://g2")
    return f"{status} ({named})" if named else str(status)


async def _both(scenario: Any, *args: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labelled and the unlabelled run at once (each with its own door and nodes): the
    table's time is mostly hung calls waiting out the door's timeouts, which overlap."""
    labelled, bare = await asyncio.gather(scenario(*args, True), scenario(*args, False))
    return labelled, bare


async def rows() -> list[str]:
    out = []
    for step in STEPS:
        for fault in FAULTS:
            labelled, bare = await _both(_scenario, step, fault)
            name = step.removesuffix("_weight_update").removesuffix("_weights")
            out.append(_row(name if fault == "refuses" else "", f"B {fault}", labelled, bare))
    for step, fault, scenario in (
        ("update", "B loses chunk 2 of 3 and its abort", _lost_abort),
        ("any", "the trainer crashes mid-update; a new one updates", _crashed_trainer),
        ("start", "B is gone past the node timeout, back for the chunk", _missed_start),
        ("start", "another router's start with the same SEQ reaches B first", _raced_seq),
        ("any", "an answer B gave before the update arrives after it", _late_answer),
    ):
        labelled, bare = await _both(scenario)
        out.append(_row(step, fault, labelled, bare))
    return out


def _row(step: str, fault: str, labelled: dict[str, str], bare: dict[str, str]) -> str:
    # Labels aside, the two runs must agree: labels decide nothing.
    assert {k: v for k, v in labelled.items() if k != "label"} == {
        k: v for k, v in bare.items() if k != "label"
    }, (step, fault, labelled, bare)
    cells = (
        step,
        fault,
        labelled["caller"],
        labelled["A"],
        labelled["B"],
        labelled["B serves"],
        labelled["served"],
        f"{labelled['label']} / {bare['label']}",
    )
    return "| " + " | ".join(cells) + " |"


def table() -> str:
    head = (
        "| step | fault | the caller sees (start · update · finish) | A holds | B holds "
        "| B gets requests | answers computed with | their label (labelled / unlabelled) |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    return head + "\n".join(asyncio.run(rows())) + "\n"


_BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def in_page(text: str) -> str:
    """The table as the page holds it ("" when it holds none)."""
    found = _BLOCK.search(text)
    return found.group(1) if found else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write the table into {PAGE.name}")
    made = table()
    if not p.parse_args().write:
        print(made, end="")
        return
    text = PAGE.read_text()
    if _BLOCK.search(text) is None:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} block")
    PAGE.write_text(_BLOCK.sub(lambda _: f"{BEGIN}\n{made}{END}", text))


if __name__ == "__main__":
    main()

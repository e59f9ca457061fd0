"""The nemesis run's invariants (tools/chaos.py ``Checker``) on logs made by hand: each one
flags what it names and lets pass what the fleet may do."""

from __future__ import annotations

from tools.chaos import (
    CHECKPOINT,
    A,
    B,
    ChaosConfig,
    Checker,
    Expected,
    Fault,
    Log,
    Obs,
    Op,
    Update,
)

CFG = ChaosConfig(node_timeout_s=4.0, fence_poll_s=1.0, monitor_every_s=0.5)
EXPECTED = Expected(
    pure={
        CHECKPOINT: {"p": [1, 1, 1, 1]},
        A: {"p": [2, 2, 2, 2]},
        B: {"p": [3, 3, 3, 3]},
    },
    cont={"A>B": {"p": {1: [3, 4, 4], 2: [3, 4], 3: [4]}}, "B>A": {"p": {}}},
)


def updates() -> list[Update]:
    """#1 (A) answered 200 at t=10; #2 (B) finished between t=20 and t=22."""
    return [
        Update(1, A, finish_sent=9.0, finish_done=10.0, ok=True, held_ids=["wa"]),
        Update(2, B, finish_sent=20.0, finish_done=22.0, ok=True, held_ids=["wb"]),
    ]


def checker(
    ops=(), faults=(), obs=(), seen=(), last_heal=None, end=100.0, monitor_stopped=None
) -> Checker:
    log = Log(seed=0, ops=list(ops), updates=updates(), faults=list(faults), obs=list(obs))
    log.seen, log.last_heal, log.end = list(seen), last_heal, end
    log.monitor_stopped = monitor_stopped
    return Checker(log, EXPECTED, CFG)


def check(ops=(), faults=(), obs=(), seen=(), last_heal=None, end=100.0) -> list[str]:
    return checker(ops, faults, obs, seen, last_heal, end).all()


def op(start: float, tokens: list[int] | None, status: int = 200, end: float | None = None):
    return Op("chq0000001", "door_generate", "p", start, end or start + 1, status, None, tokens)


def healthy(node: int, t0: float, t1: float, wid: str = "wb") -> list[Obs]:
    times = [t0 + 0.5 * i for i in range(int((t1 - t0) / 0.5) + 1)]
    return [Obs(t, node, True, wid, None, False, False) for t in times]


def test_answers_must_come_from_the_newest_update_or_one_finishing_while_they_ran():
    assert check([op(12, [2, 2, 2, 2])]) == []  # A after #1
    assert check([op(19.5, [3, 3, 3, 3], end=21)]) == []  # B: #2's finish began meanwhile
    assert check([op(19.5, [2, 3, 4, 4], end=21)]) == []  # A's first token, then B's rest
    assert check([op(23, [3, 3, 3, 3])]) == []
    [stale] = check([op(23, [2, 2, 2, 2])])  # A after #2 answered 200
    assert "computed with ['A']" in stale and "#2" in stale
    [restarted] = check([op(23, [1, 1, 1, 1])])
    assert "['checkpoint']" in restarted
    [mixed] = check([op(23, [2, 9, 9, 9])])
    assert "no known weights" in mixed


def test_an_update_answered_502_may_serve_from_its_finish_on():
    log_updates = updates()
    log_updates.append(Update(3, A, finish_sent=30.0, finish_done=31.0, ok=False))
    log = Log(seed=0, ops=[op(32, [2, 2, 2, 2]), op(33, [3, 3, 3, 3])], updates=log_updates)
    log.end = 100.0
    assert Checker(log, EXPECTED, CFG).all() == []


def test_no_request_reaches_an_unclean_node_once_the_door_could_know():
    obs = healthy(0, 20, 40) + [Obs(t, 1, True, "wb", "partial_load") for t in (30, 30.5, 31, 34)]
    assert check(obs=obs, seen=[(30.6, 1, "chq0000009")]) == []  # unclean for 0.6 s only
    [late] = check(obs=obs, seen=[(34.2, 1, "chq0000009")])
    assert "unclean (partial_load)" in late
    stale = [Obs(t, 2, True, "wa") for t in (22, 24, 26, 28, 30)]
    [behind] = check(obs=obs + stale, seen=[(30.2, 2, "chq0000010")])
    assert "did not hold the newest" in behind


def test_5xx_only_while_no_node_could_serve():
    failed = op(30, None, status=503, end=30.5)
    everyone = healthy(0, 20, 40) + healthy(1, 20, 40) + healthy(2, 20, 40)
    [refused] = check([failed], obs=everyone)
    assert "could serve" in refused
    down = [Fault("stop", n, 25, 35) for n in range(3)]
    assert check([failed], obs=everyone, faults=down, last_heal=None) == []
    # Its own node was stopped under it: its answer is that node's failure.
    on_it = check(
        [failed], obs=everyone, faults=[Fault("stop", 0, 29, 31)], seen=[(30.1, 0, failed.id)]
    )
    assert on_it == []
    # A node killed just before: the request went out on its dead kept-alive connection, so
    # no proxy saw it; its error names the node, and is that node's failure.
    lost = Op(
        "chq0000002",
        "door_generate",
        "p",
        30,
        30.1,
        502,
        "generate node http://n1: the connection failed (ReadError)",
    )
    killed = [Fault("kill", 1, 29.9, 40)]
    log = Log(seed=0, ops=[lost], updates=updates(), faults=killed, obs=everyone, end=100.0)
    log.node_urls = ["http://n0", "http://n1", "http://n2"]
    assert Checker(log, EXPECTED, CFG).refusals() == []
    log.node_urls = ["http://n0", "http://n9", "http://n2"]  # it names no faulted node
    assert "could serve" in Checker(log, EXPECTED, CFG).refusals()[0]


def test_the_fleet_serves_again_within_the_node_timeout_and_a_poll_of_the_last_heal():
    heal = [Fault("kill", 0, 40, 50)]
    ok_soon = [op(52, [3, 3, 3, 3]), op(56, [3, 3, 3, 3])]
    assert check(ok_soon, faults=heal, last_heal=50.0) == []
    failing = [op(52, None, status=503, end=52.1), op(56, None, status=503, end=56.1)]
    found = check(failing, faults=heal, last_heal=50.0)
    assert any("after the last fault healed" in v for v in found)
    assert "no request ran after" in check(faults=heal, last_heal=50.0)[0]


def test_rss_growth_after_warm_up_is_judged_on_processes_that_ran_from_the_start():
    log = Log(seed=0, updates=updates(), t0=0.0, end=100.0)
    flat = [(t, 1e9) for t in range(0, 100, 2)]
    grows = [(t, 1e9 + t * 5e6) for t in range(0, 100, 2)]
    restarted = [(t, 1e9 + t * 5e6) for t in range(40, 100, 2)]  # its engine starting
    log.rss = {"flat": flat, "grows": grows, "restarted": restarted}
    [grown] = Checker(log, EXPECTED, CFG).rss()
    assert grown.startswith("grows: RSS grew")


def cut_stream(start: float, tokens: list[int], end: float | None = None) -> Op:
    """A door chat stream that ended in an error event after ``tokens``."""
    stream = op(start, tokens, end=end)
    stream.kind, stream.cut = "door_chat_stream", True
    stream.error = 'error event: {"error": {"code": 502}}'
    return stream


def test_a_stream_cut_by_its_node_dying_is_a_prefix_of_an_allowed_answer():
    everyone = [o for n in range(3) for o in healthy(n, 22, 40)]
    killed = [Fault("kill", 0, 29, 35)]
    cut = cut_stream(28, [3, 3], end=30)  # B's first two tokens, then its node died
    assert check([cut], obs=everyone, faults=killed, seen=[(28.1, 0, cut.id)]) == []
    # The same prefix from A's weights after #2 answered 200: stale, cut or not.
    stale = cut_stream(28, [2, 2], end=30)
    [violation] = check([stale], obs=everyone, faults=killed, seen=[(28.1, 0, stale.id)])
    assert "computed with ['A']" in violation
    # Tokens that begin no known answer.
    mixed = cut_stream(28, [3, 2], end=30)
    [violation] = check([mixed], obs=everyone, faults=killed, seen=[(28.1, 0, mixed.id)])
    assert "come from no known weights" in violation


def test_a_stream_cut_on_a_node_that_did_not_fail_is_a_5xx_while_others_could_serve():
    everyone = [o for n in range(3) for o in healthy(n, 22, 40)]
    cut = cut_stream(28, [3, 3], end=30)
    [violation] = check([cut], obs=everyone, seen=[(28.1, 0, cut.id)])
    assert "could serve" in violation


def test_an_answer_frozen_across_two_updates_may_switch_weights_at_each():
    # #3 (A again) finishes while an answer begun under #1 still runs: A's first token, B's
    # next (#2), then A's after those (#3). No single switch explains it; what each set
    # answers after each prefix, asked after the run, does.
    log_updates = [*updates(), Update(3, A, finish_sent=30.0, finish_done=31.0, ok=True)]
    twice = op(19.5, [2, 3, 7, 7], end=32)
    after = {
        A: {"p": {"": [2, 2, 2, 2], "2": [2, 2, 2], "2,3": [7, 7], "2,3,7": [7]}},
        B: {"p": {"": [3, 3, 3, 3], "2": [3, 4, 4], "2,3": [4, 4], "2,3,7": [4]}},
    }
    expected = Expected(pure=EXPECTED.pure, cont=EXPECTED.cont, after=after)

    def violations(answer: Op, known: Expected) -> list[str]:
        log = Log(seed=0, ops=[answer], updates=log_updates)
        log.end = 100.0
        return Checker(log, known, CFG).all()

    [unexplained] = violations(twice, EXPECTED)  # before the continuations are asked
    assert "no known weights" in unexplained
    assert violations(twice, expected) == []
    # A last token neither set answers after that prefix: a mix, whatever the switches.
    [mixed] = violations(op(19.5, [2, 3, 7, 9], end=32), expected)
    assert "no known weights" in mixed
    # Switching to B is allowed only while B's update finished during the answer.
    [stale] = violations(op(32, [2, 3, 7, 7], end=33), expected)
    assert "no known weights" in stale


def test_a_node_told_before_an_update_finished_is_judged_by_what_it_tells_next():
    # Node 2 came back from a restart on the checkpoint (fenced: no request reached it); #3
    # finished on it at 30.1 and the door sent it a request at 30.3. What it told at 29.6
    # says nothing of then.
    log_updates = [*updates(), Update(3, A, finish_sent=30.0, finish_done=30.1, ok=True)]
    log_updates[-1].held_ids = ["wa3"]

    def violations(obs: list[Obs], at: float) -> list[str]:
        log = Log(seed=0, updates=log_updates, obs=obs)
        log.seen, log.end = [(at, 2, "chq0000011")], 100.0
        return Checker(log, EXPECTED, CFG).all()

    took_it = [Obs(t, 2, True, "w0") for t in (27.6, 28.6, 29.6)]
    took_it += [Obs(t, 2, True, "wa3") for t in (30.6, 31.6, 32.6, 33.6)]
    assert violations(took_it, 30.3) == []
    missed_it = [Obs(t, 2, True, "w0") for t in (27.6, 28.6, 29.6, 30.6, 31.6, 32.6, 33.6)]
    [behind] = violations(missed_it, 33.8)  # told after the finish: still the checkpoint
    assert "did not hold the newest" in behind


def reaching(node: int, times) -> list[tuple[float, int, str]]:
    return [(t, node, f"chq{1000 * node + i:07d}") for i, t in enumerate(times)]


def test_a_node_the_monitor_never_saw_is_a_finding_not_a_pass():
    others = healthy(0, 20, 40) + healthy(2, 20, 40)
    served = reaching(1, range(21, 31))  # node 1 served; no fault explains the monitor's gap
    never_asked: list[Obs] = []
    never_answered = [Obs(20 + 0.5 * i, 1, False) for i in range(41)]
    for blind in (never_asked, never_answered):
        found = check(obs=others + blind, seen=served)
        unseen = [v for v in found if v.startswith("node 1: no answer to the monitor")]
        assert unseen == [
            "node 1: no answer to the monitor from 0.0s to 100.0s and no fault explains why; "
            "10 judgements skipped, the first at 21.0s"
        ], found


def test_a_5xx_is_not_excused_by_nodes_the_monitor_never_saw():
    found = check([op(30, None, status=503, end=30.5)])
    assert [v.split(":")[0] for v in found] == ["node 0", "node 1", "node 2"], found


def test_more_judgements_skipped_than_the_bound_is_a_violation():
    # Node 0's state never settles: unclean, clean, unclean... A request after each unclean
    # telling is a change the door may not have seen, every time.
    flapping = [
        Obs(20 + 0.5 * i, 0, True, "wb", "partial_load" if i % 2 == 0 else None) for i in range(41)
    ]
    [bound] = check(obs=flapping, seen=reaching(0, [20.1 + j for j in range(20)]))
    assert bound == "nodes_serving: 0 of 20 judged (changing 20): more than 25% unjudged"
    # A few such beside requests judged are within the bound.
    judged = reaching(2, [20.2 + j for j in range(17)])
    mixed = reaching(0, [20.1, 30.1, 35.1]) + judged
    assert check(obs=flapping + healthy(2, 20, 40), seen=mixed) == []
    # The monitor answered node 1 only every 2.5 s: each lapse too short to be a finding, but
    # what fell in them was judged blind.
    late = [Obs(20 + 2.5 * i, 1, True, "wb", None, False, False) for i in range(9)]
    [bound] = check(obs=late, seen=reaching(1, [22.2 + 2.5 * j for j in range(8)]))
    assert bound == "nodes_serving: 0 of 8 judged (unseen 8): more than 25% unjudged"


def test_a_node_a_fault_kept_from_the_monitor_is_skipped_not_a_finding():
    # Node 0 killed at 24 and answering again at 34.5 (its restart answered /health at 34);
    # node 2 SIGSTOPped from 20 to 28, then slow: its first answer at 31.0.
    down = [Obs(24 + 0.5 * i, 0, False) for i in range(21)]
    obs = healthy(0, 20, 23.5) + down + healthy(0, 34.5, 40) + healthy(1, 20, 40)
    obs += [Obs(20 + 0.5 * i, 2, False) for i in range(22)] + healthy(2, 31, 40)
    faults = [Fault("kill", 0, 24, 34), Fault("stop", 2, 20, 28)]
    seen = reaching(0, [26.2, 28.0]) + reaching(2, [30.8]) + reaching(1, range(21, 31))
    checked = checker(faults=faults, obs=obs, seen=seen)
    assert checked.all() == []
    # Unseen at 30.8 for the 0.5 s past the stop's grace only: counted, no finding.
    cover = checked.coverage["nodes_serving"]
    assert (cover.due, cover.skipped) == (13, {"faulted": 2, "unseen": 1})


def test_what_ran_after_the_monitor_stopped_is_counted_not_judged():
    everyone = [o for n in range(3) for o in healthy(n, 20, 40)]
    seen = reaching(1, range(21, 33)) + reaching(1, [41, 42, 43])
    checked = checker(
        [op(41, None, status=503, end=41.2)], obs=everyone, seen=seen, monitor_stopped=40.2
    )
    assert checked.all() == []
    assert checked.coverage["nodes_serving"].describe() == "12 of 15 judged (unwatched 3)"
    assert checked.coverage["refusals"].describe() == "0 of 1 judged (unwatched 1)"

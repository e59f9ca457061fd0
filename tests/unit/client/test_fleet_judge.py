"""``tandem_client.fleet.judge``: which weights are the fleet's and which nodes may serve,
from the nodes' own ``/weight_info`` answers (as ``tandem_generate.weight_ledger`` makes them)."""

from __future__ import annotations

import time

import msgspec

from tandem_client.fleet import Node, NodeAnswer, judge, next_seq_mark, rendezvous_nodes
from tandem_client.node_state import Told
from tandem_generate.weight_ledger import WeightLedger
from tandem_wire.control import UpdateId, WeightTransferState

NAMES = frozenset({"a.weight", "b.weight"})
FILE = WeightTransferState("tandem_file", True)


def ledger() -> WeightLedger:
    return WeightLedger("model@", lambda: NAMES)


def apply(led: WeightLedger, seq: int, names: set[str], token: str = "0a0b0c0d") -> None:
    led.start(UpdateId(seq, token))
    led.chunk(names, {"names": sorted(names)})
    led.finished()


def parsed(body: dict) -> Told:
    told = Told.parse(body, asked_at=0.0)
    assert told is not None
    return told


def told(led: WeightLedger, transfer: WeightTransferState = FILE) -> Told:
    return parsed(msgspec.to_builtins(led.info("default", transfer)))


def node(url: str, led: WeightLedger, transfer: WeightTransferState = FILE) -> Node:
    n = Node(url)
    n.learn(told(led, transfer))
    return n


def test_the_node_with_the_newest_update_holds_the_fleet_s_weights_whatever_the_labels():
    a, b = ledger(), ledger()
    apply(a, 1, {"a.weight"})
    view = judge([node("a", a), node("b", b)], now=0.0, node_timeout_s=10)
    assert view.reference is not None and view.reference.url == "a"
    assert view.reasons == {"a": None, "b": "other_weights"}


def test_a_node_that_missed_an_update_serves_once_what_it_missed_is_written_again():
    a, b = ledger(), ledger()
    apply(a, 1, {"a.weight", "b.weight"})  # B missed both tensors
    apply(a, 2, {"a.weight"})
    apply(b, 2, {"a.weight"})
    assert judge([node("a", a), node("b", b)], 0.0, 10).reasons["b"] == "other_weights"
    apply(a, 3, {"b.weight"})
    apply(b, 3, {"b.weight"})
    view = judge([node("a", a), node("b", b)], 0.0, 10)
    assert view.reasons == {"a": None, "b": None}
    # B lacks update 1 in its history, yet holds the same weights: it serves.
    assert view.missed(node("b", b)) == [1]


def test_a_node_unreachable_past_the_timeout_leaves_the_fleet():
    a, b = ledger(), ledger()
    apply(a, 1, {"a.weight"})
    na, nb = node("a", a), node("b", b)
    na.cool_down(now=100.0, seconds=1.0)  # A stopped answering at t=100
    assert judge([na, nb], now=105.0, node_timeout_s=10).reasons == {
        "a": None,
        "b": "other_weights",
    }
    view = judge([na, nb], now=111.0, node_timeout_s=10)
    assert view.reasons == {"a": "unreachable", "b": None} and view.reference is nb
    na.reached()
    assert judge([na, nb], now=112.0, node_timeout_s=10).reference is na


def test_an_unclean_node_serves_nothing_and_does_not_decide_the_fleet():
    a, b = ledger(), ledger()
    apply(a, 1, {"a.weight"})
    a.cache_not_reset()
    view = judge([node("a", a), node("b", b)], 0.0, 10)
    assert view.reasons == {"a": "unclean: prefix_cache_not_reset", "b": None}


def test_a_node_outside_the_trainer_s_group_is_fenced_with_its_reason():
    a, b, c = ledger(), ledger(), ledger()
    ready, late = WeightTransferState("nccl", True), WeightTransferState("nccl", False)
    none = WeightTransferState(None, False)
    view = judge([node("a", a, ready), node("b", b, late), node("c", c, none)], 0.0, 10)
    assert view.reasons == {"a": None, "b": "weight_transfer_not_initialized", "c": None}
    # Before the trainer set its group up on any node, nobody is held back for it.
    view = judge([node("a", a, late), node("b", b, late)], 0.0, 10)
    assert view.reasons == {"a": None, "b": None}


def test_a_node_that_never_told_serves_only_while_no_node_has():
    a, b = ledger(), Node("b")
    b.heard_from(NodeAnswer("b", 404, None), asked_at=0.0)  # it answered, without weights
    view = judge([node("a", a), b], 0.0, 10)
    assert view.reasons == {"a": None, "b": "weights_not_told"}


def test_upstream_nodes_that_tell_a_label_only_are_judged_by_it():
    a, b, c = Node("a"), Node("b"), Node("c")
    for n, label in ((a, "x"), (b, "y"), (c, "y")):
        n.learn(parsed({"weight_version": label}))
    assert judge([a, b, c], 0.0, 10).reasons == {"a": "other_weights", "b": None, "c": None}


def test_routers_agree_on_the_same_answers_whatever_the_node_order():
    leds = [ledger() for _ in range(4)]
    apply(leds[0], 1, {"a.weight"}, "aaaaaaaa")
    apply(leds[1], 1, {"b.weight"}, "aaaaaaaa")  # same seq, other tensors (unclean history)
    nodes = [node(str(i), led) for i, led in enumerate(leds)]
    first = judge(nodes, 0.0, 10).reference
    assert first is not None
    assert judge(list(reversed(nodes)), 0.0, 10).reference.url == first.url


def test_a_node_never_heard_serves_nothing_and_heard_ones_that_do_not_tell_serve_alike():
    # Start-up: until a node has answered (or failed) its first /weight_info, it serves nothing.
    assert judge([Node("a"), Node("b")], 0.0, 10).reasons == {
        "a": "not_asked_yet",
        "b": "not_asked_yet",
    }
    a, b = Node("a"), Node("b")
    for n in (a, b):  # upstream nodes without /weight_info: heard, never told
        n.heard_from(NodeAnswer(n.url, 404, None), asked_at=0.0)
    assert judge([a, b], 0.0, 10).reasons == {"a": None, "b": None}


def test_a_node_that_tells_less_than_it_had_is_restarted_and_never_the_newest():
    a, b = ledger(), ledger()
    for seq in (1, 2, 3):
        apply(a, seq, {"a.weight"})
        apply(b, seq, {"a.weight"})
    na, nb = node("a", a), node("b", b)
    nb.cool_down(now=0.0, seconds=1.0)  # B stopped answering, and left the fleet
    na.learn(told(ledger()))  # A restarted
    view = judge([na, nb], now=20.0, node_timeout_s=10)
    assert view.reference is None and view.reasons == {"a": "restarted", "b": "unreachable"}
    # The next update's SEQ comes from the mark the minter kept, not from the nodes now.
    assert next_seq_mark(3, [na, nb]) == 3 and next_seq_mark(0, [na]) == 3
    restarted = ledger()
    apply(restarted, 4, {"a.weight"})
    na.learn(told(restarted))
    nb.reached()  # B comes back with update 3
    view = judge([na, nb], now=21.0, node_timeout_s=10)
    assert view.reference is na and view.reasons == {"a": None, "b": "other_weights"}


def test_a_node_that_failed_a_step_is_fenced_until_it_tells_what_it_holds_after():
    a, b = ledger(), ledger()
    na, nb = node("a", a), node("b", b)
    asked_before = time.monotonic()
    nb.step_failed()
    assert judge([na, nb], 0.0, 10).reasons == {"a": None, "b": "update_step_failed"}
    info = NodeAnswer("b", 200, msgspec.to_builtins(b.info("default", FILE)))
    nb.heard_from(info, asked_before)  # an answer to an ask sent before the failure
    assert judge([na, nb], 0.0, 10).reasons["b"] == "update_step_failed"
    nb.heard_from(info, time.monotonic())
    assert judge([na, nb], 0.0, 10).reasons == {"a": None, "b": None}


def test_a_paused_node_gets_nothing_while_another_may_serve():
    na, nb = node("a", ledger()), node("b", ledger())
    view = judge([na, nb], 0.0, 10)
    nb.pause_answered(True)
    keys = [f"k{i}" for i in range(16)]
    assert {n.url for k in keys for n in rendezvous_nodes(k, [na, nb], view, 0.0)} == {"a"}
    na.pause_answered(True)  # every node paused: requests wait there, as on one vLLM
    assert {rendezvous_nodes(k, [na, nb], view, 0.0)[0].url for k in keys} == {"a", "b"}


def test_an_answer_asked_before_the_one_learnt_is_dropped_not_taken_for_a_restart():
    # Two asks overlap (a poll, and a caller's own /weight_info): the newer one's answer, after
    # update 2, arrives first; the older one's, from before it, arrives late.
    led = ledger()
    apply(led, 1, {"a.weight"})
    before = NodeAnswer("a", 200, msgspec.to_builtins(led.info("default", FILE)))
    apply(led, 2, {"a.weight"})
    after = NodeAnswer("a", 200, msgspec.to_builtins(led.info("default", FILE)))
    na = Node("a")
    na.heard_from(after, asked_at=2.0)
    na.heard_from(before, asked_at=1.0)
    assert (na.applied, na.restarted_at) == ((2, 1), None)
    assert judge([na], 0.0, 10).reasons == {"a": None}  # not "restarted": it serves


def test_a_node_s_state_reads_as_one_value_on_each_side():
    a, b, c = ledger(), ledger(), ledger()
    apply(a, 1, {"a.weight"})
    apply(c, 1, {"a.weight"})
    c.start(UpdateId(2, "0a0b0c0d"))  # C takes part in update 2
    na, nb, nc = node("a", a), node("b", b), node("c", c)
    na.pause_answered(True)
    nb.cool_down(now=5.0, seconds=10.0)  # B refused a call at t=5
    view = judge([na, nb, nc], now=6.0, node_timeout_s=10)
    states = {n.url: view.state(n).to_dict() for n in (na, nb, nc)}
    assert states == {
        "a": {"reach": "reachable", "serving": "paused", "reason": None, "update": None},
        "b": {"reach": "cooling", "serving": "fenced", "reason": "other_weights", "update": None},
        "c": {"reach": "reachable", "serving": "serving", "reason": None, "update": "2-0a0b0c0d"},
    }
    # Past the node timeout B is gone; a node telling less than it had is restarted.
    na.learn(told(ledger()))
    view = judge([na, nb, nc], now=16.0, node_timeout_s=10)
    assert (view.state(nb).reach, view.state(na).serving) == ("gone", "restarted")

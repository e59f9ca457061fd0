"""make chaos: the RL fleet under partitions, pauses and restarts (issue 41's nemesis run).

Render, three generate nodes and the front door on the tiny Qwen2-VL, each generate node behind
a TCP proxy the nemesis controls (``tools.chaos_proxy``), and for ``--seconds``, in parallel:

- a trainer through the door, TRL's sequence (``/pause?mode=keep``, start, two chunks, finish
  with ``{}``, ``/resume``) every ``--update-every`` seconds, alternating two weight sets A and B
  (the output projection and the embedding, perturbed: one chunk each) whose greedy answers
  differ from each other's and from the checkpoint's;
- clients: greedy chats (whole and streamed) and token-in generate calls through the door, and
  token-in generate calls through ``tandem_client`` straight to the nodes (through their
  proxies), each answer classified by its tokens against every weight set's greedy answers,
  computed once up front (and an answer frozen across an update by the keep pause, which
  continues under the new weights: its prefix one set's, the rest the other's continuation);
- a seeded nemesis (its seed printed): SIGKILL and restart a node, SIGSTOP then SIGCONT one,
  black-hole one node's traffic (the held bytes delivered late or lost), delay it, or cut one
  node's next chunk, finish, or chunk and its abort mid-body;
- a monitor asking each node directly (not through its proxy) what it holds, and RSS samples.

When the nemesis stops and every fault has healed, the run goes on for ``--node-timeout-s`` +
one poll + ``--settle`` seconds, then one last update goes through the door and every node must
serve again. The invariants, checked from the log of every request, update, fault and
observation (``check``):

- no answer computed with weights other than the newest update answered 200 when it started,
  or an update whose finish was sent before the answer ended (an update answered 502 may have
  been applied on some nodes: docs/rl.md's fault table);
- no request reaches a node that was unclean, or did not hold the newest update's weights, for
  longer than the door needs to see it (one poll and the monitor's own period);
- every client request answered exactly once (a lost answer, a stream with no or two ends);
- 5xx only while no node could serve (every node faulted, paused, unclean, mid-update or behind),
  or from the node the request was on failing under it;
- the fleet serves again within ``--node-timeout-s`` + one poll of the last fault healing, and
  after an update every node serves;
- no process's RSS grows after warm-up by more than max(64 MiB, 5%);
- the checker is not blind: each judgement that needs a node's state and is not made is counted
  with why (``Skip``: a change too recent for the door, a kill or SIGSTOP keeping the monitor
  away, no answer with no fault to explain it, after the monitor stopped); a node with no
  answer for longer than ``lapse_s`` and no fault explaining it, while a judgement needed it,
  is a finding, and so is skipping more than ``UNJUDGED_SHARE`` of an invariant's judgements.

A failing run prints its seed and the violations; ``--seed`` replays the same faults in the same
order (timings are this machine's). The whole log is written to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import enum
import io
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psutil

from tandem_client import AsyncTandemClient, TandemError
from tandem_wire import GenerateRequest
from tools.chaos_proxy import FaultProxy
from tools.servers import ServerProcess, tandem_front, tandem_generate, tandem_render
from tools.soak import sse_lines
from tools.tiny_models import ensure_model

NODES = 3
MAX_TOKENS = 8
CHECKPOINT, A, B = "checkpoint", "A", "B"
CHUNKS = {"head": "lm_head.weight", "embed": "model.embed_tokens.weight"}
"""The tensors an update writes, one chunk each (each a whole module, as updates must be)."""
GENERATE_OPTIONS = (
    "--max-model-len",
    "1024",
    "--max-num-seqs",
    "4",
    "--item-cache-bytes",
    str(16 * 2**20),
)
"""Three engines at once on a 24 GiB machine: short prompts, few sequences, text only."""
TOKEN_PROMPTS = (
    [1017, 359, 261, 198, 82, 88, 1018, 198, 1017, 436, 198],
    [1017, 359, 261, 198, 301, 77, 512, 9, 1018, 198, 1017, 436, 198],
    [1017, 359, 261, 198, 640, 41, 23, 97, 250, 1018, 198, 1017, 436, 198],
)
CHAT_TEXTS = ("Name a colour.", "Count to three.", "What is a square?")
KINDS = ("door_chat", "door_chat_stream", "door_generate", "client_generate")
RSS_SLACK_BYTES = 64 * 2**20
RSS_SLACK_RATIO = 0.05
FAULT_KINDS = ("kill", "stop", "partition", "delay", "cut")
CUTS = (
    ("/update_weights",),
    ("/finish_weight_update",),
    ("/update_weights", "/abort_weight_update"),
)
BLINDING = ("kill", "stop")
"""The faults that keep the monitor from a node's answers: it asks each node directly, not
through its proxy, so a black hole, a delay or a cut leaves it seeing."""
OBSERVE_TIMEOUT_S = 1.0
"""How long the monitor waits for each of its two asks of a node (/weight_info, /is_paused)."""
UNJUDGED_SHARE = 0.25
"""The share of an invariant's judgements a run may skip. An honest run skips well under 1%
(seed 76, 120 s: 21 of 12154 requests reaching a node, 3 as an update finished on a node back
from a restart, 18 after the monitor stopped; none of its six 5xx), because a node telling a
good state is judged however recently it began; a monitor that broke, or a state that never
settles, skips most. A quarter sits far from both."""
UNJUDGED_FEW = 3
"""Skips a run may have whatever its size: a share of a handful says nothing (a hand-made log,
a run with a few 5xx)."""


@dataclass
class ChaosConfig:
    seconds: float = 600.0
    seed: int = 0
    concurrency: int = 3
    update_every_s: float = 6.0
    fault_gap_s: tuple[float, float] = (4.0, 10.0)
    """Seconds between one fault's start and the next's (uniform)."""
    faults: bool = True
    node_timeout_s: float = 4.0
    fence_poll_s: float = 1.0
    control_timeout_s: float = 3.0
    read_timeout_s: float = 30.0
    monitor_every_s: float = 0.5
    settle_s: float = 10.0
    out: Path = Path(".cache/chaos")

    @property
    def grace_s(self) -> float:
        """How long a node's state may go unseen by the door (one poll) and by the monitor
        (its period, twice: before and after), plus half a second of scheduling."""
        return self.fence_poll_s + 2 * self.monitor_every_s + 0.5

    @property
    def fresh_s(self) -> float:
        """How old a node's last answer to the monitor may be and still tell its state: two
        periods, plus a second of the monitor's own lateness."""
        return 2 * self.monitor_every_s + 1.0

    @property
    def lapse_s(self) -> float:
        """How long the monitor may go without an answer from a node, no fault explaining it,
        before that is a finding: two of its slowest rounds (a round waits for its slowest
        node's two asks, each up to ``OBSERVE_TIMEOUT_S``, then its period). A shorter lapse is
        the monitor running late on a loaded machine: what it skips counts toward the bound."""
        return 2 * (2 * OBSERVE_TIMEOUT_S + self.monitor_every_s)


class HarnessError(RuntimeError):
    """The run could not be set up (not a finding about the fleet)."""


# -- the log ---------------------------------------------------------------------------------


@dataclass
class Op:
    id: str
    kind: str
    prompt: str
    start: float
    end: float = 0.0
    status: int = 0
    """HTTP status (tandem_client: its error's; 0: no answer at all)."""
    error: str | None = None
    tokens: list[int] | None = None
    cut: bool = False
    """A stream that ended in an error event (its node failed under it, as ``vllm serve``'s
    streams end): its tokens so far are a prefix of an answer, and it counts as a 5xx."""


@dataclass
class Step:
    name: str
    start: float
    end: float
    status: int
    detail: str = ""


@dataclass
class Update:
    k: int
    weights: str
    steps: list[Step] = field(default_factory=list)
    update_id: str | None = None
    finish_sent: float | None = None
    finish_done: float | None = None
    ok: bool = False
    held_ids: list[str] = field(default_factory=list)
    """The ``weights_id`` of each node that finished it (asked directly right after)."""


@dataclass
class Fault:
    kind: str
    node: int
    start: float
    end: float | None = None
    detail: str = ""


@dataclass
class Obs:
    t: float
    node: int
    ok: bool
    weights_id: str | None = None
    unclean: str | None = None
    updating: bool = False
    paused: bool | None = None


@dataclass
class Log:
    """Everything a run did and saw (times: monotonic seconds)."""

    seed: int
    t0: float = 0.0
    ops: list[Op] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    obs: list[Obs] = field(default_factory=list)
    seen: list[tuple[float, int, str]] = field(default_factory=list)
    """(time, node, request id): a request's bytes reached the node's proxy."""
    node_urls: list[str] = field(default_factory=list)
    """Each node's URL as the door and the client know it (its proxy's)."""
    cuts: list[tuple[float, int, str]] = field(default_factory=list)
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    final_fenced: dict[str, str | None] | None = None
    last_heal: float | None = None
    monitor_stopped: float | None = None
    """When the monitor stopped asking (None: it asked until ``end``): the last update and the
    requests after it are not judged by what the nodes told."""
    end: float = 0.0


@dataclass
class Expected:
    """Each weight set's greedy answer per prompt, and the continuations under one set of the
    other's first k tokens (what a request frozen by the keep pause answers)."""

    pure: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    cont: dict[str, dict[str, dict[int, list[int]]]] = field(default_factory=dict)
    """``"A>B"`` -> prompt -> k -> the tokens after A's first k, under B."""
    after: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)
    """weights -> prompt -> a prefix (its tokens joined by commas) -> the tokens after it:
    asked after the run, for answers that no single switch explains."""

    def classify(self, prompt: str, tokens: list[int], prefix: bool = False) -> set[str] | None:
        """The weight sets that computed ``tokens`` (None: none known did); ``prefix``: the
        tokens of an answer cut short, the sets whose answer begins with them."""

        def matches(answer: list[int]) -> bool:
            return answer[: len(tokens)] == tokens if prefix else answer == tokens

        pure = {w for w, answers in self.pure.items() if matches(answers.get(prompt, []))}
        if pure:
            return pure
        for pair, table in self.cont.items():
            first, then = pair.split(">")
            for k, rest in table.get(prompt, {}).items():
                if tokens[:k] == self.pure[first][prompt][:k] and matches(tokens[:k] + rest):
                    return {first, then}
        return None

    def switching(self, prompt: str, tokens: list[int], sets: set[str]) -> bool:
        """Whether each of ``tokens`` is the greedy next token of one of ``sets`` after the
        tokens before it (an answer frozen by the keep pause across two updates or more
        switches weights at each; ``after`` holds what each set answers after each prefix)."""
        if not tokens:
            return False
        for i, token in enumerate(tokens):
            after = [self.after.get(w, {}).get(prompt, {}).get(joined(tokens[:i])) for w in sets]
            nexts = {a[0] for a in after if a}
            if token not in nexts:
                return False
        return True


def joined(tokens: list[int]) -> str:
    """A prefix as ``Expected.after`` keys it."""
    return ",".join(map(str, tokens))


# -- the invariants --------------------------------------------------------------------------


def allowed(updates: list[Update], t_start: float, t_end: float) -> tuple[set[str], int]:
    """The weight sets an answer running from ``t_start`` to ``t_end`` may come from, and the
    newest update answered 200 at its start: that one's, and those of later updates whose finish
    was sent before it ended."""
    done = [u for u in updates if u.ok and u.finish_done is not None and u.finish_done <= t_start]
    newest = max(done, key=lambda u: u.k) if done else None
    sets = {newest.weights} if newest else {CHECKPOINT}
    k = newest.k if newest else 0
    for u in updates:
        if u.k > k and u.finish_sent is not None and u.finish_sent <= t_end:
            sets.add(u.weights)
    return sets, k


def newest_ids(updates: list[Update], t: float) -> set[str]:
    """The ``weights_id`` a node serving at ``t`` may hold (as ``allowed``)."""
    done = [u for u in updates if u.ok and u.finish_done is not None and u.finish_done <= t]
    newest = max(done, key=lambda u: u.k) if done else None
    k = newest.k if newest else 0
    ids = set(newest.held_ids) if newest else set()
    for u in updates:
        if u.k > k and u.finish_sent is not None and u.finish_sent <= t:
            ids.update(u.held_ids)
    return ids


class Skip(enum.StrEnum):
    """Why a judgement that needed a node's state was not made."""

    CHANGING = "changing"
    """The node told a bad state it began telling within ``grace_s``, or an update finished
    since it told: a change the door cannot have seen yet."""
    FAULTED = "faulted"
    """No recent answer from the node, and a kill (until its restart answered) or a SIGSTOP
    explains why."""
    UNSEEN = "unseen"
    """No recent answer from the node and no fault to explain it: the monitor failed to see."""
    UNWATCHED = "unwatched"
    """After the monitor stopped (the last update and the requests after it)."""


@dataclass
class Coverage:
    """How many of an invariant's judgements were due, and why those skipped were."""

    due: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def unjudged(self) -> int:
        return sum(self.skipped.values())

    def skip(self, why: Skip) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def beyond_bound(self) -> bool:
        return self.unjudged > max(UNJUDGED_SHARE * self.due, UNJUDGED_FEW)

    def describe(self) -> str:
        whys = ", ".join(f"{why} {n}" for why, n in sorted(self.skipped.items()))
        return f"{self.due - self.unjudged} of {self.due} judged" + (f" ({whys})" if whys else "")


class Checker:
    def __init__(self, log: Log, expected: Expected, cfg: ChaosConfig) -> None:
        self.log, self.expected, self.cfg = log, expected, cfg
        self.by_node: dict[int, list[Obs]] = {i: [] for i in range(NODES)}
        for o in sorted(log.obs, key=lambda o: o.t):
            self.by_node[o.node].append(o)
        self.times = {i: [o.t for o in obs] for i, obs in self.by_node.items()}
        self.answered = {i: [o for o in obs if o.ok] for i, obs in self.by_node.items()}
        self.answer_times = {i: [o.t for o in obs] for i, obs in self.answered.items()}
        self.reached: dict[str, list[tuple[float, int]]] = {}
        for t, node, rid in log.seen:
            self.reached.setdefault(rid, []).append((t, node))
        self.coverage = {"nodes_serving": Coverage(), "refusals": Coverage()}
        """Filled by the invariants that need the nodes' states (``all`` runs them first)."""
        self.unseen_at: list[tuple[int, float]] = []
        """(node, time): a judgement skipped because the monitor had no answer from the node."""

    def at(self, t: float) -> str:
        return f"{t - self.log.t0:.1f}s"

    def all(self) -> list[str]:
        return [
            *self.answers(),
            *self.nodes_serving(),
            *self.once(),
            *self.refusals(),
            *self.recovery(),
            *self.rss(),
            # Last: they read what nodes_serving and refusals skipped.
            *self.unseen(),
            *self.unjudged(),
        ]

    def answers(self) -> list[str]:
        out = []
        for op in self.log.ops:
            if op.status != 200 or op.tokens is None:
                continue
            used = self.expected.classify(op.prompt, op.tokens, prefix=op.cut)
            sets, k = allowed(self.log.updates, op.start, op.end)
            if used is not None and op.cut and used & sets:
                continue  # a prefix several sets share: one allowed is enough
            if used is None and self.expected.switching(op.prompt, op.tokens, sets):
                continue
            if used is None:
                out.append(
                    f"{op.id} ({op.kind}, {self.at(op.start)}-{self.at(op.end)}): tokens "
                    f"{op.tokens} come from no known weights (a mix, or stale caches); "
                    f"allowed {sorted(sets)}{self._nodes_of(op)}"
                )
            elif not used <= sets:
                out.append(
                    f"{op.id} ({op.kind}, {self.at(op.start)}-{self.at(op.end)}): computed with "
                    f"{sorted(used)}; the newest update answered 200 was #{k}, allowed "
                    f"{sorted(sets)}{self._nodes_of(op)}"
                )
        return out

    def _nodes_of(self, op: Op) -> str:
        nodes = sorted({n for _, n in self.reached.get(op.id, [])})
        return f" (on node {', '.join(map(str, nodes))})" if nodes else ""

    def _told(self, node: int, t: float) -> Obs | Skip:
        """The node's last answer to the monitor before ``t``, or why none tells its state."""
        if self._unwatched(t):
            return Skip.UNWATCHED
        i = bisect.bisect_left(self.answer_times[node], t)
        if i and self.answer_times[node][i - 1] >= t - self.cfg.fresh_s:
            return self.answered[node][i - 1]
        return Skip.FAULTED if self._blinded(node, t) else Skip.UNSEEN

    def _unwatched(self, t: float) -> bool:
        return self.log.monitor_stopped is not None and t > self.log.monitor_stopped

    def _blinded(self, node: int, t: float) -> bool:
        """Whether a fault kept the monitor from the node's answers at ``t``."""
        return any(start <= t <= end for start, end in self._blindings(node))

    def _blindings(self, node: int) -> list[tuple[float, float]]:
        """When faults kept the monitor from the node's answers: a kill until its restart
        answered /health, a SIGSTOP until its SIGCONT, each ``grace_s`` more (the monitor's
        next rounds)."""
        return [
            (f.start, self._end(f) + self.cfg.grace_s)
            for f in self.log.faults
            if f.node == node and f.kind in BLINDING
        ]

    def _end(self, fault: Fault) -> float:
        return fault.end if fault.end is not None else self.log.end

    def _serves_newest(self, told: Obs, t: float) -> bool:
        """Whether what the node told holds nothing against a request at ``t``: clean, and
        mid-update or holding the newest update's weights the door can know of (one poll
        before ``t``), or those of one whose finish was sent since (however recently it began
        telling so: a good state needs no grace)."""
        if told.unclean is not None:
            return False
        known = newest_ids(self.log.updates, t - self.cfg.grace_s)
        finished_since = newest_ids(self.log.updates, t)
        return told.updating or not known or told.weights_id in known | finished_since

    def _changing(self, node: int, told: Obs, t: float) -> bool:
        """Whether the node began telling what it told within ``grace_s`` before ``t``, or an
        update finished since it told (it may have loaded that update: its next telling
        judges it)."""
        recent = self._held_since(node, told) > t - self.cfg.grace_s
        return recent or self._finished_between(told.t, t)

    def _held_since(self, node: int, told: Obs) -> float:
        """When the node began telling the state it told in ``told``."""
        answers = self.answered[node][: bisect.bisect_right(self.answer_times[node], told.t)]
        since = told.t
        for o in reversed(answers):
            if (o.unclean, o.weights_id) != (told.unclean, told.weights_id):
                break
            since = o.t
        return since

    def _skipped(self, invariant: str, why: Skip, node: int, t: float) -> None:
        self.coverage[invariant].skip(why)
        if why is Skip.UNSEEN:
            self.unseen_at.append((node, t))

    def nodes_serving(self) -> list[str]:
        """No request reaches an unclean node, or one without the newest update's weights.
        A node is judged by what it last told the monitor before the request; a bad state it
        began telling too recently for the door to have seen, or told before an update
        finished, is not held against it (``Skip``: each skip is counted)."""
        out = []
        self.coverage["nodes_serving"] = Coverage(due=len(self.log.seen))
        for t, node, rid in self.log.seen:
            told = self._told(node, t)
            if isinstance(told, Skip):
                self._skipped("nodes_serving", told, node, t)
            elif self._serves_newest(told, t):
                continue
            elif self._changing(node, told, t):
                self._skipped("nodes_serving", Skip.CHANGING, node, t)
            elif told.unclean is not None:
                out.append(f"{rid} reached node {node} at {self.at(t)}: unclean ({told.unclean})")
            else:
                out.append(
                    f"{rid} reached node {node} at {self.at(t)}, which did not hold the newest "
                    f"update's weights (weights_id {told.weights_id})"
                )
        return out

    def _finished_between(self, t0: float, t1: float) -> bool:
        return any(
            u.finish_sent is not None and u.finish_sent <= t1 and (u.finish_done or t1) >= t0
            for u in self.log.updates
        )

    def once(self) -> list[str]:
        out = []
        for op in self.log.ops:
            if op.status == 200 and op.error and not op.cut:
                out.append(f"{op.id} ({op.kind}, {self.at(op.start)}): {op.error}")
            elif op.status == 0 and op.kind != "client_generate":
                out.append(f"{op.id} ({op.kind}, {self.at(op.start)}): no answer ({op.error})")
        return out

    def _faulted(self, node: int, t0: float, t1: float) -> bool:
        for f in self.log.faults:
            if f.node != node or f.kind in ("delay", "cut"):
                continue
            if f.start <= t1 and self._end(f) + self.cfg.grace_s >= t0:
                return True
        return False

    def could_serve(self, node: int, t0: float, t1: float) -> bool | Skip:
        """Whether nothing kept the node from serving from ``t0`` to ``t1``: not faulted, and
        every observation since ``grace_s`` before answered, clean, idle, unpaused, newest
        weights. A ``Skip`` when no fault or bad state says no and the monitor lacks an answer
        to say yes (an unanswered ask of a node no fault explains is no reason it could not
        serve)."""
        if self._faulted(node, t0, t1):
            return False
        window = self._window(node, t0, t1)
        if any(o.ok and not self._ready(o) for o in window):
            return False
        if self._unwatched(t1):
            return Skip.UNWATCHED  # what it told before the monitor stopped says nothing after
        if window and all(o.ok for o in window):
            return True
        return Skip.UNSEEN

    def _window(self, node: int, t0: float, t1: float) -> list[Obs]:
        lo = bisect.bisect_left(self.times[node], t0 - self.cfg.grace_s)
        return self.by_node[node][lo : bisect.bisect_right(self.times[node], t1)]

    def _ready(self, o: Obs) -> bool:
        ids = newest_ids(self.log.updates, o.t)
        idle = not o.unclean and not o.updating and o.paused is False
        return idle and (not ids or o.weights_id in ids)

    def refusals(self) -> list[str]:
        out = []
        cover = self.coverage["refusals"] = Coverage()
        for op in self.log.ops:
            failed = op.status >= 500 or op.cut or (op.status == 0 and op.kind == "client_generate")
            if not failed:
                if op.status not in (0, 200):
                    out.append(f"{op.id} ({op.kind}, {self.at(op.start)}): {op.status} {op.error}")
                continue
            cover.due += 1
            on = {n for t, n in self.reached.get(op.id, []) if op.start <= t <= op.end}
            on |= self._named(op.error)
            if any(self._faulted(n, op.start, op.end) for n in on):
                continue  # the node it was on failed under it
            verdicts = {n: self.could_serve(n, op.start, op.end) for n in range(NODES)}
            able = [n for n, v in verdicts.items() if v is True]
            if able:
                out.append(
                    f"{op.id} ({op.kind}, {self.at(op.start)}-{self.at(op.end)}): {op.status} "
                    f"while node {', '.join(map(str, able))} could serve: {op.error}"
                )
            elif unknown := {n: v for n, v in verdicts.items() if isinstance(v, Skip)}:
                self._skip_refusal(unknown, op)
        return out

    def _named(self, error: str | None) -> set[int]:
        """The nodes an error names (``generate node URL: the connection failed``): a request
        sent on a kept-alive connection of a node killed just before fails as that node's,
        though its bytes never reached the node's proxy to be seen there."""
        urls = self.log.node_urls
        return {i for i, url in enumerate(urls) if error and f"{url}:" in error}

    def _skip_refusal(self, unknown: dict[int, Skip], op: Op) -> None:
        """A 5xx that no node was seen able to serve, but some node was not seen at all."""
        unseen = [n for n, why in unknown.items() if why is Skip.UNSEEN]
        self.coverage["refusals"].skip(Skip.UNSEEN if unseen else Skip.UNWATCHED)
        for n in unseen:
            # The first unanswered ask in its window, or the request's start if none was made.
            missed = [o.t for o in self._window(n, op.start, op.end) if not o.ok]
            self.unseen_at.append((n, missed[0] if missed else op.start))

    def unseen(self) -> list[str]:
        """A node the monitor had no answer from for longer than ``lapse_s``, no fault
        explaining it, while a judgement needed its state: there the checker was blind."""
        lapses: dict[tuple[int, float, float], list[float]] = {}
        for node, t in self.unseen_at:
            lapses.setdefault((node, *self._unexplained_lapse(node, t)), []).append(t)
        out = []
        for (node, t0, t1), moments in sorted(lapses.items()):
            if t1 - t0 > self.cfg.lapse_s:
                out.append(
                    f"node {node}: no answer to the monitor from {self.at(t0)} to {self.at(t1)} "
                    f"and no fault explains why; {len(moments)} judgements skipped, the first "
                    f"at {self.at(min(moments))}"
                )
        return out

    def _unexplained_lapse(self, node: int, t: float) -> tuple[float, float]:
        """The stretch around ``t`` (a moment no fault explains) with no answer from the node
        and no fault to explain it: from its last answer before (or the run's start, or the
        end of a fault that blinded the monitor) to its next (or the monitor's end, or the
        start of such a fault)."""
        times = self.answer_times[node]
        i = bisect.bisect_left(times, t)
        starts = [times[i - 1] if i else self.log.t0]
        ends = [times[i] if i < len(times) else self._watch_end()]
        for start, end in self._blindings(node):
            if end < t:
                starts.append(end)
            else:  # no blinding holds t: this one comes after it
                ends.append(start)
        return max(starts), min(ends)

    def _watch_end(self) -> float:
        stopped = self.log.monitor_stopped
        return stopped if stopped is not None else self.log.end

    def unjudged(self) -> list[str]:
        """More of an invariant's judgements skipped than ``UNJUDGED_SHARE``: a run the
        checker barely saw would pass whatever the fleet did."""
        return [
            f"{name}: {cover.describe()}: more than {UNJUDGED_SHARE:.0%} unjudged"
            for name, cover in self.coverage.items()
            if cover.beyond_bound()
        ]

    def recovery(self) -> list[str]:
        out = []
        if self.log.last_heal is not None:
            due = self.log.last_heal + self.cfg.node_timeout_s + self.cfg.fence_poll_s
            after = [op for op in self.log.ops if op.start >= due]
            if not after:
                out.append("no request ran after the last fault healed: recovery not checked")
            bad = [op for op in after if op.status != 200]
            if bad:
                first = min(bad, key=lambda op: op.start)
                out.append(
                    f"{len(bad)} requests failed more than node timeout + one poll after the "
                    f"last fault healed ({self.at(self.log.last_heal)}); first {first.id} at "
                    f"{self.at(first.start)}: {first.status} {first.error}"
                )
        if self.log.final_fenced is not None:
            for url, why in self.log.final_fenced.items():
                if why is not None:
                    out.append(f"{url} still fenced ({why}) after every fault healed and an update")
        return out

    def rss(self) -> list[str]:
        out = []
        for name, series in self.log.rss.items():
            # A process started during the run (a restarted node) grows while its engine
            # starts: only those that served from the start are judged.
            late = series and series[0][0] > self.log.t0 + 10
            if late or len(series) < 3 or series[-1][0] - series[0][0] < 30:
                continue
            span = series[-1][0] - series[0][0]
            warm = min(series, key=lambda s: abs(s[0] - series[0][0] - 0.3 * span))[1]
            grown = series[-1][1] - warm
            if grown > max(RSS_SLACK_BYTES, RSS_SLACK_RATIO * warm):
                out.append(f"{name}: RSS grew {grown / 2**20:.0f} MiB after warm-up")
        return out


# -- the services ----------------------------------------------------------------------------


def write_weight_sets(model: str, weight_dir: str) -> dict[str, list[str]]:
    """Weight sets A and B: each chunk tensor perturbed (seeded); one file per chunk."""
    import torch
    from safetensors.torch import load_file, save_file

    checkpoint = load_file(f"{model}/model.safetensors")
    files: dict[str, list[str]] = {}
    for seed, name in ((1, A), (2, B)):
        files[name] = []
        for i, (tag, tensor) in enumerate(CHUNKS.items()):
            base = checkpoint[tensor]
            gen = torch.Generator().manual_seed(100 * seed + i)
            noise = torch.randn(base.shape, generator=gen) * (base.float().std() + 0.01) * 4
            path = f"{name}-{tag}.safetensors"
            save_file({tensor: (base.float() + noise).to(base.dtype)}, f"{weight_dir}/{path}")
            files[name].append(path)
    return files


class Stack:
    """Render, the generate nodes (each restartable) and the door, as processes."""

    def __init__(self, cfg: ChaosConfig, model: str) -> None:
        self.cfg = cfg
        self.model = model
        self.weight_dir = tempfile.mkdtemp(prefix="tandem-chaos-weights-")
        self.render: ServerProcess | None = None
        self.nodes: list[ServerProcess] = []
        self.door: ServerProcess | None = None
        self.retired: list[ServerProcess] = []

    def start_nodes(self) -> None:
        """Render and the generate nodes, started (``wait_healthy`` waits for them)."""
        self.render = tandem_render(self.model, workers=1)
        self.nodes = [
            tandem_generate(self.model, self.weight_dir, *GENERATE_OPTIONS) for _ in range(NODES)
        ]

    def wait_healthy(self) -> None:
        """Every server started answers /health (the door's once render's and a node's do)."""
        for server in self.servers().values():
            server.wait_healthy(timeout=600)

    def start_door(self, generate_urls: list[str]) -> None:
        """The door over ``generate_urls``, started with the nodes: its imports overlap their
        start-up."""
        assert self.render is not None  # start_nodes ran
        c = self.cfg
        self.door = tandem_front(
            self.model,
            self.render.url,
            generate_urls,
            "--enable-control-routes",
            *("--fence-poll-s", str(c.fence_poll_s), "--node-timeout-s", str(c.node_timeout_s)),
            *("--control-timeout-s", str(c.control_timeout_s)),
            *("--read-timeout-s", str(c.read_timeout_s)),
            workers=1,
        )

    def restart(self, i: int) -> ServerProcess:
        """Node ``i`` again, after it was killed (same command and port)."""
        old = self.nodes[i]
        old.proc.wait(timeout=60)
        self.retired.append(old)
        new = old.restarted()
        self.nodes[i] = new
        new.wait_healthy(timeout=600)
        return new

    def servers(self) -> dict[str, ServerProcess]:
        named = {f"generate{i}": n for i, n in enumerate(self.nodes)}
        if self.render is not None:
            named["render"] = self.render
        if self.door is not None:
            named["door"] = self.door
        return named

    def stop(self) -> None:
        for server in self.servers().values():
            server.stop()
        # Killed on purpose: their logs (printed by ``stop`` for a failure status) are noise.
        with contextlib.redirect_stderr(io.StringIO()):
            for server in self.retired:
                server.stop()
        shutil.rmtree(self.weight_dir, ignore_errors=True)


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Prompt:
    key: str
    generate: dict[str, Any]
    """Render's generate request for it (JSON), as the door and tandem_client send it."""
    chat: dict[str, Any] | None = None
    """The chat body, for chat prompts."""


class Run:
    def __init__(self, cfg: ChaosConfig, stack: Stack, proxies: list[FaultProxy]) -> None:
        self.cfg = cfg
        self.stack = stack
        self.proxies = proxies
        self.log = Log(seed=cfg.seed, node_urls=[p.url for p in proxies])
        self.expected = Expected()
        self.prompts: dict[str, Prompt] = {}
        self.client_requests: dict[str, GenerateRequest[Any]] = {}
        self.files: dict[str, list[str]] = {}
        self.count = 0
        self.door = ""
        self.http = httpx.AsyncClient(timeout=cfg.read_timeout_s + 30)
        self.client: AsyncTandemClient | None = None
        self.stopping = asyncio.Event()
        self.updates_stop = asyncio.Event()

    def next_id(self) -> str:
        self.count += 1
        return f"chq{self.count:07d}"

    def say(self, text: str) -> None:
        t = time.monotonic() - self.log.t0 if self.log.t0 else 0.0
        print(f"[chaos {t:7.1f}s] {text}", flush=True)

    # -- set-up: prompts and what each weight set answers ------------------------------------

    async def prepare(self) -> None:
        stack = self.stack
        assert stack.door is not None and stack.render is not None
        self.door = stack.door.url
        self.files = await asyncio.to_thread(write_weight_sets, stack.model, stack.weight_dir)
        self.client = AsyncTandemClient(
            stack.render.url,
            [p.url for p in self.proxies],
            model=stack.model,
            node_timeout_s=self.cfg.node_timeout_s,
            control_timeout_s=self.cfg.control_timeout_s,
            node_cooldown_s=2.0,
            timeout_s=self.cfg.read_timeout_s + 30,
        )
        render = stack.render.url
        # Typed loosely: sampling fields, never render_completion's media arguments.
        sampling: dict[str, Any] = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
        for i, ids in enumerate(TOKEN_PROMPTS):
            r = await self.http.post(
                f"{render}/v1/completions/render",
                json={"model": stack.model, "prompt": ids, **sampling},
            )
            r.raise_for_status()
            [doc] = r.json()
            key = f"tokens{i}"
            self.prompts[key] = Prompt(key, doc)
            [req] = await self.client.render_completion(ids, **sampling)
            self.client_requests[key] = req
        for i, text in enumerate(CHAT_TEXTS):
            chat = {
                "model": stack.model,
                "messages": [{"role": "user", "content": text}],
                **sampling,
            }
            r = await self.http.post(f"{render}/v1/chat/completions/render", json=chat)
            r.raise_for_status()
            key = f"chat{i}"
            self.prompts[key] = Prompt(key, r.json(), chat)
        await self.until_every_node_serves(120)
        self.expected.pure[CHECKPOINT] = await self.answers_everywhere()
        # A, B, then A again: the continuations of each one's answers under the other.
        for k, (weights, other) in enumerate(((A, None), (B, A), (A, B)), start=1):
            update = await self.update(k, weights)
            if not update.ok:
                raise HarnessError(f"set-up update {k} failed: {update.steps}")
            pure = await self.answers_everywhere()
            if weights in self.expected.pure and pure != self.expected.pure[weights]:
                raise HarnessError(f"weights {weights} loaded again answer otherwise: {pure}")
            self.expected.pure[weights] = pure
            if other is not None:
                self.expected.cont[f"{other}>{weights}"] = await self.continuations(other)
        for key in self.prompts:
            answers = [self.expected.pure[w][key] for w in (CHECKPOINT, A, B)]
            if len({tuple(a) for a in answers}) != 3:
                raise HarnessError(f"prompt {key}: the weight sets answer alike: {answers}")
        self.say(f"greedy answers: {self.expected.pure}")

    async def greedy(self, url: str, prompt: Prompt, prefix: list[int]) -> list[int]:
        body = dict(prompt.generate)
        body["request_id"] = f"setup-{self.next_id()}"
        body["token_ids"] = list(prompt.generate["token_ids"]) + prefix
        body["sampling_params"] = {
            **prompt.generate["sampling_params"],
            "max_tokens": MAX_TOKENS - len(prefix),
        }
        r = await self.http.post(f"{url}/inference/v1/generate", json=body)
        if r.status_code != 200:
            raise HarnessError(f"set-up request on {url}: {r.status_code} {r.text[:300]}")
        return list(r.json()["choices"][0]["token_ids"])

    async def answers_everywhere(self) -> dict[str, list[int]]:
        """Each prompt's greedy answer, asked of every node directly: they must agree."""
        out: dict[str, list[int]] = {}
        for key, prompt in self.prompts.items():
            each = await asyncio.gather(*(self.greedy(n.url, prompt, []) for n in self.stack.nodes))
            if any(e != each[0] for e in each):
                raise HarnessError(f"nodes answer {key} differently with the same weights: {each}")
            out[key] = each[0]
        return out

    async def continuations(self, first: str) -> dict[str, dict[int, list[int]]]:
        """Under the weights loaded now, each prompt's answer after ``first``'s first k."""
        url = self.stack.nodes[0].url
        out: dict[str, dict[int, list[int]]] = {}
        for key, prompt in self.prompts.items():
            before = self.expected.pure[first][key]
            ks = range(1, len(before))
            rests = await asyncio.gather(*(self.greedy(url, prompt, before[:k]) for k in ks))
            out[key] = dict(zip(ks, rests, strict=True))
        return out

    async def switch_continuations(self) -> None:
        """For each answer that no single switch of weights explains (one frozen by the keep
        pause across two updates or more), what each weight set it may come from answers after
        each of its prefixes (``Expected.after``): asked of a node once the run is over, each
        set loaded in turn by an update the run's log does not count."""
        odd = [
            op
            for op in self.log.ops
            if op.status == 200
            and op.tokens
            and self.expected.classify(op.prompt, op.tokens, prefix=op.cut) is None
        ]
        sets = {w for op in odd for w in allowed(self.log.updates, op.start, op.end)[0]}
        url = self.stack.nodes[0].url
        for k, weights in enumerate(sorted(sets & set(self.files)), start=len(self.log.updates)):
            if not (await self.update(k + 1, weights, logged=False)).ok:
                raise HarnessError(f"loading {weights} to explain {len(odd)} answers failed")
            table = self.expected.after.setdefault(weights, {})
            for op in odd:
                tokens = op.tokens or []
                for i in range(len(tokens)):
                    rest = await self.greedy(url, self.prompts[op.prompt], tokens[:i])
                    table.setdefault(op.prompt, {})[joined(tokens[:i])] = rest
        if odd:
            self.say(f"{len(odd)} answers switched weights more than once: asked what follows")

    async def until_every_node_serves(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            info = (await self.http.get(f"{self.door}/weight_info")).json()
            if not info.get("fenced") and len(info.get("nodes", [])) == NODES:
                return
            if time.monotonic() > deadline:
                raise HarnessError(f"the door never served through every node: {info}")
            await asyncio.sleep(0.5)

    # -- the trainer -------------------------------------------------------------------------

    async def step(self, update: Update, name: str, path: str, body: Any) -> Step:
        start = time.monotonic()
        try:
            r = await self.http.post(f"{self.door}{path}", json=body)
            status, detail = r.status_code, r.text[:2000]
        except httpx.HTTPError as exc:
            status, detail = 0, f"{type(exc).__name__}: {exc}"
        step = Step(name, start, time.monotonic(), status, detail)
        update.steps.append(step)
        return step

    async def update(self, k: int, weights: str, logged: bool = True) -> Update:
        """TRL's sequence through the door: pause (keep), start, the chunks, finish with
        ``{}`` (the label stays), resume. As TRL, the finish is sent even when a chunk failed,
        and nothing but the resume when the start failed. ``logged``: part of the run's log
        (no: an update of the checker's own, after the run)."""
        update = Update(k, weights)
        if logged:
            self.log.updates.append(update)
        await self.step(update, "pause", "/pause?mode=keep", None)
        start = await self.step(update, "start", "/start_weight_update", {})
        if start.status == 200:
            with contextlib.suppress(ValueError, KeyError):
                update.update_id = json.loads(start.detail)["update_id"]
            for i, path in enumerate(self.files[weights]):
                await self.step(
                    update, f"chunk{i + 1}", "/update_weights", {"update_info": {"path": path}}
                )
            update.finish_sent = time.monotonic()
            finish = await self.step(update, "finish", "/finish_weight_update", {})
            update.finish_done = time.monotonic()
            update.held_ids = await self.held_ids(finish)
        await self.step(update, "resume", "/resume", None)
        update.ok = all(s.status == 200 for s in update.steps if s.name not in ("pause", "resume"))
        statuses = " ".join(f"{s.name}:{s.status}" for s in update.steps)
        self.say(f"update #{k} ({weights}): {statuses}")
        return update

    async def held_ids(self, finish: Step) -> list[str]:
        """The ``weights_id`` of each node that finished the update (asked directly)."""
        try:
            doc = json.loads(finish.detail)
        except ValueError:
            return []
        if finish.status == 200:
            done = [n["url"] for n in doc.get("nodes", []) if "error" not in (n.get("body") or {})]
        else:
            done = (doc.get("error", {}).get("details") or {}).get("succeeded", [])
        ids = []
        for i, proxy in enumerate(self.proxies):
            if proxy.url not in done:
                continue
            info = await self.weight_info(i)
            if info is not None and not info.get("updating") and not info.get("unclean"):
                ids.append(str(info["weights_id"]))
        return ids

    async def trainer(self) -> None:
        k = len(self.log.updates)
        while not self.updates_stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.updates_stop.wait(), self.cfg.update_every_s)
            if self.updates_stop.is_set():
                return
            k += 1
            await self.update(k, B if k % 2 == 0 else A)

    # -- the clients -------------------------------------------------------------------------

    async def clients(self, i: int) -> None:
        rng = random.Random(f"{self.cfg.seed}-client-{i}")
        while not self.stopping.is_set():
            kind = rng.choice(KINDS)
            chat = kind.startswith("door_chat")
            keys = sorted(k for k in self.prompts if k.startswith("chat") == chat)
            await self.request(kind, rng.choice(keys))

    async def request(self, kind: str, key: str) -> Op:
        op = Op(self.next_id(), kind, key, time.monotonic())
        self.log.ops.append(op)
        try:
            if kind == "client_generate":
                await self._client_generate(op)
            elif kind == "door_generate":
                await self._door_generate(op)
            else:
                await self._door_chat(op, stream=kind == "door_chat_stream")
        except TandemError as exc:
            op.status = int(getattr(exc, "status_code", 0) or 0)
            op.error = f"{type(exc).__name__}: {exc}"[:300]
        except httpx.HTTPError as exc:
            op.status, op.error = 0, f"{type(exc).__name__}: {exc}"[:300]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            op.error = f"unreadable answer: {type(exc).__name__}: {exc}"[:300]
        op.end = time.monotonic()
        return op

    async def _client_generate(self, op: Op) -> None:
        assert self.client is not None
        request = msgspec.structs.replace(self.client_requests[op.prompt], request_id=op.id)
        answer = await self.client.generate(request)
        op.status = 200
        op.tokens = list(answer.choices[0].token_ids or [])

    async def _door_generate(self, op: Op) -> None:
        body = {**self.prompts[op.prompt].generate, "request_id": op.id}
        r = await self.http.post(
            f"{self.door}/inference/v1/generate", json=body, headers={"x-request-id": op.id}
        )
        op.status = r.status_code
        if r.status_code != 200:
            op.error = r.text[:300]
            return
        doc = r.json()
        if doc.get("request_id") != op.id:
            op.error = f"answered as request {doc.get('request_id')}"
        op.tokens = list(doc["choices"][0]["token_ids"])

    async def _door_chat(self, op: Op, stream: bool) -> None:
        chat = self.prompts[op.prompt].chat
        body = {**(chat or {}), "return_token_ids": True, "stream": stream}
        headers = {"x-request-id": op.id}
        url = f"{self.door}/v1/chat/completions"
        if not stream:
            r = await self.http.post(url, json=body, headers=headers)
            op.status = r.status_code
            if r.status_code == 200:
                op.tokens = list(r.json()["choices"][0]["token_ids"])
            else:
                op.error = r.text[:300]
            return
        async with self.http.stream("POST", url, json=body, headers=headers) as r:
            op.status = r.status_code
            if r.status_code != 200:
                op.error = (await r.aread()).decode(errors="replace")[:300]
                return
            tokens: list[int] = []
            finishes = done = 0
            async for line in sse_lines(r):
                if line == "data: [DONE]":
                    done += 1
                elif line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        op.error = f"error event: {json.dumps(chunk)[:200]}"
                        op.cut = finishes == 0
                    for choice in chunk.get("choices", []):
                        tokens += choice.get("token_ids") or []
                        finishes += choice.get("finish_reason") is not None
            op.tokens = tokens
            if op.cut and done > 1:
                op.error, op.cut = f"a cut stream sent [DONE] {done} times", False
            if op.error is None and (finishes, done) != (1, 1):
                op.error = f"stream ended {finishes} times and sent [DONE] {done} times"

    # -- what the nodes hold, and memory -----------------------------------------------------

    async def weight_info(self, i: int) -> dict[str, Any] | None:
        try:
            r = await self.http.get(
                f"{self.stack.nodes[i].url}/weight_info", timeout=OBSERVE_TIMEOUT_S
            )
            doc = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    async def observe(self, i: int) -> Obs:
        t = time.monotonic()
        info = await self.weight_info(i)
        if info is None:
            return Obs(t, i, False)
        paused: bool | None = None
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            r = await self.http.get(
                f"{self.stack.nodes[i].url}/is_paused", timeout=OBSERVE_TIMEOUT_S
            )
            paused = bool(r.json()["is_paused"])
        return Obs(
            t, i, True, str(info["weights_id"]), info.get("unclean"), bool(info["updating"]), paused
        )

    async def monitor(self) -> None:
        while not self.stopping.is_set():
            self.log.obs += await asyncio.gather(*(self.observe(i) for i in range(NODES)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.cfg.monitor_every_s)

    async def sample_rss(self) -> None:
        while not self.stopping.is_set():
            now = time.monotonic()
            for name, server in self.stack.servers().items():
                for p in _processes(server):
                    with contextlib.suppress(psutil.Error):
                        key = f"{name} {p.name()} ({p.pid})"
                        self.log.rss.setdefault(key, []).append((now, float(p.memory_info().rss)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 2.0)

    # -- the nemesis -------------------------------------------------------------------------

    async def nemesis(self, until: float) -> None:
        rng = random.Random(f"{self.cfg.seed}-nemesis")
        busy: set[int] = set()
        tasks: list[asyncio.Task[None]] = []
        killing = False
        while True:
            await asyncio.sleep(rng.uniform(*self.cfg.fault_gap_s))
            if time.monotonic() >= until:
                break
            kind = rng.choice(FAULT_KINDS)
            node = rng.randrange(NODES)
            # One fault per node at a time, one node restarting at a time (memory).
            if node in busy or (kind == "kill" and killing):
                continue
            fault = Fault(kind, node, time.monotonic())
            self.log.faults.append(fault)
            busy.add(node)
            killing = killing or kind == "kill"

            # Each fault's own draws: the same whatever the timing made of the others.
            draws = random.Random(f"{self.cfg.seed}-fault-{len(self.log.faults)}")

            async def run(fault: Fault = fault, draws: random.Random = draws) -> None:
                nonlocal killing
                try:
                    await self.inject(fault, draws)
                finally:
                    fault.end = fault.end or time.monotonic()
                    busy.discard(fault.node)
                    killing = killing and fault.kind != "kill"
                    self.say(f"healed: {fault.kind} on node {fault.node}")

            tasks.append(asyncio.ensure_future(run()))
        await asyncio.gather(*tasks)
        self.log.last_heal = max((f.end or 0.0 for f in self.log.faults), default=None)

    async def inject(self, fault: Fault, rng: random.Random) -> None:
        i, proxy = fault.node, self.proxies[fault.node]
        node_timeout = self.cfg.node_timeout_s
        if fault.kind == "kill":
            fault.detail = "SIGKILL, then restarted"
            self.say(f"fault: SIGKILL node {i}")
            os.killpg(self.stack.nodes[i].proc.pid, signal.SIGKILL)
            proxy.node_down()
            new = await asyncio.to_thread(self.stack.restart, i)
            proxy.upstream_port = new.port
        elif fault.kind == "stop":
            seconds = rng.uniform(1.0, 2.5 * node_timeout)
            fault.detail = f"SIGSTOP for {seconds:.1f}s"
            self.say(f"fault: SIGSTOP node {i} for {seconds:.1f}s")
            pid = self.stack.nodes[i].proc.pid
            os.killpg(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(seconds)
            finally:
                os.killpg(pid, signal.SIGCONT)
        elif fault.kind == "partition":
            seconds, drop = rng.uniform(1.0, 2.5 * node_timeout), rng.random() < 0.5
            fault.detail = f"black hole for {seconds:.1f}s, then {'lost' if drop else 'late'}"
            self.say(f"fault: node {i} {fault.detail}")
            proxy.black_hole()
            await asyncio.sleep(seconds)
            proxy.heal(drop=drop)
        elif fault.kind == "delay":
            each, seconds = rng.uniform(0.05, 0.6), rng.uniform(2.0, 10.0)
            fault.detail = f"{each:.2f}s per read for {seconds:.1f}s"
            self.say(f"fault: node {i} delayed {fault.detail}")
            proxy.delay(each)
            await asyncio.sleep(seconds)
            proxy.heal()
        else:
            paths = rng.choice(CUTS)
            fault.detail = "cut " + " and ".join(paths)
            self.say(f"fault: node {i}: {fault.detail} (armed)")
            before = len(proxy.cuts)
            proxy.cut_next(*paths)
            deadline = time.monotonic() + 3 * self.cfg.update_every_s + self.cfg.read_timeout_s
            while len(proxy.cuts) - before < len(paths) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
                if len(proxy.cuts) > before and time.monotonic() > proxy.cuts[-1][0] + 10:
                    break  # the chunk was cut; its abort never came to be cut
            proxy.disarm()
            for t, path in proxy.cuts[before:]:
                self.log.cuts.append((t, i, path))

    # -- the whole run -----------------------------------------------------------------------

    async def go(self) -> None:
        cfg = self.cfg
        self.log.t0 = time.monotonic()
        self.say(f"seed {cfg.seed}: {cfg.seconds:.0f}s of faults, then recovery")
        background = [
            asyncio.ensure_future(self.monitor()),
            asyncio.ensure_future(self.sample_rss()),
            asyncio.ensure_future(self.trainer()),
            *(asyncio.ensure_future(self.clients(i)) for i in range(cfg.concurrency)),
        ]
        try:
            until = self.log.t0 + cfg.seconds
            if cfg.faults:
                await self.nemesis(until)
            else:
                await asyncio.sleep(cfg.seconds)
            self.say("the nemesis stopped; every fault healed")
            await asyncio.sleep(cfg.node_timeout_s + cfg.fence_poll_s + cfg.settle_s)
            self.updates_stop.set()
            await background[2]
            self.log.monitor_stopped = time.monotonic()
            self.stopping.set()
            await asyncio.gather(*background)
            # The end: every node must take an update and serve it.
            k = len(self.log.updates) + 1
            last = await self.update(k, B if k % 2 == 0 else A)
            await asyncio.sleep(2 * cfg.fence_poll_s)
            info = (await self.http.get(f"{self.door}/weight_info")).json()
            self.log.final_fenced = {n["url"]: n["reason"] for n in info.get("nodes", [])}
            if not last.ok:
                self.log.final_fenced["the last update"] = "failed with every fault healed"
            for kind in KINDS:
                for key in sorted(
                    k for k in self.prompts if k.startswith("chat") == ("chat" in kind)
                ):
                    await self.request(kind, key)
            await self.switch_continuations()
        finally:
            self.stopping.set()
            self.updates_stop.set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            self.log.end = time.monotonic()
            for i, proxy in enumerate(self.proxies):
                self.log.seen += [(t, i, rid) for t, rid in proxy.seen]
            if self.client is not None:
                await self.client.aclose()
            await self.http.aclose()


def _processes(server: ServerProcess) -> list[psutil.Process]:
    try:
        main = psutil.Process(server.proc.pid)
        children = main.children(recursive=True)
    except psutil.Error:
        return []
    return [main, *(c for c in children if "resource_tracker" not in " ".join(_cmdline(c)))]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


# -- reporting -------------------------------------------------------------------------------


@dataclass
class Report:
    seed: int
    seconds: float
    updates: int
    updates_ok: int
    requests: int
    by_status: dict[str, int]
    faults: dict[str, int]
    cuts: int
    coverage: dict[str, Coverage]
    """How many judgements each invariant that needs the nodes' states made, and why it
    skipped the others (``Skip``)."""
    violations: list[str]


def report_of(run: Run) -> Report:
    log = run.log
    by_status: dict[str, int] = {}
    for op in log.ops:
        by_status[str(op.status)] = by_status.get(str(op.status), 0) + 1
    faults: dict[str, int] = {}
    for f in log.faults:
        faults[f.kind] = faults.get(f.kind, 0) + 1
    checker = Checker(log, run.expected, run.cfg)
    violations = checker.all()
    return Report(
        seed=log.seed,
        seconds=log.end - log.t0,
        updates=len(log.updates),
        updates_ok=sum(u.ok for u in log.updates),
        requests=len(log.ops),
        by_status=by_status,
        faults=faults,
        cuts=len(log.cuts),
        coverage=checker.coverage,
        violations=violations,
    )


def print_report(report: Report, out: Path | None = None) -> None:
    print(f"\nchaos seed {report.seed}: {report.seconds:.0f}s")
    print(f"updates: {report.updates} ({report.updates_ok} answered 200 at every step)")
    print(f"requests: {report.requests}, by status {report.by_status}")
    print(f"faults injected: {report.faults} ({report.cuts} requests cut)")
    for name, cover in report.coverage.items():
        print(f"{name}: {cover.describe()}")
    if out is not None:
        print(f"log: {out}")
    if not report.violations:
        print("invariant violations: 0\nPASS")
        return
    print(f"invariant violations: {len(report.violations)}")
    for v in report.violations[:40]:
        print(f"  {v}")
    print(f"FAIL (seed {report.seed}; replay with --seed {report.seed})")


def write_log(run: Run, report: Report) -> Path:
    run.cfg.out.mkdir(parents=True, exist_ok=True)
    path = run.cfg.out / f"chaos-{run.cfg.seed}.json"
    doc = {
        "report": asdict(report),
        "expected": asdict(run.expected),
        "log": asdict(run.log),
    }
    path.write_text(json.dumps(doc, indent=1, default=str))
    return path


async def chaos(cfg: ChaosConfig, model: str | None = None) -> Report:
    """Start the stack, run the nemesis against it, check, stop."""
    stack = Stack(cfg, model or str(ensure_model("qwen2-vl")))
    proxies: list[FaultProxy] = []
    try:
        stack.start_nodes()
        for i, node in enumerate(stack.nodes):
            proxies.append(FaultProxy(f"generate{i}", node.port))
            await proxies[-1].start()
        stack.start_door([p.url for p in proxies])
        await asyncio.to_thread(stack.wait_healthy)
        run = Run(cfg, stack, proxies)
        await run.prepare()
        await run.go()
        report = report_of(run)
        print_report(report, write_log(run, report))
        return report
    finally:
        for proxy in proxies:
            await proxy.close()
        await asyncio.to_thread(stack.stop)


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--seconds", type=float, default=ChaosConfig.seconds, help="faults for this long"
    )
    p.add_argument(
        "--seed", type=int, default=None, help="the nemesis's seed (default: random, printed)"
    )
    p.add_argument("--concurrency", type=int, default=ChaosConfig.concurrency, help="client loops")
    p.add_argument(
        "--update-every",
        type=float,
        default=ChaosConfig.update_every_s,
        help="seconds between weight updates",
    )
    p.add_argument(
        "--no-faults",
        action="store_true",
        help="the same run without a nemesis (checks the harness)",
    )
    p.add_argument(
        "--node-timeout-s",
        type=float,
        default=ChaosConfig.node_timeout_s,
        help="the door's and the client's",
    )
    p.add_argument(
        "--fence-poll-s", type=float, default=ChaosConfig.fence_poll_s, help="the door's"
    )
    p.add_argument("--out", type=Path, default=ChaosConfig.out, help="where the run's log goes")
    p.add_argument("--model", help="model folder (default: the tiny Qwen2-VL)")
    args = p.parse_args(list(argv) if argv is not None else None)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    cfg = ChaosConfig(
        seconds=args.seconds,
        seed=seed,
        concurrency=args.concurrency,
        update_every_s=args.update_every,
        faults=not args.no_faults,
        node_timeout_s=args.node_timeout_s,
        fence_poll_s=args.fence_poll_s,
        out=args.out,
    )
    print(f"chaos seed {seed}", flush=True)
    report = asyncio.run(chaos(cfg, args.model))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())

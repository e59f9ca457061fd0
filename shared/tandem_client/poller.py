"""What one router knows of its generate nodes' weights, and the one loop that keeps it fresh:
the front door's workers and ``tandem_client`` each own a ``FleetPoller`` (neither keeps its
own), so a fix to how answers are asked, ordered and learnt lands in both.

The rules it applies are ``tandem_client.fleet``'s; this is where they are driven from: the
first round before anything is served, a round every ``fence_poll_s`` (sooner while a node is
fenced), the answers a caller asks for itself, and the highest update SEQ the router knows of.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from tandem_wire.control import UpdateId

from . import fleet
from .fleet import Ask, FleetView, Node, NodeAnswer

__all__ = ["FleetPoller", "RECHECK_FIRST_S", "watch"]

log = logging.getLogger("tandem.fleet")

N = TypeVar("N", bound=Node)

RECHECK_FIRST_S = 0.1
"""How soon a router asks the nodes again after it saw one fenced; the wait doubles while one
still is, up to the poll period."""


class FleetPoller(Generic[N]):
    """The generate nodes ``nodes()`` returns (the caller's own, which discovery may change),
    judged by their ``/weight_info`` answers through ``ask`` (one call to one node, which cools
    a node that cannot be reached down). ``learnt(node)`` is told of every answer (or failure)
    as it is taken."""

    def __init__(
        self,
        ask: Ask,
        nodes: Callable[[], Sequence[N]],
        node_timeout_s: float,
        fence_poll_s: float,
        learnt: Callable[[Node], None] | None = None,
    ) -> None:
        self._ask = ask
        self._nodes = nodes
        self.node_timeout_s = node_timeout_s
        self.fence_poll_s = fence_poll_s
        self._on_learnt = learnt
        self.seq_mark = 0
        """The highest update SEQ this router minted or was told (``fleet.next_seq_mark``):
        it outlives nodes that leave or restart."""
        self._wake = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    @property
    def started(self) -> bool:
        return self._watch is not None

    async def start(self) -> None:
        """Ask every node what it holds, waiting until each answered or its ask timed out
        (nothing is served before: no node has told), then keep asking in the background."""
        await fleet.poll(self._ask, self._nodes(), learnt=self._learnt)
        self._watch = asyncio.ensure_future(watch(self._round, self.fence_poll_s, self._wake))

    async def aclose(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await stop_polls(self._nodes())

    def view(self) -> FleetView:
        """The fleet as judged now (``fleet.judge``)."""
        return fleet.judge(self._nodes(), time.monotonic(), self.node_timeout_s)

    def taking_part(self) -> list[N]:
        """The nodes an update's start goes to (``fleet.taking_part``)."""
        return fleet.taking_part(self._nodes(), time.monotonic(), self.node_timeout_s)

    async def refresh(self) -> None:
        """Every node asked what it holds, each answer learnt as it arrives; waits at most
        ``fence_poll_s`` for the nodes that answer, so a hung node holds no round and no
        update step (it keeps what it last told until its ask times out, and leaves the
        fleet once unreachable past the node timeout). A node already unreachable is asked
        but not waited for; one whose ask is still in flight is not asked again."""
        nodes = self._nodes()
        answering = [n for n in nodes if n.unreachable_since is None]
        await fleet.poll(self._ask, nodes, 0.0, self._learnt)
        await fleet.poll(self._ask, answering, self.fence_poll_s, self._learnt)

    async def ask_now(self, nodes: Sequence[Node]) -> list[NodeAnswer]:
        """``nodes`` asked what they hold now, past the one-ask-at-a-time guard (a caller
        wants these answers themselves); learnt as every answer is (the newest by ask time
        is kept, whatever order they arrive in)."""
        asked_at = time.monotonic()
        answers = await fleet.ask_each(self._ask, nodes, "GET", fleet.WEIGHT_INFO_PATH)
        self.learn(nodes, answers, asked_at)
        return answers

    def learn(self, nodes: Sequence[Node], answers: Sequence[NodeAnswer], asked_at: float) -> None:
        """``/weight_info`` answers to asks sent at ``asked_at`` (monotonic), learnt."""
        for node, answer in zip(nodes, answers, strict=True):
            node.heard_from(answer, asked_at)
            self._learnt(node)

    def minted(self, update_id: UpdateId | None) -> None:
        """An update id this router minted (``StepResult.update_id``): the next is above it."""
        if update_id is not None:
            self.seq_mark = max(self.seq_mark, update_id.seq)

    async def _round(self) -> bool:
        """One round of the watch; True when a node is fenced (not merely unreachable)."""
        await self.refresh()
        return fenced_now(self.view(), self._nodes())

    def _learnt(self, node: Node) -> None:
        """A node's answer (or failure) was just taken: every SEQ told goes into the mark, and
        a node fenced now has the watch ask again soon."""
        self.seq_mark = fleet.next_seq_mark(self.seq_mark, [node])
        if fenced_now(self.view(), [node]):
            self._wake.set()
        if self._on_learnt is not None:
            self._on_learnt(node)


def fenced_now(view: FleetView, nodes: Sequence[Node]) -> bool:
    """Whether one of ``nodes`` is fenced, not merely unreachable (the watch asks again soon)."""
    return any(view.reasons.get(n.url) not in (None, fleet.UNREACHABLE) for n in nodes)


async def stop_polls(nodes: Sequence[Node]) -> None:
    """Cancel the ``/weight_info`` asks still in flight (the router is closing)."""
    tasks = [n.polling for n in nodes if n.polling is not None and not n.polling.done()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def watch(
    refresh: Callable[[], Awaitable[bool]], period_s: float, wake: asyncio.Event
) -> None:
    """Judge the fleet every ``period_s`` until cancelled: ``refresh()`` asks the nodes and
    says whether one is fenced (not merely unreachable); ``wake`` set asks again at once. A
    read that falls inside a fleet update (one node finished, the other not yet) fences the
    slower node; asking again soon, and less often while one is still fenced, lets it back in
    once the update has reached it."""
    backoff: float | None = None
    while True:
        wake.clear()
        try:
            fenced = await refresh()
        except Exception:  # fencing must outlive one bad round
            log.exception("asking the generate nodes their weights failed; asking again")
            fenced = False
        if fenced or wake.is_set():
            backoff = RECHECK_FIRST_S if backoff is None else 2 * backoff
            await asyncio.sleep(min(backoff, period_s))
            continue
        backoff = None
        # Not asyncio.wait_for: on Python 3.11 it swallows a cancel that lands as the event
        # is set (a request that fenced a node just before shutdown), and the router hangs.
        woken = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({woken}, timeout=period_s)
        finally:
            woken.cancel()

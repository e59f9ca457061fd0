"""Keeps the door's node lists in step with their DNS names."""

from __future__ import annotations

import asyncio
import logging

from tandem_client.discovery import NodeSource, Resolve, hosts_file_resolver

from .upstreams import Upstreams

__all__ = ["NodeWatch"]

log = logging.getLogger("tandem.front.discovery")


class NodeWatch:
    """Looks the tiers' ``dns+http://`` names up every ``discovery_interval_s`` and hands the
    node sets to ``Upstreams.set_nodes``. A generate node that joins gets inference work only
    once it holds the fleet's weights (``tandem_client.fleet.judge``): it is asked at once,
    and until it has answered it serves nothing.

    The door does not replay the fleet's past weight updates to a new node: an update may hold
    part of the model (the fleet's weights are every update since the base, in order), updates
    may bypass the door (tandem_client sends them to the nodes), each door worker sees only
    the calls it served, and tandem_client deletes the update's file once the nodes copied it.
    A fenced node gets control calls like the others, so the trainer's next update of every
    tensor (TRL's sends every parameter) brings it level. With a collective backend (NCCL) a
    node found after the trainer's ``/init_weight_transfer_engine`` has no place in the
    trainer's group: it stays fenced (``weight_transfer_not_initialized``) until the trainer
    sets the group up again with it counted (TRL: a new ``init_communicator``).
    """

    def __init__(self, upstreams: Upstreams, resolve: Resolve | None = None) -> None:
        s = upstreams.settings
        if resolve is None and s.discovery_hosts_file:
            resolve = hosts_file_resolver(s.discovery_hosts_file)
        self.upstreams = upstreams
        self.interval_s = s.discovery_interval_s
        self.sources = {
            tier: NodeSource(specs, interval_s=s.discovery_interval_s, resolve=resolve)
            for tier, specs in (("render", s.render_urls), ("generate", s.generate_urls))
        }

    @property
    def dynamic(self) -> bool:
        return any(src.dynamic for src in self.sources.values())

    async def refresh(self) -> None:
        """Resolve the names once and update the node lists; new and fenced generate nodes
        are asked what they hold (a new one serves nothing until it has answered)."""
        ask = False
        for tier, source in self.sources.items():
            if source.dynamic and await source.refresh():
                joined = self.upstreams.set_nodes(tier, source.urls)
                ask = ask or (tier == "generate" and bool(joined))
        if ask or self.upstreams.view().fenced(self.upstreams.generate):
            await self.upstreams.poller.refresh()

    async def run(self) -> None:
        """``refresh`` every ``discovery_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:  # the loop must outlive one bad round
                log.exception("node discovery round failed")

"""Keeps the door's node lists in step with their DNS names, and new generate nodes out of
inference work until they carry the fleet's weight version."""

from __future__ import annotations

import asyncio
import logging

from tandem_client.discovery import Admission, NodeSource, Resolve, hosts_file_resolver
from tandem_client.fleet import told_versions

from .upstreams import Upstreams

__all__ = ["NodeWatch"]

log = logging.getLogger("tandem.front.discovery")


class NodeWatch:
    """Looks the tiers' ``dns+http://`` names up every ``discovery_interval_s`` and hands the
    node sets to ``Upstreams.set_nodes``; a generate node that joins later than the first set
    is not admitted (``Node.admitted``) until it reports the weight version the admitted nodes
    agree on (``tandem_client.discovery.Admission``).

    The door does not replay the fleet's last weight update to a new node: an update may hold
    part of the model (the fleet's weights are every update since the base, in order), updates
    may bypass the door (tandem_client sends them to the nodes), each door worker sees only
    the calls it served, and tandem_client deletes the update's file once the nodes copied it.
    A pending node gets control calls like the others, so the trainer's next update (TRL's
    sends every parameter) brings it level.
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
        self.admission = Admission()
        self.admission.nodes_changed(n.url for n in upstreams.generate)

    @property
    def dynamic(self) -> bool:
        return any(src.dynamic for src in self.sources.values())

    async def refresh(self) -> None:
        """Resolve the names once, update the node lists, admit pending nodes at the fleet's
        weight version."""
        for tier, source in self.sources.items():
            if source.dynamic and await source.refresh():
                self.upstreams.set_nodes(tier, source.urls)
                if tier == "generate":
                    self.admission.nodes_changed(source.urls)
                    self._mark()  # before any await: a new node takes no request meanwhile
        if self.admission.pending:
            # The fencing poll's own request: it also refreshes what fencing knows.
            self.admission.check(told_versions(await self.upstreams.refresh_versions()))
            self._mark()

    def _mark(self) -> None:
        for node in self.upstreams.generate:
            node.admitted = self.admission.admitted(node.url)

    async def run(self) -> None:
        """``refresh`` every ``discovery_interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:  # the loop must outlive one bad round
                log.exception("node discovery round failed")

"""vLLM's scheduler with the multimodal data of every new request sent to the workers whole.

vLLM 0.32's scheduler drops the tensors of items a request's prefix-cache hit covers before it
hands the request to the workers (``strip_covered_mm_data``): those items are never encoded
for it at that point. But the workers keep that stripped copy for the request's whole life,
and a request that is preempted and resumed recomputes from a prefix it may no longer have:

- a weight update resets the prefix and encoder caches with the running requests preempted
  (ours, and vLLM's own ``pause_generation(clear_cache=True)``);
- or, under KV pressure, the preempted request's blocks are evicted.

The scheduler then sends the item to be encoded, the worker holds no pixels for it, the model
returns no embedding and vLLM's sanity check kills the engine core. Sending the items whole,
as vLLM did before that optimisation, costs one more copy of a prefix-hit request's tensors
into the workers; it is what lets a preempted request finish.

The engine core imports this module by name (``scheduler_cls``), in its own process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

__all__ = ["WholeItemsAsyncScheduler", "WholeItemsScheduler", "whole_items_scheduler"]


def _items_whole(scheduler: Scheduler, output: SchedulerOutput) -> SchedulerOutput:
    for new in output.scheduled_new_reqs:
        # The scheduler's own request keeps the full features (vLLM strips a copy).
        new.mm_features = scheduler.requests[new.req_id].mm_features
    return output


class WholeItemsScheduler(Scheduler):
    """vLLM's synchronous scheduler, new requests sent with their items whole."""

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        return _items_whole(self, super().schedule(throttle_prefills))


class WholeItemsAsyncScheduler(AsyncScheduler):
    """vLLM's asynchronous scheduler (GPU builds' default), the same change."""

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        return _items_whole(self, super().schedule(throttle_prefills))


def whole_items_scheduler(async_scheduling: bool) -> str:
    """The qualified name the engine core resolves (a name: the config crosses processes)."""
    cls = WholeItemsAsyncScheduler if async_scheduling else WholeItemsScheduler
    return f"{cls.__module__}.{cls.__qualname__}"

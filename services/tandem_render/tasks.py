"""A request's concurrent work, owned by the request: when one part fails the others stop
before it answers, and work handed to a thread is waited for (its memory is the request's
until the thread returns, whatever happened to the request)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

__all__ = ["all_or_none", "in_thread"]

T = TypeVar("T")


async def all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Every result, in order. The first failure cancels the rest and is raised as it is (a
    typed refusal stays one) once they have all stopped: a failed request no longer fetches
    on to its timeout, holding bytes charged to a slot it gave back (``asyncio.gather`` leaves
    the others running)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(_awaited(w)) for w in work]
    except BaseExceptionGroup as failed:
        raise _first(failed) from None
    return [t.result() for t in tasks]


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread. Cancelled, it still waits for the thread to return
    before it gives up: a thread cannot be stopped, and what it allocates stays charged to the
    request (whose slot is released only after this returns) until it has."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait([work])
        if not work.cancelled():
            work.exception()  # retrieved: a failure after the cancel is not news
        raise


async def _awaited(work: Awaitable[T]) -> T:
    return await work


def _first(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first

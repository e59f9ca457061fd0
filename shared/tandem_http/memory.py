"""A server process's memory: keep what it frees, fault in its cache budget once at start-up,
and keep the cyclic garbage collector looking at request objects rather than start-up ones."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MAX_PRETOUCH", "keep_freed_memory", "pretouch", "startup_objects_frozen"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks above this still get their own mapping (returned at once when freed): a rare huge
# request should not pin its memory for the worker's life.
_MMAP_THRESHOLD = 256 * 1024 * 1024
_TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int
_CHUNK = 16 * 1024 * 1024
# A free region larger than the trim threshold would be handed back at once.
MAX_PRETOUCH = 1024 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Ask glibc to reuse freed blocks instead of handing them back to the kernel.

    Each request allocates and frees megabytes (pixels, patches, item bytes). By default
    glibc serves such blocks with fresh mappings or trims the heap after them, so the next
    request faults in zeroed pages again; on the VMs we measured on, that was 3-10 ms of CPU
    per first-seen image. Returns False where the C library is not glibc (nothing changed).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    return bool(ok)


def pretouch(nbytes: int) -> float:
    """Fault in ``nbytes`` of heap now and free it back to the allocator, which keeps it.

    The caches fill up to their byte budgets anyway; paying for those pages at start-up keeps
    the cost out of the first requests (the JVM's AlwaysPreTouch, for the same reason).
    At most :data:`MAX_PRETOUCH` bytes. Returns the seconds it took. Only useful after
    :func:`keep_freed_memory` succeeded.
    """
    start = time.perf_counter()
    # Chunks below the mmap threshold come from the heap; freed together they merge into one
    # free region that later allocations reuse.
    chunks = [bytearray(_CHUNK) for _ in range(max(0, min(nbytes, MAX_PRETOUCH)) // _CHUNK)]
    del chunks
    return time.perf_counter() - start


@contextmanager
def startup_objects_frozen() -> Iterator[int]:
    """While open, every object alive at its start is out of the cyclic collector's view; gives
    the number frozen. A server's lifespan opens it once start-up is done.

    A server holds millions of long-lived objects from start-up (torch, vLLM, the tokenizer),
    and CPython runs a full collection only when the objects promoted since the last one reach
    a quarter of those. Request-scoped cycles (httpx's and anyio's requests, responses and
    cancelled waits, holding megabyte bodies) outlive a few young collections, reach the oldest
    generation and then waited minutes for a full pass: the front door's RSS grew by tens of
    MiB a minute under load. Frozen, the start-up objects no longer count (nor are they
    walked), so full passes come often and cost little. Closed (an app's shutdown, in tests
    many per process), they are collectable again.
    """
    gc.collect()  # start-up garbage is freed, not frozen
    gc.freeze()
    # A full pass over what is left (nearly nothing) resets the count a full pass waits for.
    gc.collect()
    try:
        yield gc.get_freeze_count()
    finally:
        gc.unfreeze()

"""Per-node NCCL ranks: each generate node's workers get their own ranks in the trainer's group.

A trainer sends one ``/init_weight_transfer_engine`` body whose ``init_info.rank_offset`` is the
first worker rank and ``world_size`` the whole group (trainer ranks plus every worker). vLLM
gives a worker the rank ``its own rank on the node + rank_offset``, so the same body on every
node puts every node's worker 0 on the same rank and the rendezvous hangs. The door gives node
``i`` (in the configured order of ``--generate`` URLs) the offset ``rank_offset + world sizes of
nodes 0..i-1``; ``world_size`` and every other key pass through as the caller sent them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tandem_http import BadRequest

__all__ = ["rank_offsets", "ranked_init", "per_node_bodies"]


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def ranked_init(body: bytes) -> dict[str, Any] | None:
    """The parsed body when it asks for ranks (``init_info.rank_offset`` is present, as the
    NCCL backends' set-up has it), else None: the body goes to every node unchanged (file or
    IPC set-up, or a body the nodes will refuse themselves)."""
    try:
        doc: dict[str, Any] = json.loads(body)
    except ValueError:
        return None
    except RecursionError:
        raise BadRequest("the body nests too deeply") from None
    info = doc.get("init_info") if isinstance(doc, dict) else None
    if not isinstance(info, dict) or "rank_offset" not in info:
        return None
    for key in ("rank_offset", "world_size"):
        if not _int(info.get(key)):
            raise BadRequest(
                f"init_info.{key} must be a non-negative integer, got {info.get(key)!r}",
                param=f"init_info.{key}",
            )
    return doc


def rank_offsets(first: int, world_sizes: Sequence[int]) -> list[int]:
    """Each node's first worker rank: ``first`` plus the world sizes of the nodes before it."""
    offsets, at = [], first
    for size in world_sizes:
        offsets.append(at)
        at += size
    return offsets


def per_node_bodies(
    doc: dict[str, Any], urls: Sequence[str], world_sizes: Sequence[int]
) -> list[bytes]:
    """The body each node gets (``world_sizes`` in the nodes' order, asked just now); a group
    too small for the ranks the nodes' workers need is refused before anything is sent."""
    info = doc["init_info"]
    first, group = info["rank_offset"], info["world_size"]
    needed = first + sum(world_sizes)
    if needed > group:
        sizes = ", ".join(f"{u}: {s}" for u, s in zip(urls, world_sizes, strict=True))
        raise BadRequest(
            f"init_info.world_size {group} is too small: the generate nodes' workers ({sizes}) "
            f"need ranks {first}..{needed - 1} after rank_offset {first}",
            param="init_info.world_size",
            details={"needed": needed, "world_sizes": dict(zip(urls, world_sizes, strict=True))},
        )
    return [
        json.dumps({**doc, "init_info": {**info, "rank_offset": offset}}).encode()
        for offset in rank_offsets(first, world_sizes)
    ]

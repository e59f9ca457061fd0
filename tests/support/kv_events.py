"""What an llm-d scheduler does with a node's KV-cache events: subscribe to them (vLLM's own
``KVEventBatch`` over ZMQ, as ``--kv-events-config`` publishes it) and compute a rendered
prompt's block keys with vLLM's own hashing, from render's answer alone."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils

from tools.servers import free_port

BLOCK_SIZE = 32
"""The nodes' ``--block-size`` (the EPP's blockSizeTokens). The llm-d manifests give GPU pods
16; vLLM's CPU attention takes multiples of 32 only."""

HASH_ALGO = "sha256_cbor"
"""The prefix-caching hash an llm-d scheduler computes (generate's --prefix-caching-hash-algo)."""


def kv_event_args(endpoint: str, topic: str) -> list[str]:
    """A node's options for publishing its KV events as the llm-d manifests have it."""
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "topic": topic,
    }
    return [
        "--kv-events-config",
        json.dumps(config),
        "--block-size",
        str(BLOCK_SIZE),
        "--prefix-caching-hash-algo",
        HASH_ALGO,
    ]


def local_endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@dataclass(frozen=True)
class Item:
    """One item of a rendered prompt as a scheduler reads it: its name and placeholder range."""

    name: str
    offset: int
    length: int


def items_of(rendered: dict[str, Any]) -> list[Item]:
    """The items of a render answer (JSON) in prompt order."""
    feats = rendered.get("features") or {}
    found = [
        Item(name, r["offset"], r["length"])
        for modality, names in (feats.get("mm_hashes") or {}).items()
        for name, r in zip(names, feats["mm_placeholders"][modality], strict=True)
    ]
    return sorted(found, key=lambda i: i.offset)


@dataclass(frozen=True)
class Block:
    """One full block of a prompt as a scheduler keys it."""

    event_hash: int
    """The hash a ``BlockStored`` event carries for it (vLLM's external form)."""
    items: tuple[str, ...]
    """Names of the items it overlaps."""
    extra_keys: Any
    """Its extra keys as an event carries them (untagged, through msgpack)."""


def block_keys(
    token_ids: list[int], items: list[Item], cache_salt: str | None = None
) -> list[Block]:
    """Each full block of a prompt, chained as vLLM's prefix cache does: each block's extra
    keys hold ``("mm", name, offset in block)`` of the items it overlaps, and block 0 the
    cache salt."""
    hash_fn = get_hash_fn_by_name(HASH_ALGO)
    kv_cache_utils.init_none_hash(hash_fn)
    blocks: list[Block] = []
    parent = None
    for start in range(0, len(token_ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        end = start + BLOCK_SIZE
        over = [i for i in items if start < i.offset + i.length and i.offset < end]
        extra: list[Any] = [("mm", i.name, i.offset - start) for i in over]
        if start == 0 and cache_salt:
            extra.append(("cache_salt", cache_salt))
        tagged = tuple(extra) or None
        parent = kv_cache_utils.hash_block_tokens(hash_fn, parent, token_ids[start:end], tagged)
        (untagged,) = kv_cache_utils.to_event_extra_keys([tagged]) or [None]
        blocks.append(
            Block(
                kv_cache_utils.maybe_convert_block_hash(parent),
                tuple(i.name for i in over),
                as_sent(untagged),
            )
        )
    return blocks


@dataclass
class Subscriber:
    """A ZMQ SUB socket on a node's KV events, decoding vLLM's ``KVEventBatch``. It binds
    ``endpoint`` (on 127.0.0.1) and the node's publisher connects to it, as vLLM's publisher
    does for any endpoint without a wildcard; the EPP instead dials pods that bind ``*:5557``."""

    endpoint: str
    topic: str = "kv@"
    stored: dict[int, BlockStored] = field(default_factory=dict)
    """Every block stored so far, by its event hash."""

    def __post_init__(self) -> None:
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.bind(self.endpoint)
        self._socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)

    def close(self) -> None:
        self._socket.close(linger=0)

    def wait_for(self, block_hash: int, timeout_s: float = 60.0) -> bool:
        """Reads events until one stores ``block_hash`` (True) or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while block_hash not in self.stored:
            left = deadline - time.monotonic()
            if left <= 0 or not self._socket.poll(int(left * 1000)):
                return False
            _topic, _seq, payload = self._socket.recv_multipart()
            for event in self._decoder.decode(payload).events:
                if isinstance(event, BlockStored):
                    for h, keys in zip(event.block_hashes, _extra_keys(event), strict=True):
                        self.stored[h] = _one_block(event, h, keys)
        return True

    def extra_keys(self, block_hash: int) -> Any:
        """The stored block's extra keys, in msgpack's own shapes (lists for tuples)."""
        return as_sent(_extra_keys(self.stored[block_hash])[0])

    def connected(self, post: Callable[[str], int], attempts: int = 60) -> None:
        """Waits out ZMQ's slow joiner: ``post(text)`` makes the node store a new prompt's
        blocks and gives the last one's hash, until the events of one reach this socket."""
        for attempt in range(attempts):
            if self.wait_for(post(f"warm-up {attempt}: " + "lorem ipsum " * 8), timeout_s=1.0):
                return
        raise AssertionError(f"no KV events from {self.endpoint} after {attempts} prompts")


def _extra_keys(event: BlockStored) -> list[tuple[Any, ...] | None]:
    return list(event.extra_keys or [None] * len(event.block_hashes))


def _one_block(event: BlockStored, block_hash: int, keys: tuple[Any, ...] | None) -> BlockStored:
    return msgspec.structs.replace(event, block_hashes=[block_hash], extra_keys=[keys])


def as_sent(keys: Any) -> Any:
    """``keys`` as msgpack carries them: tuples become lists."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(keys))

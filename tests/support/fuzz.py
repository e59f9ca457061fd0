"""A seeded, bounded mutation fuzzer for JSON request documents, and generated hostile ones."""

from __future__ import annotations

import copy
import io
import json
import random
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_ODD_STRINGS = ["", "\x00", "é" * 3, "a" * 5000, "data:image/png;base64,AAAA", "../../etc/passwd"]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:8]):
            out += _paths(v, (*prefix, i))
    return out


def _odd_value(rng: random.Random) -> Any:
    kind = rng.randrange(10)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64, 10**30])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e308, 1e-320])
    if kind == 3:
        return rng.choice(_ODD_STRINGS)
    if kind == 4:
        return rng.choice([True, False])
    if kind == 5:
        return []
    if kind == 6:
        return {}
    if kind == 7:
        deep: Any = 1
        for _ in range(rng.choice([3, 50, 400])):
            deep = [deep]
        return deep
    if kind == 8:
        return [rng.randrange(-5, 200_000) for _ in range(rng.choice([1, 10, 3000]))]
    return {"x" * rng.randrange(1, 50): rng.randrange(10)}


def mutations(seed_doc: dict[str, Any], seed: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` mutants of ``seed_doc``: values replaced, keys dropped or added, 1-3 at once."""
    rng = random.Random(seed)
    for _ in range(count):
        doc = copy.deepcopy(seed_doc)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(_paths(doc))
            if not path:
                doc[rng.choice(["zzz", "features", "sampling_params", "messages"])] = _odd_value(
                    rng
                )
                continue
            parent = doc
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict) and rng.random() < 0.2:
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = _odd_value(rng)
        yield doc


def keep_crash(name: str, doc: Any, answer: str) -> Path:
    """Write a crashing input where a regression test can pick it up, and return its path."""
    folder = Path(__file__).resolve().parents[1] / "fuzz_crashes"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}-{abs(hash(json.dumps(doc, sort_keys=True, default=str))):x}.json"
    path.write_text(json.dumps({"input": doc, "answer": answer[:2000]}, default=str))
    return path


def solid_pngs(side: int, count: int) -> list[bytes]:
    """``count`` distinct PNGs of one ``side`` x ``side`` solid colour: a few hundred KB each
    however large ``side`` (an 8000x8000 one is ~200 KB, 192 MB decoded). Encoded once; each
    copy differs only by a text chunk, so its bytes (and every hash of them) are its own."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (side, side), (40, 90, 160)).save(buf, "PNG")
    png = buf.getvalue()
    header_end = 8 + 25  # signature, then the IHDR chunk
    copies = []
    for i in range(count):
        text = b"Comment\x00" + str(i).encode()
        chunk = struct.pack(">I", len(text)) + b"tEXt" + text
        chunk += struct.pack(">I", zlib.crc32(b"tEXt" + text))
        copies.append(png[:header_end] + chunk + png[header_end:])
    return copies

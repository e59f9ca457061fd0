"""The door and zstd generate bodies: a body is decoded only when the route-key header is
missing, off the event loop, so a crafted body never stalls the other requests; and the
hostile corpus gets typed answers while the door keeps serving."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

import tandem_http.body as http_body
from tandem_client.routing import ROUTE_KEY_HEADER
from tandem_front.app import create_app
from tests.support import zstd_bodies
from tests.support.asgi import app_client
from tests.support.fuzz import keep_crash
from tests.unit.front.test_front_routing import (
    LOGPROBS,
    Texts,
    fleet,
    generate_body,
    settings,
    winner,
)

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024
FUZZ_COUNT = int(os.environ.get("TANDEM_FUZZ_COUNT", "150"))
ZSTD_JSON = {"content-type": "application/json", "content-encoding": "zstd"}


class GatedDecode:
    """The one ``decode_body`` every service decodes bodies with (``tandem_http.decoded``),
    held until the test lets it go: a decode that runs off the event loop waits in its thread
    while other requests are served; one on the event loop holds every request until the gate
    gives up (``released`` then says False)."""

    GIVE_UP_S = 30.0

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started, self.gate = threading.Event(), threading.Event()
        self.released: list[bool] = []
        real = http_body.decode_body

        def decode(body: bytes, coding: str, max_bytes: int) -> bytes:
            self.started.set()
            self.released.append(self.gate.wait(self.GIVE_UP_S))
            return real(body, coding, max_bytes)

        monkeypatch.setattr(http_body, "decode_body", decode)

    async def wait_started(self) -> None:
        deadline = time.monotonic() + self.GIVE_UP_S
        while not self.started.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)


async def served_during(c, crafted: bytes, headers: dict, gated: GatedDecode) -> int:
    """Post ``crafted``; once its decode has begun (if it is decoded), a small generate is
    served before the gate lets that decode go on. Crafted's status is returned."""
    crafted_call = asyncio.ensure_future(
        c.post("/inference/v1/generate", content=crafted, headers=headers)
    )
    if headers.get(ROUTE_KEY_HEADER) is None:
        await gated.wait_started()
    small = await c.post("/inference/v1/generate", json=generate_body("small"))
    gated.gate.set()
    assert small.status_code == 200 and small.json() == {"node": winner("small", settings())}
    return (await crafted_call).status_code


@pytest.mark.parametrize(
    ("name", "status"),
    [("empty-raw-blocks", 200), ("empty-raw-blocks-declaring-1", 400), ("rle-bomb", 413)],
)
async def test_a_crafted_zstd_body_does_not_stall_other_requests(name, status, monkeypatch):
    # The Python block walk held the event loop for 3-6 s on these 32 MiB; now libzstd runs
    # in a worker thread (the RLE bomb inflates up to the 64 MiB cap there). The decode is
    # held until a small request has been served: on the event loop, it would hold that too.
    gated = GatedDecode(monkeypatch)
    s = settings(max_body_bytes=64 * MIB)
    async with app_client(create_app(s, Texts(), fleet())) as c:
        crafted_status = await served_during(
            c, zstd_bodies.CRAFTED[name](32 * MIB), ZSTD_JSON, gated
        )
    assert crafted_status == status
    assert gated.released == [True], "the decode held the event loop"


async def test_with_the_route_key_header_a_zstd_body_is_not_decoded_at_all(monkeypatch):
    # Not zstd at all: the door forwards it as sent to the key's node, which judges it.
    gated = GatedDecode(monkeypatch)
    s = settings()
    f = fleet()
    body = b"not a zstd frame " * 1000
    headers = {**ZSTD_JSON, ROUTE_KEY_HEADER: "key-7"}
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", content=body, headers=headers)
        crafted_status = await served_during(
            c, zstd_bodies.CRAFTED["empty-raw-blocks-declaring-1"](32 * MIB), headers, gated
        )
    assert r.status_code == 200 and r.json() == {"node": winner("key-7", s)}
    path, seen, sent = f.nodes[winner("key-7", s)].seen[0]
    assert (path, seen, sent["content-encoding"]) == ("/inference/v1/generate", body, "zstd")
    assert crafted_status == 200  # forwarded undecoded too: the node refuses it, not the door
    assert gated.released == [], "the door decoded a body it had the key of"


async def test_trl_requests_are_still_told_by_their_id_without_the_header():
    s = settings(generate_urls=("http://g1",), logprobs_format="auto")
    f = fleet()
    f.nodes["g1"].answer = LOGPROBS
    trl = json.dumps(generate_body("trl-0123")).encode()
    async with app_client(create_app(s, Texts(), f)) as c:
        plain = await c.post("/inference/v1/generate", content=trl)
        keyed = await c.post("/inference/v1/generate", content=trl, headers={ROUTE_KEY_HEADER: "k"})
    # Without the header the id is read (TRL's shape); the header marks a Tandem client.
    assert plain.json()["choices"][0]["logprobs"]["content"][0]["token"] == "token_id:5"
    assert keyed.content == json.dumps(LOGPROBS, separators=(",", ":")).encode()


async def test_hostile_zstd_bodies_get_typed_answers_and_the_door_keeps_serving():
    s = settings(max_body_bytes=4 * MIB)
    bodies = [
        *zstd_bodies.hostile(64 * 1024).values(),
        *zstd_bodies.mutants(seed=7, count=FUZZ_COUNT),
    ]
    seen: dict[int, int] = {}
    async with app_client(create_app(s, Texts(), fleet()), raise_app_exceptions=False) as c:
        for body in bodies:
            r = await c.post("/inference/v1/generate", content=body, headers=ZSTD_JSON)
            seen[r.status_code] = seen.get(r.status_code, 0) + 1
            if r.status_code >= 500 or r.status_code not in (200, 400, 413):
                path = keep_crash("front-zstd", body.hex(), r.text)
                pytest.fail(f"{r.status_code} for the input kept in {path}: {r.text[:300]}")
            if r.status_code != 200:
                assert r.json()["error"]["type"] in ("malformed_body", "payload_too_large")
        ok = await c.post("/inference/v1/generate", json=generate_body("after"))
    assert ok.status_code == 200
    print("door zstd fuzz: answers by status", dict(sorted(seen.items())))
    assert {400, 413} <= set(seen)

"""Node discovery: ``dns+http://`` specs, the resolvers, and tandem_client over a name whose
addresses change (a fake resolver; the nodes are an httpx.MockTransport)."""

from __future__ import annotations

import json

import httpx
import pytest

from tandem_client import AsyncTandemClient
from tandem_client.discovery import (
    NodeSource,
    hosts_file_resolver,
    node_url,
    parse_node_spec,
    system_resolve,
)
from tandem_wire import (
    GenerateChoice,
    GenerateRequest,
    GenerateResponse,
    WireFormat,
    encode_document,
)

pytestmark = pytest.mark.anyio

KEYS = [f"req-{i}" for i in range(40)]


def test_specs_and_urls():
    spec = parse_node_spec("dns+http://generate.ns.svc:8200/")
    assert (spec.name, spec.port, spec.scheme) == ("generate.ns.svc", 8200, "http")
    assert parse_node_spec("https://g").name is None and parse_node_spec("https://g").port == 443
    assert node_url("http", "10.1.2.3", 8200) == "http://10.1.2.3:8200"
    assert node_url("http", "fd00::7", 8200) == "http://[fd00::7]:8200"
    for bad in ("dns+https://g:1", "dns+http://g", "g:8200", "dns+http://g:1?x=1"):
        with pytest.raises(ValueError):
            parse_node_spec(bad)


async def test_the_system_resolver_gives_every_address():
    assert "127.0.0.1" in await system_resolve("localhost", 80)
    with pytest.raises(OSError):
        await system_resolve("no-such-name.invalid", 80)


async def test_a_hosts_file_is_read_at_each_lookup(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1 gen.test  # first\n10.0.0.9 other\n")
    source = NodeSource(["dns+http://gen.test:8200"], resolve=hosts_file_resolver(hosts))
    assert await source.refresh() and source.urls == ("http://10.0.0.1:8200",)
    hosts.write_text("10.0.0.1 gen.test\nfd00::2 x gen.test\n")
    assert await source.refresh()
    assert source.urls == ("http://10.0.0.1:8200", "http://[fd00::2]:8200")
    hosts.write_text("")  # no address: the last good set stays
    assert not await source.refresh() and len(source.urls) == 2


class Fleet:
    """Generate nodes by address (answering with their address), and DNS for ``gen.test``."""

    def __init__(self, versions: dict[str, str]) -> None:
        self.versions = versions
        self.answer = list(versions)
        self.generated: dict[str, list[str]] = {a: [] for a in versions}

    async def resolve(self, name: str, port: int) -> list[str]:
        return list(self.answer)

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": self.versions[host]})
        request_id = json.loads(request.content)["request_id"]
        self.generated.setdefault(host, []).append(request_id)
        resp = GenerateResponse(request_id=host, choices=[GenerateChoice(index=0, token_ids=[1])])
        return httpx.Response(
            200,
            content=encode_document(resp, WireFormat.JSON),
            headers={"content-type": "application/json"},
        )

    def client(self, source: NodeSource) -> AsyncTandemClient:
        return AsyncTandemClient(
            "http://render", source, binary=False, transport=httpx.MockTransport(self.handler)
        )


async def placement(c: AsyncTandemClient) -> dict[str, str]:
    out = {}
    for key in KEYS:
        r = await c.generate(GenerateRequest(token_ids=[1, 2], request_id=key))
        out[key] = r.request_id
    return out


async def test_the_client_follows_the_name_and_waits_for_a_new_node_s_weights():
    fleet = Fleet({"10.0.0.1": "v2", "10.0.0.2": "v2"})
    source = NodeSource(["dns+http://gen.test:8200"], interval_s=0.0, resolve=fleet.resolve)
    async with fleet.client(source) as c:
        before = await placement(c)
        assert set(before.values()) == {"10.0.0.1", "10.0.0.2"}

        fleet.versions["10.0.0.3"] = "base"  # a new pod, not updated yet
        fleet.answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        assert await placement(c) == before
        assert not fleet.generated.get("10.0.0.3")

        fleet.versions["10.0.0.3"] = "v2"
        after = await placement(c)
        moved = {k for k in KEYS if after[k] != before[k]}
        assert moved and {after[k] for k in moved} == {"10.0.0.3"}

        fleet.answer = ["10.0.0.1", "10.0.0.3"]  # 10.0.0.2 leaves
        served = len(fleet.generated["10.0.0.2"])
        last = await placement(c)
        assert len(fleet.generated["10.0.0.2"]) == served
        assert all(last[k] == after[k] for k in KEYS if after[k] != "10.0.0.2")
        assert c.generate_urls == ["http://10.0.0.1:8200", "http://10.0.0.3:8200"]

"""The nemesis's TCP proxy (tools/chaos_proxy.py) against a small HTTP server: what it lets
through, holds, loses, cuts and refuses is what the node behind it receives."""

from __future__ import annotations

import asyncio

import pytest

from tools.chaos_proxy import FaultProxy

pytestmark = pytest.mark.anyio


class Node:
    """A stand-in node: answers every whole request (head, then Content-Length bytes) with
    ``ok``, and keeps what it received whole."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.connections: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    def close_connections(self) -> None:
        """Its kernel closes what it holds open (a killed process's, once its memory is freed)."""
        for writer in self.connections:
            writer.transport.abort()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                self.received.append(head + body)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def request(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: n\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def send(port: int, data: bytes, wait_s: float = 5.0) -> bytes:
    """What comes back on a new connection (b"" when it is closed without an answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(1000), wait_s)
    except ConnectionError:
        return b""
    finally:
        writer.close()


@pytest.fixture
async def pair():
    node = Node()
    await node.start()
    proxy = FaultProxy("n", node.port)
    await proxy.start()
    yield node, proxy
    await proxy.close()
    await node.stop()


async def test_bytes_pass_and_request_ids_are_recorded(pair):
    node, proxy = pair
    body = b'{"request_id": "chq0000042"}'
    assert (await send(proxy.port, request("/inference/v1/generate", body))).endswith(b"ok")
    assert node.received == [request("/inference/v1/generate", body)]
    assert [rid for _, rid in proxy.seen] == ["chq0000042"]


async def test_a_cut_request_never_reaches_the_node_and_only_the_next_one_is_cut(pair):
    node, proxy = pair
    proxy.cut_next("/update_weights")
    chunk = request("/update_weights", b'{"update_info": {"path": "A-head.safetensors"}}')
    assert await send(proxy.port, chunk) == b""  # the caller gets no answer
    await asyncio.sleep(0.1)
    assert node.received == []
    assert [path for _, path in proxy.cuts] == ["/update_weights"]
    assert (await send(proxy.port, chunk)).endswith(b"ok")
    assert node.received == [chunk]


async def test_a_black_hole_holds_bytes_then_delivers_them_late_or_loses_them(pair):
    node, proxy = pair
    proxy.black_hole()
    late = asyncio.ensure_future(send(proxy.port, request("/a", b"1")))
    also_late = asyncio.ensure_future(send(proxy.port, request("/b", b"2")))
    await asyncio.sleep(0.5)
    assert not late.done() and node.received == []
    proxy.heal()
    assert (await late).endswith(b"ok") and (await also_late).endswith(b"ok")
    proxy.black_hole()
    dropped = asyncio.ensure_future(send(proxy.port, request("/c", b"chq0000003")))
    await asyncio.sleep(0.5)
    proxy.heal(drop=True)
    assert await dropped == b""
    await asyncio.sleep(0.1)
    assert [r[-1:] for r in node.received] == [b"1", b"2"]
    # Sent to this node all the same (the caller's request went there, and was lost).
    assert [rid for _, rid in proxy.seen] == ["chq0000003"]


async def test_a_dead_node_is_a_refused_connection_until_it_accepts_again(pair):
    node, proxy = pair
    await node.stop()
    proxy.node_down()
    await asyncio.sleep(0.2)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)
    await node.start()  # the same port, as a restarted node
    for _ in range(50):
        try:
            answer = await send(proxy.port, request("/health", b""))
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.1)
    assert answer.endswith(b"ok")


async def test_a_killed_node_refuses_at_once_not_when_the_proxy_first_finds_it_dead(pair):
    node, proxy = pair
    await node.stop()
    proxy.node_down()  # no await between: the nemesis kills and tells in one step
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", proxy.port)


async def test_a_request_sent_as_its_node_died_is_recorded_as_reaching_it(pair):
    # Accepted before anyone knew the node was dead: the caller sent it to this node, which
    # lost it (the nemesis's checker counts the failure against the node's death).
    node, proxy = pair
    await node.stop()
    answer = await send(proxy.port, request("/inference/v1/generate", b'{"id":"chq0000042"}'))
    assert answer == b""
    assert [rid for _, rid in proxy.seen] == ["chq0000042"]
    with pytest.raises(ConnectionRefusedError):  # and the proxy now refuses, as the node
        await asyncio.open_connection("127.0.0.1", proxy.port)


async def kept_alive(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that has carried one answered request and stays open, as a pool keeps it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request("/health", b""))
    assert (await reader.readexactly(40)).endswith(b"ok")
    return reader, writer


async def assert_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The proxy closes the connection (an end or a reset) without an answer."""
    try:
        assert await asyncio.wait_for(reader.read(100), 2.0) == b""
    except ConnectionResetError:
        pass
    finally:
        writer.close()


async def test_a_killed_nodes_kept_alive_connections_close_when_it_is_killed(pair):
    # A big process's sockets close only when its memory is freed; the caller reusing a kept
    # connection meanwhile must find it closed, as without the proxy, not lose its request.
    node, proxy = pair
    reader, writer = await kept_alive(proxy.port)
    await node.stop()  # dying: no longer accepting, its open connections not yet closed
    proxy.node_down()
    await assert_closed(reader, writer)


async def test_a_request_sent_as_its_node_closed_the_connection_is_recorded_as_reaching_it(pair):
    node, proxy = pair
    reader, writer = await kept_alive(proxy.port)
    node.close_connections()
    await asyncio.sleep(0.01)  # the proxy has read the node's side closing
    writer.write(request("/inference/v1/generate", b'{"id":"chq0000043"}'))
    await assert_closed(reader, writer)
    assert [rid for _, rid in proxy.seen] == ["chq0000043"]

"""A request whose media fail stops the rest of its work before it answers: its other fetches
are cancelled (their connections closed) and its decode threads waited for, so nothing runs on
charged to a slot the request has given back."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from tandem_render.app import create_app
from tandem_render.settings import RenderSettings
from tandem_render.tasks import all_or_none, in_thread

from ...support.asgi import app_client
from ...support.images import chat_body

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions/render"


class StallingMediaServer:
    """Serves ``/slow/*`` as a 1 MB image whose first bytes come at once and the rest never,
    and ``/bad`` (not an image) only once ``stalls`` slow fetches are under way; records when
    each slow connection was closed by its client."""

    def __init__(self, stalls: int) -> None:
        self.stalls = stalls
        self.started = threading.Semaphore(0)
        self.closed_at: list[float] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> StallingMediaServer:
        self._sock.settimeout(0.1)
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            path = request.split(b" ", 2)[1]
            if path == b"/bad":
                for _ in range(self.stalls):  # hold the state: the others are mid-fetch
                    self.started.acquire(timeout=30)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nnot a png")
                return
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"\x89PNG")
            self.started.release()
            conn.settimeout(0.05)
            while not self._stop.is_set():
                try:
                    if conn.recv(1) == b"":
                        break  # the client closed it
                except TimeoutError:
                    continue
                except OSError:
                    break
            else:
                return
            self.closed_at.append(time.monotonic())


async def test_a_failing_item_closes_its_siblings_fetches(qwen2_renderer, qwen2_dir):
    settings = RenderSettings(
        model=qwen2_dir,
        max_images_per_prompt=4,
        pretouch_cache_memory=False,
        allowed_private_hosts=("127.0.0.1",),
        media_fetch_timeout_s=30.0,
    )
    app = create_app(settings, renderer=qwen2_renderer)
    with StallingMediaServer(stalls=2) as media:
        urls = [media.url("/slow/1.png"), media.url("/slow/2.png"), media.url("/bad")]
        async with app_client(app) as c:  # its end would close every fetch: checked within
            r = await c.post(CHAT, json=chat_body(qwen2_dir, urls))
            answered = time.monotonic()
            assert r.status_code == 400, r.text  # the bad item's own refusal, as it was
            assert r.json()["error"]["type"] == "invalid_image"
            deadline = answered + 1.0
            while len(media.closed_at) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert len(media.closed_at) == 2, "a sibling fetch ran on after its request failed"
            assert max(media.closed_at) <= deadline


async def test_the_first_failure_is_raised_as_it_is_and_the_others_are_cancelled():
    cancelled: list[int] = []

    async def slow(i: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise
        return i

    async def fail() -> int:
        await asyncio.sleep(0.01)
        raise ValueError("bad item")

    with pytest.raises(ValueError, match="bad item"):
        await all_or_none([slow(0), fail(), slow(1)])
    assert sorted(cancelled) == [0, 1]
    assert await all_or_none([asyncio.sleep(0, result=i) for i in range(3)]) == [0, 1, 2]


async def test_a_cancelled_thread_is_waited_for_until_it_returns():
    release = threading.Event()
    returned = threading.Event()

    def work() -> None:
        release.wait(10)
        returned.set()

    task = asyncio.ensure_future(in_thread(work))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.1)
    assert not task.done()  # still the request's: its thread holds what it decodes
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert returned.is_set()

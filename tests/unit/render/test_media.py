"""MediaLoader: data/http/file URLs, SSRF refusals, DNS pinning and image decoding guards."""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import socket
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tandem_render.errors import (
    ImageTooLarge,
    InvalidImage,
    MediaError,
    MediaFetchFailed,
    MediaNotFound,
    MediaSchemeNotAllowed,
    MediaTooLarge,
    MediaUrlForbidden,
)
from tandem_render.media import MediaLoader, MediaPolicy, is_allowed_domain

LOCAL = MediaPolicy(allowed_private_hosts=frozenset({"127.0.0.1"}))


def _png(width: int = 4, height: int = 3) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 100, 0)).save(buf, "JPEG")
    return buf.getvalue()


def _png_declaring(width: int, height: int) -> bytes:
    """A hand-written PNG whose header claims ``width x height`` but holds one tiny IDAT."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00"))
        + chunk(b"IEND", b"")
    )


PNG = _png()


# -- helpers -----------------------------------------------------------------------------------


def _run(
    url: str,
    policy: MediaPolicy = LOCAL,
    *,
    client: httpx.AsyncClient | None = None,
    resolver: Callable[[str, int], Awaitable[list[str]]] | None = None,
    own_client: bool = False,
) -> bytes:
    """Load ``url`` with a fresh loader; unless ``own_client``, only 127.0.0.1 is reachable."""
    if client is None and not own_client:
        client = _local_only_client()

    async def go() -> bytes:
        loader = MediaLoader(policy, client=client, resolver=resolver)
        try:
            return await loader.load_bytes(url)
        finally:
            await loader.aclose()
            if client is not None:
                await client.aclose()

    return asyncio.run(go())


def _expect(cls: type[MediaError], fn: Callable[[], object]) -> MediaError:
    """Run ``fn``; it must raise exactly ``cls``, a 4xx MediaError with a short message."""
    with pytest.raises(MediaError) as info:
        fn()
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err.message}"
    assert 400 <= err.status_code < 500
    assert len(err.message) < 250 and "Traceback" not in err.message
    return err


def _stub_resolver(table: dict[str, list[str]]) -> Callable[[str, int], Awaitable[list[str]]]:
    """Answers only for names in ``table``; any other lookup fails the test (no real DNS)."""

    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise AssertionError(f"unexpected DNS lookup for {host!r}")
        return list(table[host])

    return resolve


async def _no_dns(host: str, port: int) -> list[str]:
    raise AssertionError(f"unexpected DNS lookup for {host!r}")


class _LocalOnlyTransport(httpx.AsyncHTTPTransport):
    """Real connections, but a bug in the loader can never reach beyond 127.0.0.1."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host != "127.0.0.1":
            raise AssertionError(f"unexpected connection to {request.url}")
        return await super().handle_async_request(request)


def _local_only_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=_LocalOnlyTransport(), trust_env=False)


def _no_network() -> httpx.AsyncClient:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"unexpected connection to {request.url}")

    return httpx.AsyncClient(transport=httpx.MockTransport(refuse))


def _recording_client(seen: list[httpx.Request]) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=PNG)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


# -- a real local HTTP server ------------------------------------------------------------------


@dataclass
class LocalServer:
    port: int
    requests: list[tuple[str, str]] = field(default_factory=list)
    """(path, Host header) of every request seen."""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _handler(server: LocalServer, release: threading.Event) -> type[BaseHTTPRequestHandler]:
    redirects = {
        "/redir": "/img.png",
        "/evil": "http://169.254.169.254/latest/meta-data",
        "/offsite": "http://evil.test/x.png",
        "/tofile": "file:///etc/passwd",
        "/loop": "/loop",
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server.requests.append((self.path, self.headers.get("Host", "")))
            try:
                self._answer()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading on purpose (size cap, timeout)

        def _answer(self) -> None:
            if self.path == "/img.png":
                self._send(200, PNG, {"Content-Type": "image/png"})
            elif self.path in redirects:
                self._send(302, b"", {"Location": redirects[self.path]})
            elif self.path == "/huge":
                self._send(200, b"x" * 100_000)
            elif self.path == "/stream":
                # No Content-Length: the body ends when the connection closes (HTTP/1.0).
                self.send_response(200)
                self.end_headers()
                for _ in range(100):
                    self.wfile.write(b"x" * 1000)
            elif self.path == "/gzip-bomb":
                # 1 MB of zeros in ~1 kB of gzip, sent despite our Accept-Encoding: identity.
                bomb = gzip.compress(b"\0" * 1_000_000)
                self._send(200, bomb, {"Content-Encoding": "gzip", "Content-Type": "image/png"})
            elif self.path == "/slow":
                release.wait(5)
                self._send(200, PNG)
            else:
                self._send(404, b"not found")

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def http_server() -> Iterator[LocalServer]:
    release = threading.Event()
    info = LocalServer(port=0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(info, release))
    httpd.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    info.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield info
    finally:
        release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


# -- data: URLs --------------------------------------------------------------------------------


def test_data_url_png_round_trip() -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    data = _run(url)
    assert data == PNG
    assert MediaLoader(LOCAL).open_image(data).size == (4, 3)


def test_data_url_bad_base64() -> None:
    _expect(InvalidImage, lambda: _run("data:image/png;base64,@@not base64@@"))


def test_data_url_unpadded_base64_is_refused() -> None:
    _expect(InvalidImage, lambda: _run("data:image/png;base64,YWJj ZA"))
    _expect(InvalidImage, lambda: _run("data:image/png;base64,YWJjZA"))


def test_data_url_without_comma() -> None:
    _expect(InvalidImage, lambda: _run("data:image/png;base64"))


def test_data_url_header_and_scheme_are_searched_only_so_far() -> None:
    # The ',' of a data URL and the ':' of a scheme are looked for near the start only: a
    # megabyte URL is never scanned or copied whole just to split it.
    _expect(InvalidImage, lambda: _run("data:image/png;" + "x" * 2000 + ";base64,AAAA"))
    _expect(MediaSchemeNotAllowed, lambda: _run("a" * 40 + ":rest"))


def test_data_url_percent_encoded() -> None:
    assert _run("data:text/plain,hello%20world%00") == b"hello world\x00"
    assert _run("data:,plain") == b"plain"


def test_data_url_oversize() -> None:
    policy = MediaPolicy(max_media_bytes=64)
    url = "data:image/png;base64," + base64.b64encode(b"\x00" * 100).decode()
    _expect(MediaTooLarge, lambda: _run(url, policy))
    _expect(MediaTooLarge, lambda: _run("data:," + "a" * 65, policy))


# -- http(s) against a real local server -------------------------------------------------------


def test_http_fetch(http_server: LocalServer) -> None:
    assert _run(http_server.url("/img.png"), own_client=True) == PNG
    assert http_server.requests == [("/img.png", f"127.0.0.1:{http_server.port}")]


def test_http_redirect_is_followed(http_server: LocalServer) -> None:
    assert _run(http_server.url("/redir")) == PNG
    assert [path for path, _ in http_server.requests] == ["/redir", "/img.png"]


def test_http_redirect_to_metadata_address_is_refused(http_server: LocalServer) -> None:
    _expect(MediaUrlForbidden, lambda: _run(http_server.url("/evil")))
    assert [path for path, _ in http_server.requests] == ["/evil"]


def test_http_redirect_outside_domain_allowlist_is_refused(http_server: LocalServer) -> None:
    policy = MediaPolicy(
        allowed_domains=("127.0.0.1",), allowed_private_hosts=frozenset({"127.0.0.1"})
    )
    url = http_server.url("/offsite")
    _expect(MediaUrlForbidden, lambda: _run(url, policy, resolver=_no_dns))


def test_http_redirect_to_file_url_is_refused(http_server: LocalServer) -> None:
    _expect(MediaUrlForbidden, lambda: _run(http_server.url("/tofile")))


def test_http_redirect_loop_stops(http_server: LocalServer) -> None:
    err = _expect(MediaFetchFailed, lambda: _run(http_server.url("/loop")))
    assert "redirect" in err.message
    assert len(http_server.requests) == LOCAL.max_redirects + 1


def test_http_content_length_over_cap(http_server: LocalServer) -> None:
    policy = MediaPolicy(max_media_bytes=1000, allowed_private_hosts=frozenset({"127.0.0.1"}))
    _expect(MediaTooLarge, lambda: _run(http_server.url("/huge"), policy))


def test_http_streamed_body_over_cap(http_server: LocalServer) -> None:
    policy = MediaPolicy(max_media_bytes=1000, allowed_private_hosts=frozenset({"127.0.0.1"}))
    _expect(MediaTooLarge, lambda: _run(http_server.url("/stream"), policy))


def test_http_compressed_body_is_refused_not_inflated(http_server: LocalServer) -> None:
    """The cap counts bytes as received; a server that compresses anyway is refused before
    anything is inflated (1 MB of zeros in ~1 kB of gzip, cap 2 kB)."""
    policy = MediaPolicy(max_media_bytes=2000, allowed_private_hosts=frozenset({"127.0.0.1"}))
    err = _expect(MediaFetchFailed, lambda: _run(http_server.url("/gzip-bomb"), policy))
    assert "gzip" in err.message


def test_http_timeout(http_server: LocalServer) -> None:
    policy = MediaPolicy(fetch_timeout_s=0.2, allowed_private_hosts=frozenset({"127.0.0.1"}))
    err = _expect(MediaFetchFailed, lambda: _run(http_server.url("/slow"), policy))
    assert "timed out" in err.message


def test_http_404(http_server: LocalServer) -> None:
    err = _expect(MediaFetchFailed, lambda: _run(http_server.url("/missing")))
    assert "404" in err.message


def test_http_connection_refused(http_server: LocalServer) -> None:
    # A port nobody listens on: take a free one from the OS, then close it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _expect(MediaFetchFailed, lambda: _run(f"http://127.0.0.1:{port}/img.png"))


# -- SSRF --------------------------------------------------------------------------------------


def test_loopback_refused_by_default_and_never_contacted(http_server: LocalServer) -> None:
    _expect(MediaUrlForbidden, lambda: _run(http_server.url("/img.png"), MediaPolicy()))
    assert http_server.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://127.1/",
        "http://017700000001/",
        "http://[fe80::1]/",
        "http://0.0.0.0/",
        "http://[::]/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://[fec0::1]/",
        "http://[fc00::1]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:7f00:1::]/",
        "https://192.168.1.1:8443/x.png",
    ],
)
def test_private_literal_addresses_refused(url: str) -> None:
    _expect(
        MediaUrlForbidden,
        lambda: _run(url, MediaPolicy(), client=_no_network(), resolver=_no_dns),
    )


def test_localhost_refused() -> None:
    resolver = _stub_resolver({"localhost": ["127.0.0.1", "::1"]})
    _expect(
        MediaUrlForbidden,
        lambda: _run("http://localhost/", MediaPolicy(), client=_no_network(), resolver=resolver),
    )


def test_name_resolving_to_private_address_refused() -> None:
    resolver = _stub_resolver({"internal.test": ["10.1.2.3"]})
    url = "http://internal.test/x.png"
    _expect(
        MediaUrlForbidden,
        lambda: _run(url, MediaPolicy(), client=_no_network(), resolver=resolver),
    )


def test_any_private_answer_among_several_is_refused() -> None:
    resolver = _stub_resolver({"mixed.test": ["93.184.216.34", "10.0.0.1"]})
    url = "http://mixed.test/x.png"
    _expect(
        MediaUrlForbidden,
        lambda: _run(url, MediaPolicy(), client=_no_network(), resolver=resolver),
    )


def test_unresolvable_name_fails_to_fetch() -> None:
    async def fail(host: str, port: int) -> list[str]:
        raise OSError("name or service not known")

    _expect(MediaFetchFailed, lambda: _run("http://nowhere.test/", MediaPolicy(), resolver=fail))


@pytest.mark.parametrize(
    ("answer", "connect_host"),
    [
        ("93.184.216.34", "93.184.216.34"),
        ("2606:4700::1111", "2606:4700::1111"),
        ("::ffff:93.184.216.34", "93.184.216.34"),
        ("64:ff9b::5db8:d822", "64:ff9b::5db8:d822"),
    ],
)
def test_public_answer_is_pinned(answer: str, connect_host: str) -> None:
    seen: list[httpx.Request] = []
    resolver = _stub_resolver({"pub.test": [answer]})
    url = "https://pub.test/a.png?x=1"
    assert _run(url, MediaPolicy(), client=_recording_client(seen), resolver=resolver) == PNG
    (request,) = seen
    assert request.url.host == connect_host
    assert request.url.raw_path == b"/a.png?x=1"
    assert request.headers["host"] == "pub.test"
    assert request.extensions["sni_hostname"] == "pub.test"


def test_allow_private_networks_skips_address_checks() -> None:
    seen: list[httpx.Request] = []
    policy = MediaPolicy(allow_private_networks=True)
    assert _run("http://10.0.0.7:8080/x", policy, client=_recording_client(seen)) == PNG
    assert seen[0].url.host == "10.0.0.7" and seen[0].headers["host"] == "10.0.0.7:8080"


def test_dns_pinning_reaches_vetted_ip_with_original_host(http_server: LocalServer) -> None:
    resolver = _stub_resolver({"media.test": ["127.0.0.1"]})
    url = f"http://media.test:{http_server.port}/img.png"
    assert _run(url, LOCAL, resolver=resolver) == PNG
    assert http_server.requests == [("/img.png", f"media.test:{http_server.port}")]


# -- domain allowlist --------------------------------------------------------------------------


def test_domain_allowlist_refuses_before_resolving() -> None:
    policy = MediaPolicy(allowed_domains=("example.com",))
    url = "http://evil.com/x.png"
    _expect(MediaUrlForbidden, lambda: _run(url, policy, client=_no_network(), resolver=_no_dns))


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("example.com", True),
        ("cdn.example.com", True),
        ("a.b.example.com", True),
        ("EXAMPLE.com.", True),
        ("notexample.com", False),
        ("example.com.evil.org", False),
        ("example.co", False),
        ("com", False),
    ],
)
def test_domain_matching(host: str, allowed: bool) -> None:
    assert is_allowed_domain(host, ("example.com",)) is allowed
    assert is_allowed_domain(host, (".example.com",)) is allowed


def test_long_url_is_not_echoed_in_full() -> None:
    policy = MediaPolicy(allowed_domains=("example.com",))
    host = ".".join(["a" * 60] * 30)
    err = _expect(MediaUrlForbidden, lambda: _run(f"http://{host}/", policy, resolver=_no_dns))
    assert host not in err.message


# -- schemes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/a.png", "gopher://example.com/", "file:///etc/passwd", "no-scheme.png"],
)
def test_scheme_refused(url: str) -> None:
    _expect(MediaSchemeNotAllowed, lambda: _run(url, MediaPolicy(), resolver=_no_dns))


def test_scheme_outside_policy_refused() -> None:
    policy = MediaPolicy(allowed_schemes=frozenset({"https"}))
    _expect(MediaSchemeNotAllowed, lambda: _run("http://example.com/", policy, resolver=_no_dns))
    _expect(MediaSchemeNotAllowed, lambda: _run("data:,x", policy))


# -- file: URLs --------------------------------------------------------------------------------


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "a.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    return folder


def test_file_inside_folder(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir)
    assert _run((media_dir / "a.png").as_uri(), policy) == PNG


def test_file_dotdot_escape_refused(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir)
    _expect(MediaUrlForbidden, lambda: _run(f"file://{media_dir}/../secret.png", policy))
    _expect(MediaUrlForbidden, lambda: _run(f"file://{media_dir}/%2e%2e/secret.png", policy))


def test_file_symlink_escape_refused(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir)
    _expect(MediaUrlForbidden, lambda: _run((media_dir / "link.png").as_uri(), policy))


def test_file_remote_host_or_relative_path_refused(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir)
    _expect(MediaUrlForbidden, lambda: _run(f"file://server{media_dir}/a.png", policy))
    _expect(MediaUrlForbidden, lambda: _run("file:a.png", policy))


def test_file_missing(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir)
    _expect(MediaNotFound, lambda: _run((media_dir / "nope.png").as_uri(), policy))
    _expect(MediaNotFound, lambda: _run(media_dir.as_uri(), policy))


def test_file_too_large(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_media_path=media_dir, max_media_bytes=10)
    _expect(MediaTooLarge, lambda: _run((media_dir / "a.png").as_uri(), policy))


# -- images ------------------------------------------------------------------------------------


def test_open_png_and_jpeg() -> None:
    loader = MediaLoader(MediaPolicy())
    png = loader.open_image(PNG)
    assert (png.format, png.size, png.mode) == ("PNG", (4, 3), "RGB")
    jpeg = loader.open_image(_jpeg())
    assert (jpeg.format, jpeg.size) == ("JPEG", (8, 8))
    assert loader.check_image_bytes(PNG) == (4, 3)


def test_open_animated_gif_gives_first_frame() -> None:
    frames = [Image.new("RGB", (5, 5), color) for color in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    img = MediaLoader(MediaPolicy()).open_image(buf.getvalue())
    assert img.tell() == 0 and getattr(img, "n_frames", 1) == 2


def test_random_bytes_are_invalid() -> None:
    loader = MediaLoader(MediaPolicy())
    noise = bytes(range(256)) * 4
    _expect(InvalidImage, lambda: loader.open_image(noise))
    _expect(InvalidImage, lambda: loader.check_image_bytes(noise))
    _expect(InvalidImage, lambda: loader.open_image(b""))


def test_truncated_png_is_invalid() -> None:
    big = _png(64, 64)
    _expect(InvalidImage, lambda: MediaLoader(MediaPolicy()).open_image(big[: len(big) // 2]))


@pytest.mark.timeout(5)
def test_decompression_bomb_refused_from_header() -> None:
    bomb = _png_declaring(100_000, 100_000)
    loader = MediaLoader(MediaPolicy())
    _expect(ImageTooLarge, lambda: loader.open_image(bomb))
    _expect(ImageTooLarge, lambda: loader.check_image_bytes(bomb))


def test_policy_pixel_cap_below_pillow_limit() -> None:
    loader = MediaLoader(MediaPolicy(max_image_pixels=100))
    _expect(ImageTooLarge, lambda: loader.open_image(_png(20, 20)))
    _expect(ImageTooLarge, lambda: loader.check_image_bytes(_png_declaring(11, 10)))
    assert loader.check_image_bytes(_png(10, 10)) == (10, 10)


def test_zero_size_image_is_invalid() -> None:
    loader = MediaLoader(MediaPolicy())
    _expect(InvalidImage, lambda: loader.open_image(_png_declaring(0, 10)))
    _expect(InvalidImage, lambda: loader.check_image_bytes(_png_declaring(10, 0)))


# -- the error family --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "type_", "status"),
    [
        (MediaSchemeNotAllowed, "media_scheme_not_allowed", 400),
        (MediaUrlForbidden, "media_url_forbidden", 403),
        (MediaFetchFailed, "media_fetch_failed", 422),
        (MediaTooLarge, "media_too_large", 413),
        (MediaNotFound, "media_not_found", 400),
        (InvalidImage, "invalid_image", 400),
        (ImageTooLarge, "image_too_large", 413),
    ],
)
def test_error_types(cls: type[MediaError], type_: str, status: int) -> None:
    assert issubclass(cls, MediaError)
    assert (cls.type, cls.status_code) == (type_, status)


# -- fetched bytes are charged to the request before they are held ------------------------------


class _Refused(Exception):
    pass


def _charged_load(url: str, client: httpx.AsyncClient, room: int) -> tuple[list[int], object]:
    """Load ``url`` telling a charge of ``room`` bytes; (what was charged, bytes or error)."""
    charged: list[int] = []

    def charge(n: int) -> None:
        if sum(charged) + n > room:
            raise _Refused(n)
        charged.append(n)

    async def go() -> object:
        loader = MediaLoader(MediaPolicy(allow_private_networks=True), client=client)
        try:
            return await loader.load_bytes(url, charge)
        except _Refused as exc:
            return exc
        finally:
            await loader.aclose()
            await client.aclose()

    return charged, asyncio.run(go())


def _four_chunks(read: list[int], length: bool) -> httpx.AsyncClient:
    """A media server answering 4 x 1000 bytes (``read``: one entry per chunk it was asked
    for), with or without a Content-Length."""

    async def body():
        for _ in range(4):
            read.append(1)
            yield b"x" * 1000

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-length": "4000"} if length else {}  # else chunked
        return httpx.Response(200, headers=headers, content=body())

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def test_a_fetch_is_charged_its_content_length_before_any_of_it_is_read() -> None:
    read: list[int] = []
    charged, got = _charged_load("http://10.0.0.7/a", _four_chunks(read, True), room=10_000)
    assert (charged, got) == ([4000], b"x" * 4000)
    read.clear()
    charged, got = _charged_load("http://10.0.0.7/a", _four_chunks(read, True), room=3000)
    assert isinstance(got, _Refused) and charged == [] and read == []


def test_a_fetch_without_a_length_is_charged_as_it_arrives_and_stopped_past_the_room() -> None:
    read: list[int] = []
    charged, got = _charged_load("http://10.0.0.7/a", _four_chunks(read, False), room=2500)
    assert isinstance(got, _Refused) and sum(charged) <= 2500 and len(read) < 4


def test_a_data_url_is_charged_its_decoded_size_before_it_is_decoded() -> None:
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    charged, got = _charged_load(url, client, room=10**6)
    assert got == PNG and len(PNG) <= sum(charged) <= len(url) * 3 // 4
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    charged, got = _charged_load(url, client, room=len(PNG) // 2)
    assert isinstance(got, _Refused)

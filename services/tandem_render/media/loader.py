"""MediaLoader: the bytes behind a media URL, by scheme, under one policy; image and audio
checks."""

from __future__ import annotations

import re

import httpx
from PIL import Image

from ..errors import MediaSchemeNotAllowed
from ..tasks import in_thread
from .audio import AudioHeader, check_audio_bytes
from .checks import check_image_bytes, open_image
from .fetch import Charge, HttpFetcher, Resolver
from .policy import MediaPolicy
from .sources import decode_data_url, read_file

__all__ = ["MediaLoader"]

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
# Where to stop looking for the ':' of a scheme; it also keeps schemes short enough to echo.
_MAX_SCHEME = 32


class MediaLoader:
    """Loads media bytes under a :class:`MediaPolicy`; build one and share it.

    http(s) goes through :class:`HttpFetcher`, which connects only to addresses it vetted. A
    ``client`` given by the caller must not use proxies (``trust_env=False``): a proxy would
    resolve the name again.
    """

    def __init__(
        self,
        policy: MediaPolicy,
        client: httpx.AsyncClient | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.policy = policy
        self._http = HttpFetcher(policy, client, resolver)

    async def aclose(self) -> None:
        """Close the HTTP client if this loader created it."""
        await self._http.aclose()

    async def load_bytes(self, url: str, charge: Charge | None = None) -> bytes:
        """The bytes behind ``url``; raises a :class:`MediaError` subclass when refused.
        ``charge`` (a request's ``Slot.take``) is told of the bytes before they are held: a
        fetch's as they arrive (its Content-Length first), a data URL's decoded size before
        it is decoded, a file's size once read; it refuses (429/413) what does not fit."""
        scheme = _split_scheme(url)
        limit = self.policy.max_media_bytes
        if scheme == "file":
            root = self.policy.allowed_local_media_path
            if root is None:
                raise MediaSchemeNotAllowed("file: media URLs are not enabled on this server")
            data = await in_thread(read_file, url, root, limit)
            if charge is not None:
                charge(len(data))
            return data
        if scheme not in self.policy.allowed_schemes:
            raise MediaSchemeNotAllowed(f"media URL scheme {scheme!r} is not allowed")
        if scheme == "data":
            if charge is not None:
                charge(min(limit, len(url) * 3 // 4))  # base64's decoded size, at most
            return decode_data_url(url, limit)
        if scheme in ("http", "https"):
            return await self._http.fetch(url, charge)
        raise MediaSchemeNotAllowed(f"media URL scheme {scheme!r} is not supported")

    def open_image(self, data: bytes) -> Image.Image:
        """Decode an image (first frame of animations), refusing oversize ones before decoding."""
        return open_image(data, self.policy.max_image_pixels)

    def check_image_bytes(self, data: bytes) -> tuple[int, int]:
        """``(width, height)`` from the header alone, with the same checks as :meth:`open_image`."""
        return check_image_bytes(data, self.policy.max_image_pixels)

    def check_audio_bytes(self, data: bytes) -> AudioHeader:
        """The audio's header, refusing out-of-bounds clips before any sample is decoded."""
        return check_audio_bytes(data, self.policy.audio_limits)


def _split_scheme(url: str) -> str:
    # find, not partition: a data URL is megabytes, and partition would copy all of it.
    colon = url.find(":", 0, _MAX_SCHEME)
    scheme = url[:colon].lower()
    if colon < 0 or not _SCHEME.fullmatch(scheme):
        raise MediaSchemeNotAllowed("media URL has no scheme")
    return scheme

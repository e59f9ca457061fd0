"""``content_parts``: raw media on a generate request, resolved by a render node.

vLLM's main-branch generate takes ``content_parts`` instead of ``features`` (never both): a
list of ``{"type": "image_url" | "video_url" | "audio_url", "url": ..., "uuid"?: ...}`` parts
whose media the server fetches itself; the caller's ``token_ids`` carry the model's
placeholder token once per item, where its chat template puts it, and vLLM's processor,
run on that token prompt with the media (``render_cmpl_async`` on a ``TokensPrompt`` with
``multi_modal_data``), expands each placeholder to the item's tokens (the ids are never
re-tokenized). A part of any other type is skipped there.

This node never runs the HF processor, so it asks the render node named by
``--content-parts-render-url`` to do exactly that step: render's ``/v1/completions/render``
takes a token prompt and its media (our ``images``, ``videos`` and ``audios`` fields), fetches
them under render's media policy (allowlist, no private or loopback addresses, byte caps,
the video and clip limits; ``tandem_render.media``) and answers the expanded token ids and
the features, in msgpack with the model's wire transforms, through ``tandem_client`` (the one
client of render's routes). The request then proceeds exactly as if the caller had sent
those ids and features. Render's refusals reach the caller with render's status and type; a
render node out of reach is a 503.

vLLM's ``multi_modal_data`` is a list per modality, each matched in order to that modality's
placeholders, so the parts keep their order within each modality (how modalities interleave
is the token ids' business). Parts of other types are refused with a 400 (upstream skips
them). A part's ``uuid`` (upstream names the item by it in its caches) is not used: an item's
identity here is its content id, derived from its bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx
import msgspec

from tandem_client import AsyncTandemClient, ServiceError, TransportError
from tandem_http import BadRequest, TooManyItems
from tandem_wire import GenerateRequest, ItemBytes, error_types

from .errors import RenderFailed, RenderRefused, RenderUnavailable
from .settings import GenerateSettings

__all__ = ["RENDER_URL_FLAG", "ContentPartsResolver", "content_part_media"]

RENDER_URL_FLAG = "--content-parts-render-url"
"""The command-line flag that names the render node (named in the refusal without one)."""

_MODALITIES = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
"""The part types served, and the modality each is."""


def content_part_media(parts: Sequence[Any], max_items: int) -> dict[str, list[str]]:
    """The URLs of ``parts`` by modality (``image``, ``video``, ``audio``), each modality's in
    the order of its parts; any part this node cannot serve is a 400 naming it (``param``
    ``content_parts[i]``), and more parts in all than ``max_items`` a 400, before anything
    is fetched."""
    if len(parts) > max_items:
        raise TooManyItems(
            f"{len(parts)} content parts in one request; the limit is {max_items}",
            param="content_parts",
        )
    media: dict[str, list[str]] = {}
    for i, part in enumerate(parts):
        where = f"content_parts[{i}]"
        if not isinstance(part, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        kind = part.get("type")
        modality = _MODALITIES.get(kind) if isinstance(kind, str) else None
        if modality is None:
            shown = repr(kind)[:40]
            raise BadRequest(
                f"{where}: unsupported part type {shown}; content_parts take image_url, "
                "video_url and audio_url parts (the prompt's text belongs in token_ids)",
                param=where,
            )
        url = part.get("url")
        nested = part.get(kind)  # OpenAI's shape of the same part ({"video_url": {"url"}})
        if nested is not None and url is not None:
            raise BadRequest(f"{where}: give the URL once, as url", param=where)
        if isinstance(nested, dict):
            url = nested.get("url")
        if not isinstance(url, str) or not url:
            raise BadRequest(
                f"{where}: a {kind} part needs its url, a non-empty string (items are "
                "not referenced by uuid here)",
                param=where,
            )
        media.setdefault(modality, []).append(url)
    return media


class ContentPartsResolver:
    """Turns a request's ``content_parts`` into token ids and features, through a render
    node's ``/v1/completions/render``; one per process (it holds that node's connections)."""

    def __init__(
        self,
        settings: GenerateSettings,
        max_answer_bytes: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not settings.content_parts_render_url:
            raise ValueError("content_parts_render_url is not set")
        self.render_url = settings.content_parts_render_url
        self.max_items = settings.max_items_per_prompt
        self._client = AsyncTandemClient(
            self.render_url,
            (),
            api_key=settings.content_parts_render_api_key,
            timeout_s=settings.content_parts_render_timeout_s,
            # One quick retry of a connection error or 429/503, then the caller decides.
            max_retries=1,
            backoff_s=0.2,
            # Render's answer becomes this request: no larger than a body this node takes.
            max_answer_bytes=max_answer_bytes,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def resolve(
        self,
        req: GenerateRequest[ItemBytes | None],
        charge: Callable[[int], None] | None = None,
    ) -> GenerateRequest[ItemBytes | None]:
        """``req`` with render's token ids and features in place of its ``content_parts``;
        ``charge`` is told the bytes of the items render answered (the request's admission
        slot: 429/413 when they do not fit)."""
        media = content_part_media(req.content_parts or [], self.max_items)
        try:
            (rendered,) = await self._client.render_completion(
                list(req.token_ids),
                images=_one_prompt(media.get("image")),
                videos=_one_prompt(media.get("video")),
                audios=_one_prompt(media.get("audio")),
                # Only the prompt is rendered: sampling stays the caller's (checked here).
                max_tokens=1,
                cache_salt=req.cache_salt,
            )
        except TransportError as exc:
            raise RenderUnavailable(
                f"the render node that resolves content_parts ({self.render_url}) cannot be "
                f"reached: {type(exc.__cause__).__name__}"
            ) from None
        except ServiceError as exc:
            raise _from_render(exc, self.render_url) from None
        feats = rendered.features
        if charge is not None and feats is not None and feats.kwargs_data:
            charge(sum(len(d) for ds in feats.kwargs_data.values() for d in ds if d is not None))
        return msgspec.structs.replace(
            req, token_ids=rendered.token_ids, features=feats, content_parts=None
        )


def _one_prompt(urls: list[str] | None) -> list[list[str]] | None:
    """A render completion field for our one prompt (None: no item of that modality)."""
    return [urls] if urls else None


def _from_render(exc: ServiceError, url: str) -> Exception:
    """What the caller is answered for render's refusal or failure."""
    if exc.type == error_types.UNAUTHORIZED:
        # This node's key, not the caller's: an operator's mistake, not the request's.
        return RenderFailed(
            "the render node that resolves content_parts refused this node's key "
            "(--content-parts-render-api-key)"
        )
    if exc.status_code == 503:
        return RenderUnavailable(
            f"the render node that resolves content_parts ({url}) is not ready: {exc.type}"
        )
    if exc.status_code >= 500:
        return RenderFailed(
            f"the render node that resolves content_parts ({url}) failed: {exc.type}"
        )
    return RenderRefused(
        f"content_parts: {exc.message}",
        status_code=exc.status_code,
        type=exc.type,
        param="content_parts",
        details=exc.details or None,
        retry_after=1 if exc.status_code == 429 else None,
    )

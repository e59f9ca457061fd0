"""The client's exception tree, mapped from the services' error ``type`` strings.

TandemError
 +-- TransportError            connection failures and timeouts, after the retries
 +-- ServiceError              an HTTP error answer; .type, .status_code, .details, .request_id
      +-- BadRequestError          4xx input errors (never retried)
      |    +-- AuthenticationError     401 unauthorized, 403 admin_required
      |    +-- ModelNotFoundError      404 model_not_found
      |    +-- PayloadTooLargeError    413 (body, media, image, item limits)
      |    +-- MediaError              the media could not be fetched or decoded
      |    +-- CacheMissError          409 mm_cache_miss (resent transparently by the client)
 |    +-- WeightUpdateError       a weight update refused (bad file, out of order, no backend)
      +-- OverloadedError          429 overloaded (retried with backoff)
      +-- ServerError              5xx (503 retried with backoff)
           +-- FleetPartialFailure     502 control_partial_failure: a call to every generate
                                       node failed on some (.failed names each one's own answer)
"""

from __future__ import annotations

from typing import Any

from tandem_wire import error_types

__all__ = [
    "TandemError",
    "TransportError",
    "ServiceError",
    "BadRequestError",
    "AuthenticationError",
    "ModelNotFoundError",
    "PayloadTooLargeError",
    "MediaError",
    "CacheMissError",
    "WeightUpdateError",
    "OverloadedError",
    "ServerError",
    "FleetPartialFailure",
    "error_from_response",
]


class TandemError(Exception):
    """Base of every error this client raises."""


class TransportError(TandemError):
    """The service could not be reached (connection refused, reset, timed out)."""


class ServiceError(TandemError):
    """A service answered with an error body ``{"error": {"type", "message", ...}}``."""

    def __init__(
        self,
        message: str,
        *,
        type: str,
        status_code: int,
        details: dict[str, Any] | None = None,
        request_id: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(f"{status_code} {type}: {message}")
        self.message = message
        self.type = type
        self.status_code = status_code
        self.details = details or {}
        self.request_id = request_id
        self.url = url


class BadRequestError(ServiceError):
    """The request was refused as invalid; resending it unchanged will fail again."""


class AuthenticationError(BadRequestError):
    """Missing or wrong API key, or an inference key where an admin key is needed."""


class ModelNotFoundError(BadRequestError):
    """The service does not serve the named model."""


class PayloadTooLargeError(BadRequestError):
    """A body, media, image or item limit was exceeded."""


class MediaError(BadRequestError):
    """A media URL was refused, could not be fetched, or is not a decodable image/video."""


class CacheMissError(BadRequestError):
    """The generate node does not hold items sent as null; ``missing`` names them."""

    @property
    def missing(self) -> dict[str, list[str]]:
        value = self.details.get("missing") or {}
        return {str(k): [str(h) for h in v] for k, v in value.items()}


class WeightUpdateError(BadRequestError):
    """A weight update was refused; nothing was loaded and the old weights keep serving."""


class OverloadedError(ServiceError):
    """The service is at capacity (429); retry later."""


class ServerError(ServiceError):
    """A 5xx answer: the service failed or is not ready."""


class FleetPartialFailure(ServerError):
    """A call made on every generate node failed on some of them: ``failed`` lists each with
    its ``url``, ``status`` (0: unreachable), error ``type`` and ``message``; for a weight
    update also which ``step``, and ``details`` the fleet's ``weight_version`` and the nodes
    ``fenced`` after it (see ``tandem_client.fleet``)."""

    @property
    def failed(self) -> list[dict[str, Any]]:
        return list(self.details.get("failed") or [])


_BY_TYPE: dict[str, type[ServiceError]] = {
    error_types.UNAUTHORIZED: AuthenticationError,
    error_types.ADMIN_REQUIRED: AuthenticationError,
    error_types.MODEL_NOT_FOUND: ModelNotFoundError,
    error_types.MM_CACHE_MISS: CacheMissError,
    error_types.OVERLOADED: OverloadedError,
    error_types.PAYLOAD_TOO_LARGE: PayloadTooLargeError,
    error_types.MEDIA_TOO_LARGE: PayloadTooLargeError,
    error_types.IMAGE_TOO_LARGE: PayloadTooLargeError,
    error_types.INVALID_MEDIA: MediaError,
    error_types.MEDIA_SCHEME_NOT_ALLOWED: MediaError,
    error_types.MEDIA_URL_FORBIDDEN: MediaError,
    error_types.MEDIA_FETCH_FAILED: MediaError,
    error_types.MEDIA_NOT_FOUND: MediaError,
    error_types.INVALID_IMAGE: MediaError,
    error_types.INVALID_WEIGHT_UPDATE: WeightUpdateError,
    error_types.WEIGHT_PATH_NOT_ALLOWED: WeightUpdateError,
    error_types.WEIGHT_UPDATE_CONFLICT: WeightUpdateError,
    error_types.WEIGHT_UPDATE_INCOMPLETE: WeightUpdateError,
    error_types.WEIGHT_UPDATE_SEQ_SEEN: WeightUpdateError,
    error_types.WEIGHT_TRANSFER_NOT_CONFIGURED: WeightUpdateError,
    error_types.WEIGHT_CHECKPOINT_UNAVAILABLE: WeightUpdateError,
    error_types.CONTROL_PARTIAL_FAILURE: FleetPartialFailure,
}
"""The types with an exception of their own; any other maps by status (5xx, 429, else 4xx)."""


def error_from_response(
    status_code: int, body: dict[str, Any] | None, url: str | None = None
) -> ServiceError:
    """The typed exception for an error answer (``body`` is the decoded JSON or msgpack)."""
    info = (body or {}).get("error") if isinstance(body, dict) else None
    info = info if isinstance(info, dict) else {}
    type_ = str(info.get("type") or f"http_{status_code}")
    cls = _BY_TYPE.get(type_)
    if cls is None:
        if status_code >= 500:
            cls = ServerError
        elif status_code == 429:
            cls = OverloadedError
        else:
            cls = BadRequestError
    return cls(
        str(info.get("message") or f"HTTP {status_code}"),
        type=type_,
        status_code=status_code,
        details=info.get("details") if isinstance(info.get("details"), dict) else None,
        request_id=info.get("request_id"),
        url=url,
    )

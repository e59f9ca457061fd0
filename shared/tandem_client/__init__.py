"""tandem_client: the coordinator / RL-trainer client for Tandem (httpx + tandem_wire, no vLLM)."""

from .client import AsyncTandemClient
from .errors import (
    AuthenticationError,
    BadRequestError,
    CacheMissError,
    FleetPartialFailure,
    MediaError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    ServerError,
    ServiceError,
    TandemError,
    TransportError,
    WeightUpdateError,
)
from .rollout import RolloutResult
from .sync import TandemClient

__all__ = [
    "AsyncTandemClient",
    "AuthenticationError",
    "BadRequestError",
    "CacheMissError",
    "FleetPartialFailure",
    "MediaError",
    "ModelNotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RolloutResult",
    "ServerError",
    "ServiceError",
    "TandemClient",
    "TandemError",
    "TransportError",
    "WeightUpdateError",
]

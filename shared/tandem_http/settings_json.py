"""Frozen settings dataclasses to and from JSON (how a launcher hands them to its workers)."""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any, TypeVar

__all__ = ["serve_settings", "settings_from_cli", "settings_from_json", "settings_to_json"]

T = TypeVar("T")


def settings_to_json(settings: Any) -> str:
    return json.dumps(asdict(settings))


def settings_from_json(cls: type[T], text: str) -> T:
    """The settings back, lists as tuples; an unknown key is an error (a stale launcher)."""
    data: dict[str, Any] = json.loads(text)
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for key, value in list(data.items()):
        if key not in known:
            raise ValueError(f"unknown {cls.__name__} field {key!r}")
        if isinstance(value, list):
            data[key] = tuple(value)
    return cls(**data)


def settings_from_cli(cls: type[T], args: dict[str, Any]) -> T:
    """The settings from parsed options: those not given keep the dataclass defaults."""
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items() if v is not None}
    return cls(**given)


def serve_settings(app_factory: str, settings: Any, env_name: str) -> None:
    """``run_server`` for a service whose workers build their app from ``settings`` (host,
    port, uds, workers, log_level fields), handed to them as JSON in ``env_name``."""
    from .server import run_server

    run_server(
        app_factory,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        env={env_name: settings_to_json(settings)},
        log_level=settings.log_level,
        uds=settings.uds,
    )

"""Generate serves every control route of the shared table, with the table's method: the door
fans out what the table lists, so a route missing on generate would be a 404 on every node."""

from __future__ import annotations

from fastapi.routing import APIRoute

from tandem_generate.app import create_app
from tandem_generate.settings import GenerateSettings
from tandem_wire.control import CONTROL_ROUTES


def test_generate_serves_every_route_of_the_control_table() -> None:
    app = create_app(GenerateSettings(served_model_names=("m",)), lambda: None)  # type: ignore[arg-type,return-value]
    served = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods}
    missing = [r.path for r in CONTROL_ROUTES if (r.method, r.path) not in served]
    assert missing == []

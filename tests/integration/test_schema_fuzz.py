"""Schema-driven HTTP fuzzing: schemathesis reads each service's ``/openapi.json`` and sends
valid and invalid bodies, parameters and headers to every route of render, generate and the
front door.

Pass: no 5xx, every refusal a typed error body (``{"error": {"type": ...}}``), no hang (each
call is bounded). Seeded (``derandomize``) and bounded: ``TANDEM_SCHEMA_FUZZ_COUNT`` examples per
operation and generation mode (10 here, more in ``make fuzz``). State-changing control routes
are left out: they would pause or reload the session's shared engines; the rest of the control
surface (bodies and refusals) is fuzzed on read-only routes and by ``tests/unit/*/test_fuzz.py``.
The statuses and error types seen are written to ``.cache/fuzz/schema-fuzz.json``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

COUNT = int(os.environ.get("TANDEM_SCHEMA_FUZZ_COUNT", "10"))
REPORT = Path(".cache/fuzz/schema-fuzz.json")
# Each call is bounded: a hang fails the test instead of wedging the run.
CALL_TIMEOUT_S = 60.0
STATE_CHANGING = [
    "/reset_prefix_cache",
    "/pause",
    "/resume",
    "/abort_requests",
    "/init_weight_transfer_engine",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/update_weight_version",
]

SEEN: dict[str, Counter[str]] = {}


@schemathesis.check
def typed_refusal(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx answer is a typed error document."""
    if response.status_code < 400:
        return None
    try:
        error = json.loads(response.content)["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{response.status_code} without a typed error body") from None
    if not isinstance(error, dict) or not isinstance(error.get("type"), str):
        raise AssertionError(f"{response.status_code} error body without a string type")
    return None


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=30)
    return [result.ok() for result in schema.exclude(path=STATE_CHANGING).get_all_operations()]


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    yield
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    table = {service: dict(sorted(seen.items())) for service, seen in SEEN.items()}
    REPORT.write_text(json.dumps({"examples_per_operation": COUNT, "seen": table}, indent=1))
    print("\nschema fuzz (status:error type -> count):", json.dumps(table, indent=1))


def _bounded(case: Any) -> None:
    """A valid generate request without ``max_tokens`` would run to the end of the context on
    the CPU engine: generated requests get a short answer (a cap on what is generated, not a
    change to the schema)."""
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("sampling_params"), dict):
        sampling = body["sampling_params"]
        if isinstance(sampling.get("max_tokens"), int) or "max_tokens" not in sampling:
            sampling["max_tokens"] = 4
        if isinstance(sampling.get("n"), int) and sampling["n"] > 4:
            sampling["n"] = 4


def _call(service: str, case: Any) -> None:
    _bounded(case)
    response = case.call(timeout=CALL_TIMEOUT_S)
    kind = ""
    if response.status_code >= 400:
        try:
            kind = ":" + str(json.loads(response.content)["error"]["type"])
        except (ValueError, KeyError, TypeError):
            kind = ":untyped"
    SEEN.setdefault(service, Counter())[f"{response.status_code}{kind}"] += 1
    case.validate_response(response, checks=[not_a_server_error, typed_refusal])


def _fuzz(service: str, url: str) -> None:
    """Every operation, in both modes: bodies that fit the schema and bodies that do not."""
    failures: list[str] = []
    operations = _operations(url)
    assert operations, f"{url}/openapi.json lists no operation"
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=COUNT,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case: Any) -> None:
                _call(service, case)

            try:
                run()
            except Unsatisfiable:
                continue  # a route without parameters or body has no invalid form
            except Exception as exc:  # every operation is tried; all findings reported
                failures.append(f"{op.label} ({mode.value}): {str(exc)[:2000]}")
    assert not failures, "\n\n".join(failures)


def test_render_schema_fuzz(fleet: Any) -> None:
    _fuzz("render", fleet[1]["render"])


def test_generate_schema_fuzz(fleet: Any) -> None:
    _fuzz("generate", fleet[1]["generate"])


def test_front_door_schema_fuzz(front_door: Any) -> None:
    _fuzz("front", front_door[0])

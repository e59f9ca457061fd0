"""The front door's admin keys: a state-changing control call with an inference key is refused
at the door (nothing reaches a node); an admin's is fanned out under the door's upstream admin
key, and inference calls keep the upstream inference key."""

from __future__ import annotations

import hashlib

import pytest

from tandem_front.app import create_app
from tandem_http import TENANT_HEADER
from tandem_wire.control import CONTROL_ROUTES
from tests.support.asgi import app_client

from .test_front_routing import Texts, fleet, generate_body, settings, winner

pytestmark = pytest.mark.anyio

STATE_CHANGING = sorted(r.path for r in CONTROL_ROUTES if r.changes_state)
READ_ONLY = sorted(r.path for r in CONTROL_ROUTES if not r.changes_state)
BODIES = {
    "/init_weight_transfer_engine": {"init_info": {}},
    "/update_weights": {"update_info": {"path": "x"}},
    "/update_weight_version": {"new_version": "v2"},
}
GENERATE = ("g1", "g2", "g3")
INFERENCE, ADMIN = "inference-key", "admin-key"


def keyed(**kw):
    # The flag on too: admin keys, once set, are the only way in (it changes nothing).
    base = {
        "api_key": INFERENCE,
        "admin_api_key": ("other-admin", ADMIN),
        "upstream_api_key": "up-inference",
        "upstream_admin_api_key": "up-admin",
        "enable_control_routes": True,
    }
    return settings(**{**base, **kw})


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_every_state_changing_route_is_covered():
    assert len(STATE_CHANGING) == 10
    assert {"/abort_requests", "/abort_weight_update"} <= set(STATE_CHANGING)


@pytest.mark.parametrize("path", STATE_CHANGING)
async def test_an_inference_key_changes_nothing_and_reaches_no_node(path):
    f = fleet()
    async with app_client(create_app(keyed(), Texts(), f)) as c:
        r = await c.post(path, json=BODIES.get(path, {}), headers=bearer(INFERENCE))
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "admin_required"
        assert path in r.json()["error"]["message"]
        assert (await c.post(path, json=BODIES.get(path, {}))).status_code == 401
    assert not any(n.seen for n in f.nodes.values())


@pytest.mark.parametrize("path", STATE_CHANGING)
async def test_an_admin_key_is_fanned_out_under_the_upstream_admin_key(path):
    f = fleet()
    async with app_client(create_app(keyed(), Texts(), f)) as c:
        r = await c.post(path, json=BODIES.get(path, {}), headers=bearer(ADMIN))
    assert r.status_code == 200, r.text
    for name in GENERATE:
        seen = [(p, h["authorization"]) for p, _, h in f.nodes[name].seen]
        assert seen == [(path, "Bearer up-admin")], name
    assert not f.nodes["r1"].seen and not f.nodes["r2"].seen


async def test_read_only_control_and_inference_keep_the_inference_keys():
    s = keyed()
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        for path in READ_ONLY:
            # Served to inference keys, as vLLM serves them to any key.
            r = await c.get(path, headers=bearer(INFERENCE))
            assert r.status_code != 403, (path, r.text)
            _, _, headers = f.nodes["g1"].seen[-1]
            assert headers["authorization"] == "Bearer up-inference", path
        # An admin is a superset: its inference calls pass, under the inference upstream key.
        for key in (INFERENCE, ADMIN):
            r = await c.post("/inference/v1/generate", json=generate_body(key), headers=bearer(key))
            assert r.status_code == 200, r.text
            _, _, headers = f.nodes[winner(key, s)].seen[-1]
            assert headers["authorization"] == "Bearer up-inference"


async def test_without_an_upstream_admin_key_the_nodes_get_the_upstream_key():
    f = fleet()
    s = keyed(upstream_admin_api_key=None)
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/pause", headers=bearer(ADMIN))
    assert r.status_code == 200
    assert [h["authorization"] for _, _, h in f.nodes["g2"].seen] == ["Bearer up-inference"]


async def test_with_admin_keys_only_inference_stays_open_and_control_does_not():
    f = fleet()
    s = settings(admin_api_key=(ADMIN,), enable_control_routes=False)
    async with app_client(create_app(s, Texts(), f)) as c:
        r = await c.post("/inference/v1/generate", json=generate_body("x"))
        assert r.status_code == 200
        for headers in ({}, bearer("wrong")):
            r = await c.post("/pause", headers=headers)
            assert (r.status_code, r.json()["error"]["type"]) == (403, "admin_required")
        assert not any(p == "/pause" for n in f.nodes.values() for p, _, _ in n.seen)
        assert (await c.post("/pause", headers=bearer(ADMIN))).status_code == 200


async def test_the_nodes_are_told_which_caller_a_request_is_for_and_callers_cannot_say():
    s = keyed(api_key=(INFERENCE, "other-inference"))
    f = fleet()
    async with app_client(create_app(s, Texts(), f)) as c:
        for key in (INFERENCE, "other-inference"):
            headers = {**bearer(key), TENANT_HEADER: "someone-else"}
            r = await c.post("/inference/v1/generate", json=generate_body(key), headers=headers)
            assert r.status_code == 200, r.text
            _, _, sent = f.nodes[winner(key, s)].seen[-1]
            # The door's upstream key, and the digest of the caller's key as the tenant.
            assert sent["authorization"] == "Bearer up-inference"
            assert sent[TENANT_HEADER] == hashlib.sha256(key.encode()).hexdigest()[:32]

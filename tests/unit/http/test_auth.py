"""ApiKeyMiddleware: Bearer key on every request but the open paths; off without a key."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from fastapi import FastAPI, Request

from tandem_http import (
    TENANT_HEADER,
    ApiKeyMiddleware,
    RequestIdMiddleware,
    install_error_handlers,
    is_admin,
    principal_of,
)

pytestmark = pytest.mark.anyio

KEY = "s3cret-key"


def make_app(api_key: str | None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/work")
    async def work() -> dict[str, str]:
        return {"done": "yes"}

    app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(RequestIdMiddleware)
    return app


def client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.mark.parametrize("api_key", [None, ""])
async def test_no_key_configured_is_open(api_key: str | None) -> None:
    async with client(make_app(api_key)) as c:
        r = await c.get("/work")
    assert r.status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", "Bearer", f"{KEY}"],
    ids=["missing", "wrong-key", "wrong-scheme", "longer-key", "no-token", "no-scheme"],
)
async def test_refused_without_the_right_key(authorization: str | None) -> None:
    headers = {"x-request-id": "auth-1"}
    if authorization is not None:
        headers["authorization"] = authorization
    async with client(make_app(KEY)) as c:
        r = await c.get("/work", headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-request-id"] == "auth-1"
    assert KEY not in r.text
    assert r.json() == {
        "error": {
            "type": "unauthorized",
            "message": "missing or invalid API key",
            "code": 401,
            "request_id": "auth-1",
        }
    }


@pytest.mark.parametrize("scheme", ["Bearer", "bearer"])
async def test_right_key_passes(scheme: str) -> None:
    async with client(make_app(KEY)) as c:
        r = await c.get("/work", headers={"authorization": f"{scheme} {KEY}"})
    assert r.status_code == 200
    assert r.json() == {"done": "yes"}


async def test_health_is_open() -> None:
    async with client(make_app(KEY)) as c:
        r = await c.get("/health")
    assert r.status_code == 200


async def test_refusal_honours_accept() -> None:
    async with client(make_app(KEY)) as c:
        r = await c.get("/work", headers={"accept": "application/vnd.msgpack"})
    assert r.status_code == 401
    assert r.headers["content-type"] == "application/vnd.msgpack"
    assert msgspec.msgpack.decode(r.content)["error"]["type"] == "unauthorized"


async def test_unknown_paths_are_refused_too() -> None:
    # Unauthenticated callers learn nothing about which routes exist.
    async with client(make_app(KEY)) as c:
        r = await c.get("/nowhere")
    assert r.status_code == 401


async def test_several_keys_each_pass_and_are_told_apart() -> None:
    app = FastAPI()
    app.add_middleware(ApiKeyMiddleware, api_key=("k1", "k2"))

    @app.get("/who")
    async def who(request: Request) -> dict[str, str]:
        return {"principal": principal_of(request)}

    async with client(app) as c:
        seen = []
        for key in ("k1", "k2", "k1"):
            r = await c.get("/who", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200
            seen.append(r.json()["principal"])
        assert seen[0] == seen[2] != seen[1] and "k1" not in seen[0]
        assert (await c.get("/who", headers={"authorization": "Bearer k3"})).status_code == 401


def who_app(**keys) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(ApiKeyMiddleware, **keys)

    @app.get("/who")
    async def who(request: Request) -> dict[str, object]:
        return {"principal": principal_of(request), "admin": is_admin(request)}

    return app


async def test_admin_keys_pass_as_admins_and_inference_keys_do_not() -> None:
    app = who_app(api_key=("k1", "k2"), admin_key=("a1", "a2"))
    async with client(app) as c:
        seen = {}
        for key in ("k1", "k2", "a1", "a2"):
            r = await c.get("/who", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200
            seen[key] = r.json()
        assert [seen[k]["admin"] for k in ("k1", "k2", "a1", "a2")] == [False, False, True, True]
        assert len({s["principal"] for s in seen.values()}) == 4
        assert (await c.get("/who")).status_code == 401
        assert (await c.get("/who", headers={"authorization": "Bearer a3"})).status_code == 401


async def test_with_admin_keys_only_other_callers_pass_as_no_one() -> None:
    async with client(who_app(api_key=None, admin_key="a1")) as c:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            r = await c.get("/who", headers=headers)
            assert r.json() == {"principal": "", "admin": False}
        r = await c.get("/who", headers={"authorization": "Bearer a1"})
        assert r.json()["admin"] is True


@pytest.mark.parametrize(
    ("api_key", "admin_key", "enabled", "key", "refusal"),
    [
        (None, None, False, None, "control_routes_disabled"),
        (None, None, True, None, None),
        ("k", None, False, "k", "admin_required"),
        ("k", None, True, "k", None),
        ("k", "a", True, "k", "admin_required"),  # admin keys set: the flag changes nothing
        ("k", "a", False, "a", None),
        (None, "a", True, None, "admin_required"),
    ],
)
async def test_control_access(api_key, admin_key, enabled, key, refusal) -> None:
    from tandem_http import ControlAccess

    access = ControlAccess(api_key, admin_key, enabled)
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_key=admin_key)

    @app.post("/pause")
    async def pause(request: Request) -> dict[str, str]:
        access.check(request, "/pause")
        return {"status": "paused"}

    headers = {"authorization": f"Bearer {key}", "accept": "application/json"} if key else {}
    async with client(app) as c:
        r = await c.post("/pause", headers=headers)
    if refusal is None:
        assert r.json() == {"status": "paused"}
        return
    assert (r.status_code, r.json()["error"]["type"]) == (403, refusal)
    assert "/pause" in r.json()["error"]["message"]


async def test_a_doors_tenant_header_scopes_the_principal_and_nobody_elses_does() -> None:
    # Every caller behind a door reached the nodes under the door's one key: one tenant could
    # tell from a null entry's hit or 409 whether another had sent an image.
    app = FastAPI()

    @app.get("/who")
    async def who(request: Request) -> dict[str, str]:
        return {"principal": principal_of(request)}

    door, caller = "door-key", "caller-key"
    app.add_middleware(ApiKeyMiddleware, api_key=[door, caller], proxy_key=door)

    async def principal(key: str, tenant: str | None = None) -> str:
        headers = {"authorization": f"Bearer {key}"}
        if tenant is not None:
            headers[TENANT_HEADER] = tenant
        async with client(app) as c:
            return (await c.get("/who", headers=headers)).json()["principal"]

    alone = await principal(door)
    a, b = await principal(door, "tenant-a"), await principal(door, "tenant-b")
    assert len({alone, a, b}) == 3
    assert await principal(door, "tenant-a") == a  # stable: a tenant finds its own items
    # A caller with its own key cannot name a tenant, nor be named by the door.
    own = await principal(caller)
    assert await principal(caller, "tenant-a") == own
    assert await principal(door, own) != own

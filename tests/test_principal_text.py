"""A principal is recorded as text (on every event it signs, a deletion's entry, a dashboard
sign-out): one whose text holds a lone surrogate has no UTF-8 form, so no store can hold it. It
was taken (from Python, by `TokenAuth`, from an authenticator) and each write it signed failed
with a bare UnicodeEncodeError; it is refused now where principals are checked, with nothing
stored: `UsageError` from Python and `TokenAuth`, HTTP 401 `unauthenticated` from an
authenticator (`server._auth.Naming`)."""

from __future__ import annotations

import logging

import httpx
import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import DevAuth, TokenAuth, create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from ._seeds import ALICE
from .test_server_common import BOB
from .test_sign_ins import HTTP, _csrf, sign_in, who

ODD: dict[str, tuple[so.Principal, str]] = {
    "principal_id": (so.Principal(authenticator="t", principal_id="eve\udcff"), "principal_id"),
    "issuer": (so.Principal(authenticator="t", principal_id="eve", issuer="i\ud800"), "issuer"),
    "authenticator": (so.Principal(authenticator="t\udfff", principal_id="eve"), "authenticator"),
    "principal_type": (
        so.Principal(authenticator="t", principal_id="eve", principal_type="u\ud800"),
        "principal_type",
    ),
    "attribute": (
        so.Principal(authenticator="t", principal_id="eve", attributes={"g": ["a\udcff"]}),
        "attributes",
    ),
    "attribute key": (
        so.Principal(authenticator="t", principal_id="eve", attributes={"k\udcff": 1}),
        "attributes",
    ),
}


def _refund_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(amount: int) -> str:
        """Refund."""
        return "refunded"

    return scripted_agent("a", [call_tools(call("refund", amount=1)), reply("ok")], tools=[refund])


async def test_a_principal_holding_a_lone_surrogate_is_refused_from_python(store_url: str) -> None:
    """`generate(auth=...)` started a turn as such a principal, and its deletion then blamed a
    `by` the caller never named; every call taking a principal refuses it, nothing stored."""
    async with so.Runtime([_refund_agent()], store=store_url) as rt:
        parked = await rt.generate("a", prompt="go", auth=ALICE)
        sid, (req,) = parked.session_id, parked.pending
        head = await rt.store.head(sid)
        yes = [so.InputResponse(request_id=req.id, option_id="approve")]
        for odd, field in ODD.values():
            said = f"is not valid Unicode text: its {field} holds? a lone surrogate"
            with pytest.raises(so.UsageError, match=f"^auth {said}"):
                await rt.generate("a", prompt="go", auth=odd)
            with pytest.raises(so.UsageError, match=f"^auth {said}"):
                await rt.create_session("a", auth=odd)
            with pytest.raises(so.UsageError, match=f"^auth {said}"):
                await rt.generate(session_id=sid, prompt="more", auth=odd)
            with pytest.raises(so.UsageError, match=f"^principal {said}"):
                await rt.respond(sid, yes, principal=odd)
            with pytest.raises(so.UsageError, match=f"^principal {said}"):
                await rt.send(sid, "yes", principal=odd)
            with pytest.raises(so.UsageError, match=f"^principal {said}"):
                await rt.cancel(sid, principal=odd)
            with pytest.raises(so.UsageError, match=f"^by {said}"):
                await rt.delete_session(sid, by=odd)
        assert [s.id for s in await rt.sessions()] == [sid]
        assert await rt.store.head(sid) == head
        done = await rt.respond(sid, yes, principal=ALICE)
        assert done.status == "completed"


@pytest.mark.parametrize("case", list(ODD))
def test_token_auth_and_dev_auth_refuse_one_when_made(case: str) -> None:
    odd, field = ODD[case]
    said = f"is not valid Unicode text: its {field} holds? a lone surrogate"
    with pytest.raises(so.UsageError, match=f"^API token #2's principal {said}"):
        TokenAuth({"alice-token": ALICE, "eve-token": odd})
    with pytest.raises(so.UsageError, match=f"^DevAuth's principal {said}"):
        DevAuth(odd)


async def test_an_authenticators_principal_holding_one_authenticates_no_one(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Such a principal from an application's authenticator opened sessions, and its deletion
    answered 400 `usage_error` naming a `by` the client never sent; now every route answers
    401 `unauthenticated`, as for a principal naming no one, and the mistake is logged once."""
    odd = ODD["principal_id"][0]
    rt = so.Runtime([_refund_agent()], store=store_url)
    sid = await rt.create_session("a", auth=ALICE)
    head = await rt.store.head(sid)
    app = create_app(rt, auth=lambda request: odd, sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.ERROR, logger="signoff.server"):
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as c,
        ):
            for method, path, body in (
                ("POST", "/v1/sessions", {"agent": "a", "message": "go"}),
                ("GET", "/v1/sessions", None),
                ("POST", f"/v1/sessions/{sid}/cancel", {}),
                ("DELETE", f"/v1/sessions/{sid}", None),
            ):
                r = await c.request(method, path, json=body)
                assert r.status_code == 401, (method, path, r.text)
                assert r.json()["error"]["code"] == "unauthenticated", r.text
            assert [s.id for s in await rt.sessions()] == [sid]
            assert await rt.store.head(sid) == head
    told = [r.getMessage() for r in caplog.records if "answered a principal" in r.getMessage()]
    assert len(told) == 1, told
    assert "is not valid Unicode text: its principal_id holds a lone surrogate" in told[0]


def test_a_token_changed_to_one_signs_no_one_in_and_its_sign_in_is_signed_out(
    store_url: str,
) -> None:
    """A `TokenAuth` whose tokens are changed in place after it checked them (a reloaded
    directory): the dashboard signed such a principal in, its sign-out then answered 500 (the
    audit entry could not be written) and left the cookie working, and the browser's next
    sign-in failed the same way. It signs no one in now; a sign-in made before it changed is
    signed out by the browser's next sign-in, in the store."""
    odd = ODD["principal_id"][0]
    tokens = TokenAuth({"alice-token": ALICE, "bob-token": BOB})
    runtime = so.Runtime([_refund_agent()], store=store_url)
    app = create_app(runtime, auth=tokens, sweep_every=None, close_runtime=True)
    with TestClient(app, base_url=HTTP) as c:
        first = dict([sign_in(c)])
        tokens.tokens["alice-token"] = odd
        assert who(c, first) is None  # the sign-in made before authenticates no one
        c.cookies.clear()
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/login", data={"token": "alice-token", "csrf": _csrf(page.text)})
        assert r.status_code == 401 and "not recognised" in r.text
        assert not any(k.endswith("signoff_token") for k in c.cookies)
        for name, value in first.items():
            c.cookies.set(name, value)
        second = dict([sign_in(c, "bob-token")])  # the same browser: the first is signed out
        tokens.tokens["alice-token"] = ALICE
        assert who(c, first) is None
        assert who(c, second) is not None

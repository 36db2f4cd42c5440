"""A principal is recorded on every event it signs (each turn it starts, each answer it gives):
one of megabytes, from a caller or an authenticator, was stored again and again. Over
`MAX_PRINCIPAL_BYTES` as JSON it is refused (`UsageError`, HTTP 400 `usage_error`) with nothing
stored."""

from __future__ import annotations

import httpx
import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._seeds import ALICE


def _big(size: int = 2_000_000) -> so.Principal:
    return ALICE.model_copy(update={"attributes": {"groups": "g" * size}})


def _refund_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(amount: int) -> str:
        """Refund."""
        return "refunded"

    return scripted_agent("a", [call_tools(call("refund", amount=1)), reply("ok")], tools=[refund])


async def test_a_principal_over_its_bound_is_refused_and_nothing_is_stored(store_url: str) -> None:
    """A caller's attributes of 2,000,000 characters were taken and written with the turn's
    events; refused now where the call takes them, as any malformed principal is."""
    async with so.Runtime([_refund_agent()], store=store_url) as rt:
        with pytest.raises(so.UsageError, match="auth is .* bytes as JSON, over the limit of"):
            await rt.generate("a", prompt="go", auth=_big())
        with pytest.raises(so.UsageError, match="auth is .* bytes as JSON, over the limit of"):
            await rt.create_session("a", auth=_big())
        assert await rt.sessions() == []
        parked = await rt.generate("a", prompt="go", auth=ALICE)
        (req,) = parked.pending
        head = await rt.store.head(parked.session_id)
        yes = [so.InputResponse(request_id=req.id, option_id="approve")]
        with pytest.raises(so.UsageError, match="principal is .* bytes as JSON, over the limit"):
            await rt.respond(parked.session_id, yes, principal=_big())
        with pytest.raises(so.UsageError, match="principal is .* bytes as JSON, over the limit"):
            await rt.send(parked.session_id, "yes", principal=_big())
        with pytest.raises(so.UsageError, match="auth is .* bytes as JSON, over the limit"):
            await rt.generate(session_id=parked.session_id, prompt="more", auth=_big())
        assert await rt.store.head(parked.session_id) == head
        fits = _big(8_000)  # a claims set of a few groups
        done = await rt.respond(parked.session_id, yes, principal=fits)
        assert done.status == "completed"


async def test_an_authenticators_principal_over_its_bound_authenticates_no_one(
    store_url: str,
) -> None:
    """An authenticator handing out a principal of megabytes: each call it made was stored with
    it; then a 400 `usage_error` blamed the client for the server's authenticator (and reads were
    served); now 401 `unauthenticated`, no session opened (`server._auth.Naming`). `TokenAuth`
    refuses one when it is made."""
    from signoff.server import TokenAuth, create_app

    with pytest.raises(so.UsageError, match="API token #1's principal is .* over the limit"):
        TokenAuth({"tok": _big()})
    rt = so.Runtime([_refund_agent()], store=store_url)
    app = create_app(rt, auth=lambda request: _big(), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post("/v1/sessions", json={"agent": "a", "message": "go"})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["code"] == "unauthenticated"
        assert await rt.sessions() == []
    await rt.close()

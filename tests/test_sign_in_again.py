"""Signing in again from a browser already signed in ends its earlier sign-in, in every process
serving the store."""

from __future__ import annotations

from starlette.testclient import TestClient

import signoff as so
from signoff.server._sign_ins import SIGN_OUTS, SIGNED_OUT, Grant, SignOuts
from signoff.stores._audit import AuditRow

from .conftest import make_store
from .test_server_common import ALICE, BOB
from .test_sign_ins import HTTP, JSON, _csrf, dashboard, sign_in, who


def test_signing_in_again_ends_the_browsers_earlier_sign_in(store_url: str) -> None:
    """A browser signed in with one token signs in with another: the first cookie (a copy of
    it kept, say, by whoever used the browser before) no longer signs anyone in, here or in
    another process; a sign-in of another browser goes on."""
    with dashboard(store_url) as one, dashboard(store_url) as two:
        with TestClient(one, base_url=HTTP) as a, TestClient(two, base_url=HTTP) as b:
            name, value = sign_in(a)
            first = {name: value}
            elsewhere = dict([sign_in(b)])
            assert who(b, first) == "Alice (alice)"
            assert who(a, first) == "Alice (alice)"
            second = dict([sign_in(a, "bob-token")])  # the same browser, another token
            assert second[name] != value
            assert who(a, second) == "Bob (bob)"
            assert who(a, first) is None
            assert who(b, first) is None  # in the other process too
            assert who(b, elsewhere) == "Alice (alice)"  # another browser's sign-in goes on


def test_a_failed_sign_in_leaves_the_earlier_one(store_url: str) -> None:
    """A wrong token typed while signed in is only refused: the sign-in held stays."""
    with dashboard(store_url) as app, TestClient(app, base_url=HTTP) as c:
        held = dict([sign_in(c)])
        page = c.get("/_signoff/")
        r = c.post("/_signoff/login", data={"token": "wrong", "csrf": _csrf(page.text)})
        assert r.status_code == 401
        assert who(c, held) == "Alice (alice)"


def _sign_out(client: TestClient) -> None:
    page = client.get("/_signoff/")
    r = client.post("/_signoff/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
    assert r.status_code == 303


def test_a_loop_of_sign_ins_and_outs_keeps_a_bounded_list(store_url: str) -> None:
    """A token holder signing in and out over and over grew every process's list of sign-outs
    (and the store's) by one each time. Past `limit` sign-outs of one principal within the
    sign-in lifetime, a sign-out ends all of its sign-ins made until then, kept as one entry,
    and it may sign in again once those have expired; no cookie signed out signs in again."""
    now = [1_800_000_000.0]
    with (
        dashboard(store_url, clock=lambda: now[0]) as one,
        dashboard(store_url, clock=lambda: now[0]) as two,
        TestClient(one, base_url=HTTP) as a,
        TestClient(two, base_url=HTTP) as b,
    ):
        for app in (one, two):
            app.state.signoff.sign_outs.limit = 3
        bobs = dict([sign_in(b, "bob-token")])
        ended = []
        for _ in range(3):
            a.cookies.clear()
            ended.append(dict([sign_in(a)]))
            _sign_out(a)
            now[0] += 1
        b.cookies.clear()
        kept = dict([sign_in(b)])  # another browser of Alice's, signed in before the fourth
        a.cookies.clear()
        ended.append(dict([sign_in(a)]))
        now[0] += 1
        _sign_out(a)  # the fourth: all of Alice's sign-ins until now end
        for cookies in [*ended, kept]:
            assert who(a, cookies) is None, cookies
            assert who(b, cookies) is None, cookies
        assert who(b, bobs) == "Bob (bob)"
        for app in (one, two):
            assert len(app.state.signoff.sign_outs._ids) <= 3
        a.cookies.clear()
        page = a.get("/_signoff/login")
        r = a.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(page.text)},
            headers=JSON,
        )
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "too_many_sign_ins"
        assert 0 < int(r.headers["retry-after"]) <= 12 * 3600
        assert "signoff_token" not in r.headers.get("set-cookie", "")
        b.cookies.clear()
        sign_in(b, "bob-token")  # another principal signs in as ever
        now[0] += 12 * 3600
        a.cookies.clear()
        again = dict([sign_in(a)])
        assert who(a, again) == "Alice (alice)"
        for cookies in ended:
            assert who(b, cookies) is None  # expired too, now
        for app in (one, two):
            assert app.state.signoff.sign_outs._ids == {}


async def test_many_sign_outs_stay_bounded_and_signed_out(store_url: str) -> None:
    """The list itself, as a process reads it: loops of one principal past the bound keep at
    most `limit` ids (and one entry for all before), every one signed out still refused."""
    store = make_store(store_url)
    await store.open()
    try:
        writer, reader = SignOuts(12 * 3600.0, limit=50), SignOuts(12 * 3600.0, limit=50)
        now = 1_800_000_000.0
        grants = []
        for n in range(400):
            grant = Grant(id=f"id{n}", issued=int(now + n), principal=ALICE)
            await writer.revoke(store, grant, now + n)
            assert await reader.revoked(store, grant, now + n)
            grants.append(grant)
        for signs_out in (writer, reader):
            assert len(signs_out._ids) <= 50
            for grant in grants:
                assert await signs_out.revoked(store, grant, now + 400), grant
    finally:
        await store.close()


IDP_A = so.Principal(
    authenticator="token",
    principal_id="alice",
    issuer="https://idp-a.example",
    attributes={"name": "Alice A"},
)
IDP_B = IDP_A.model_copy(update={"issuer": "https://idp-b.example", "attributes": {"name": "B"}})
SERVICE = IDP_A.model_copy(update={"principal_type": "service", "attributes": {"name": "S"}})


def test_a_loop_holds_only_its_own_principal_not_another_issuers_or_types(
    store_url: str,
) -> None:
    """Sign-outs were counted by authenticator and id alone: a principal looping sign-in and
    sign-out past the limit ended the sign-ins of another issuer's principal of the same id (or
    another type's) and held it out of signing in. Principals are told apart as everywhere, by
    their full identity, and the entries say the issuer and type."""
    tokens = {"a-token": IDP_A, "b-token": IDP_B, "s-token": SERVICE}
    now = [1_800_000_000.0]
    with (
        dashboard(store_url, tokens, clock=lambda: now[0]) as one,
        dashboard(store_url, tokens, clock=lambda: now[0]) as two,
        TestClient(one, base_url=HTTP) as a,
        TestClient(two, base_url=HTTP) as b,
    ):
        for app in (one, two):
            app.state.signoff.sign_outs.limit = 3
        others = [dict([sign_in(b, "b-token")])]
        b.cookies.clear()
        others.append(dict([sign_in(b, "s-token")]))
        for _ in range(4):
            a.cookies.clear()
            sign_in(a, "a-token")
            _sign_out(a)
            now[0] += 1
        assert [who(c, cookies) for c in (a, b) for cookies in others] == [
            "B (alice)",
            "S (alice)",
        ] * 2
        for token in ("b-token", "s-token"):
            b.cookies.clear()
            sign_in(b, token)  # not held: 303
        a.cookies.clear()
        page = a.get("/_signoff/login")
        r = a.post(
            "/_signoff/login", data={"token": "a-token", "csrf": _csrf(page.text)}, headers=JSON
        )
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_sign_ins"
        entries = one.state.signoff.runtime.audit_sync(stream="dashboard:sign-outs")
        assert {(e.data["issuer"], e.data["principal_type"]) for e in entries} == {
            ("https://idp-a.example", "user")
        }
        assert "upto" in entries[-1].data


async def test_sign_outs_read_again_tell_principals_apart(store_url: str) -> None:
    """A process reading the sign-outs afresh (a restart) tells the principals apart too."""
    store = make_store(store_url)
    await store.open()
    try:
        writer, reader = SignOuts(12 * 3600.0, limit=2), SignOuts(12 * 3600.0, limit=2)
        now = 1_800_000_000
        others = [
            Grant(id=f"o{n}", issued=now, principal=p) for n, p in enumerate((IDP_B, SERVICE))
        ]
        for n in range(3):
            await writer.revoke(store, Grant(id=f"a{n}", issued=now + n, principal=IDP_A), now + n)
        for signs_out in (writer, reader):
            for grant in others:
                assert not await signs_out.revoked(store, grant, now + 3)
                assert signs_out.held(grant.principal, now + 3) is None
            early = Grant(id="a-other-browser", issued=now, principal=IDP_A)
            assert await signs_out.revoked(store, early, now + 3)
            assert signs_out.held(IDP_A, now + 3) is not None
    finally:
        await store.close()


async def test_older_entries_without_issuer_or_type_are_still_honoured(store_url: str) -> None:
    """Entries written before the issuer and type were recorded name a principal by its
    authenticator and id alone: read again, they end what they ended then, for every principal
    spelled so, and hold them until those sign-ins expire."""
    store = make_store(store_url)
    await store.open()
    now = 1_800_000_000
    old = {"authenticator": "token", "principal_id": "alice"}
    rows = [
        {"sign_in": "old-1", "issued": now - 10, **old},
        {"sign_in": "old-2", "issued": now - 5, "upto": now - 4, **old},
        {"sign_in": "old-3", "issued": now - 2, **old},
    ]
    try:
        await store.record_audit(
            [
                AuditRow(stream=SIGN_OUTS, type=SIGNED_OUT, at=now - 1, seq=None, data=data)
                for data in rows
            ]
        )
        reader = SignOuts(12 * 3600.0)
        for principal in (ALICE, IDP_A, SERVICE):
            before = Grant(id="unrecorded", issued=now - 6, principal=principal)
            assert await reader.revoked(store, before, now)
            assert await reader.revoked(store, Grant("old-3", now - 2, principal), now)
            assert not await reader.revoked(store, Grant("new", now - 1, principal), now)
            assert reader.held(principal, now) is not None
        assert reader.held(BOB, now) is None
        assert reader._ids.keys() == {"old-3"}
    finally:
        await store.close()

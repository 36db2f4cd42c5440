"""A snapshot whose session fields have types the fold never gives them (`seq` text, `ttl` text,
a queued message that is a number, a candidate that is one), or that is another session's
(a restore that mixed rows up), is a `StoreError` naming the session as it is read, on either
store, and a 503 `store_error` over HTTP. Before, it loaded, and failed later as a bare
TypeError or KeyError out of `state` or `generate` (a 500 `internal_error` over HTTP); one of
another session loaded as that session, and `generate` failed as SessionBusy or
UnknownSession. Nothing is written."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import signoff as so
from signoff._exceptions import StoreError
from signoff.server import TokenAuth, create_app
from signoff.stores._codec import pack_bytes

from .test_snapshot_calls_damaged import workflow
from .test_store_edited_rows import edit, session_rows

ALICE = so.Principal(authenticator="token", principal_id="alice")


def _set(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda s: s.update(fields)


DAMAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "seq text": lambda s: s.update(seq=str(s["seq"])),
    "seq null": _set(seq=None),
    "seq negative": _set(seq=-1),
    "ttl text": _set(ttl="3600"),
    "ttl more than a float holds": _set(ttl=10**400),
    "created_at text": _set(created_at="2024"),
    "created_at NaN": _set(created_at=math.nan),
    "updated_at null": _set(updated_at=None),
    "updated_at infinite": _set(updated_at=math.inf),
    "agent a number": _set(agent=5),
    "parent a number": _set(parent=5),
    "approved tools text": _set(approved_tools="abc"),
    "model responses text": _set(model_responses="3"),
    "queued a number": _set(queued=[1]),
    "queued without its message": _set(queued=[{"x": 1}]),
    "queued an object": _set(queued={"message": "hi"}),
    "a candidate a number": _set(candidates={"c": 1}),
    "a candidate without its request": _set(candidates={"c": {"at": 1.0}}),
    "a candidate's time text": _set(candidates={"c": {"request_id": "req_1", "at": "x"}}),
    "owed a number": _set(owed={"ses_1": 5}),
    "short text": _set(short={"ses_1": "trn_1"}),
    "headroom text": _set(headroom={"max_tokens": "9"}),
    "parent spent text": _set(parent_spent={"max_tokens": "1"}),
    "lapsed text": _set(lapsed="false"),
    "earlier requests a number": _set(earlier_requests=0),
    "limit grants text": _set(limit_grants="2"),
    "limit grants a fraction": _set(limit_grants=1.5),
    "a key text": _set(keys={"k": "ab"}),
    # A keyed repeat read these with a bare IndexError or ValueError (a 500 over HTTP).
    "a key of one item": _set(keys={"k": ["asked"]}),
    "a key's first seq text": _set(keys={"k": ["asked", "trn_1", "x"]}),
    "a key's turn a number": _set(keys={"k": ["asked", 5, 2]}),
    "a key's hops text": _set(keys={"k": ["asked", "trn_1", 2, "x"]}),
    "a key of five items": _set(keys={"k": ["asked", "trn_1", 2, 0, 0]}),
    "the turn's steps text": lambda s: s["turn"].update(steps="x"),
    "the turn's status unknown": lambda s: s["turn"].update(status="bogus"),
    "the turn's first seq text": lambda s: s["turn"].update(first_seq="x"),
    "a request raising to less than none": lambda s: s["requests"][0].update(
        raise_to={"max_tokens": -1}
    ),
    "a request raising to text": lambda s: s["requests"][0].update(raise_to={"max_tokens": "1"}),
    "a request raising another budget": lambda s: s["requests"][0].update(raise_to={"ttl": 1}),
    "a request raising to a list": lambda s: s["requests"][0].update(raise_to=[1]),
    "raised text": _set(raised={"max_tokens": "11000"}),
    "raised tokens a fraction": _set(raised={"max_tokens": 1.5}),
    "raised cost infinite": _set(raised={"max_cost_usd": math.inf}),
    "raised a flag": _set(raised={"max_tokens": True}),
    "raised a list": _set(raised=[11000]),
    "requests an object": _set(requests={}),
}


def write_snapshot(url: str, sid: str, snapshot: dict[str, Any]) -> None:
    """Store `snapshot` as session `sid`'s, as a hand edit or a half-restored copy would."""
    edit(
        url,
        "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
        "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
        "data = excluded.data",
        snapshot["seq"] if type(snapshot["seq"]) is int else 1,
        pack_bytes(snapshot),
        sid,
    )


async def parked(
    url: str, auth: so.Principal | None = None
) -> tuple[so.GenerateResult, dict[str, Any]]:
    """A session of `workflow` waiting for its answer, and its snapshot as the fold writes it."""
    async with so.Runtime([workflow([])], store=url) as rt:
        result = await rt.generate("wf", prompt="go", auth=auth)
        assert result.status == "waiting"
        return result, (await rt.state(result.session_id)).to_snapshot()


@pytest.mark.parametrize("damage", list(DAMAGES))
async def test_a_snapshot_field_of_the_wrong_type_is_a_store_error(
    store_url: str, damage: str
) -> None:
    waiting, snapshot = await parked(store_url)
    sid = waiting.session_id
    DAMAGES[damage](snapshot)
    write_snapshot(store_url, sid, snapshot)
    before = session_rows(store_url, sid)
    answer = so.InputResponse(request_id=waiting.pending[0].id, option_id="yes")
    async with so.Runtime([workflow([])], store=store_url) as rt:
        for attempt in (
            lambda: rt.state(sid),
            lambda: rt.respond(sid, [answer]),
            lambda: rt.generate(session_id=sid, prompt="and then"),
        ):
            with pytest.raises(StoreError, match=f"session '{sid}', its snapshot") as info:
                await attempt()
            assert type(info.value) is StoreError, info.value
    assert session_rows(store_url, sid) == before


async def test_fields_of_every_type_the_fold_gives_load(store_url: str) -> None:
    """The control: the same fields at values the fold does give them (a whole `ttl`, numbers
    a child's creation records, a message queued) load, and the turn goes on: answered, it
    ends, and the queued message starts the next."""
    waiting, snapshot = await parked(store_url)
    sid = waiting.session_id
    snapshot.update(
        ttl=86_400,
        created_at=int(snapshot["created_at"]),
        owed={"ses_gone": snapshot["turn"]["id"]},
        short={"ses_gone2": [snapshot["turn"]["id"], {"total_tokens": 3}]},
        headroom={"max_tokens": 1_000_000, "max_cost_usd": 5.0},
        parent_spent={"max_tokens": 0, "max_cost_usd": 0.0},
        queued=[{"message": "after", "principal": None}],
        limit_grants=0,
        lapsed=False,
        # Each form `_idempotency` lists a key's entry in.
        keys={
            "k1": ["a", None],
            "k2": ["a", snapshot["turn"]["id"], 3],
            "k3": ["a", "", None],
            "k4": ["a", "trn_earlier"],
            "k5": ["a", snapshot["turn"]["id"], None, 0],
        },
    )
    write_snapshot(store_url, sid, snapshot)
    answer = so.InputResponse(request_id=waiting.pending[0].id, option_id="yes")
    async with so.Runtime([workflow([])], store=store_url) as rt:
        state = await rt.state(sid)
        assert (state.ttl, state.queued) == (86_400, [{"message": "after", "principal": None}])
        done = await rt.respond(sid, [answer])
    # The answered turn ended and the queued message started the next (whose reply the
    # scripted model does not have: that turn fails as a model error, not as the store).
    assert done.turn_id != waiting.turn_id
    assert done.error is not None and done.error["code"] == "model_error", done


async def test_a_snapshot_of_another_session_is_a_store_error(store_url: str) -> None:
    """Session A's row holding B's snapshot does not load as B (`state(A).id` was B's, and
    `generate` for A failed as SessionBusy); B, whose own snapshot it is, still reads."""
    one, _ = await parked(store_url)
    two, theirs = await parked(store_url)
    a, b = one.session_id, two.session_id
    write_snapshot(store_url, a, theirs)
    before = session_rows(store_url, a), session_rows(store_url, b)
    async with so.Runtime([workflow([])], store=store_url) as rt:
        for attempt in (lambda: rt.state(a), lambda: rt.generate(session_id=a, prompt="for A")):
            with pytest.raises(StoreError, match=f"session '{a}', its snapshot: .*'{b}'"):
                await attempt()
        assert (await rt.state(b)).id == b
    assert (session_rows(store_url, a), session_rows(store_url, b)) == before


async def test_over_http_a_damaged_snapshot_is_a_store_error_not_a_500(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'http.db'}"
    waiting, snapshot = await parked(url, ALICE)
    sid = waiting.session_id
    write_snapshot(url, sid, {**snapshot, "seq": str(snapshot["seq"])})
    async with so.Runtime([workflow([])], store=url) as rt:
        app = create_app(rt, auth=TokenAuth({"t": ALICE}), sweep_every=None)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            got = await client.get(f"/v1/sessions/{sid}", headers={"Authorization": "Bearer t"})
    assert got.status_code == 503, got.text
    assert got.json()["error"]["code"] == "store_error"


def test_the_turn_statuses_a_snapshot_is_checked_by_are_the_turns() -> None:
    from typing import get_args

    from signoff._snapshot_fields import TURN_STATUSES
    from signoff._state_parts import TurnStatus

    assert TURN_STATUSES == get_args(TurnStatus)

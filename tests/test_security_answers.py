"""Answer batches as a resource attack: a call's answers were checked for repeats in quadratic
time and each unknown id cost a store read, so one 4 MiB body of 70,000 made-up ids held the
server for minutes (and the store for a read each). A call answers at most `MAX_ANSWERS`
requests; more is refused up front (`InvalidAnswer`, HTTP 422 `invalid_answer`), reading and
changing nothing, from Python and over HTTP alike.
"""

from __future__ import annotations

import pytest

import signoff as so
from signoff._answering import MAX_ANSWERS

from ._security import Served, World, forged, served, snapshot, world
from .test_server_common import ALICE, auth

__all__ = ["served", "world"]  # the fixtures, used by name


def test_the_bound_is_far_above_what_a_turn_asks() -> None:
    assert MAX_ANSWERS == 1000


async def test_too_many_answers_are_refused_before_anything_is_read(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = world.rt
    reads: list[str] = []
    real = rt.store.get_request

    async def counted(request_id: str) -> object:
        reads.append(request_id)
        return await real(request_id)

    before = await snapshot(rt)
    monkeypatch.setattr(rt.store, "get_request", counted)
    ids = [world.ra] + [forged() for _ in range(MAX_ANSWERS)]
    with pytest.raises(so.InvalidAnswer, match=f"at most {MAX_ANSWERS} answers") as refused:
        await rt.respond(
            world.a, [so.InputResponse(request_id=i, option_id="approve") for i in ids]
        )
    assert refused.value.request_ids == []  # not 1001 ids echoed back
    with pytest.raises(so.InvalidAnswer, match=f"at most {MAX_ANSWERS} answers"):
        await rt.generate(
            session_id=world.a,
            approvals=[so.Decision(id=i, approved=True) for i in ids],
            auth=ALICE,
        )
    assert reads == []
    # At the bound the answers are judged as ever: the made-up ids are unknown.
    with pytest.raises(so.UnknownRequest):
        await rt.respond(
            world.a,
            [so.InputResponse(request_id=i, option_id="approve") for i in ids[:MAX_ANSWERS]],
            principal=ALICE,
        )
    monkeypatch.undo()
    assert await snapshot(rt) == before


async def test_too_many_answers_over_http_are_a_422(served: Served) -> None:
    w = served.world
    before = await snapshot(w.rt)
    ids = [w.ra] + [forged() for _ in range(MAX_ANSWERS)]
    for path, body in (
        ("responses", {"inputResponses": [{"requestId": i, "optionId": "approve"} for i in ids]}),
        ("approvals", {"approvals": [{"id": i, "approved": True} for i in ids]}),
    ):
        r = await served.client.post(
            f"/v1/sessions/{w.a}/{path}", json=body, headers=auth("alice-token")
        )
        assert r.status_code == 422, (path, r.text[:300])
        assert r.json()["error"]["code"] == "invalid_answer"
        assert f"at most {MAX_ANSWERS}" in r.json()["error"]["message"]
    assert await snapshot(w.rt) == before


async def test_edited_arguments_wrong_in_many_ways_get_a_short_refusal(served: Served) -> None:
    """Edited arguments with 150,000 unknown keys were refused with every problem listed: an
    answer of 6 MB (twice the body) that took seconds to write. The refusal names the first few
    problems and counts the rest; nothing changes."""
    w = served.world
    before = await snapshot(w.rt)
    edited = {"order_id": "1042", "amount": 10, "reason": "r", **{f"k{i}": i for i in range(5000)}}
    item = {"requestId": w.ra, "optionId": "approve", "editedInput": edited}
    r = await served.client.post(
        f"/v1/sessions/{w.a}/responses",
        json={"inputResponses": [item]},
        headers=auth("alice-token"),
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_answer", r.text[:300]
    message = r.json()["error"]["message"]
    assert len(message) < 2000, len(message)
    assert "k0: Extra inputs are not permitted" in message
    assert "and 4990 more" in message, message
    assert await snapshot(w.rt) == before

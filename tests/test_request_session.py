"""A request read by id for a caller who named it (`signoff._request_session`): its session's
id read alone first, the request read whole only when it is of the session named."""

from __future__ import annotations

from typing import Any

import pytest

from signoff._request_session import request_in
from signoff.stores import Commit, Store

from .test_store_conformance import approval, new_session


async def _two_requests(store: Store) -> tuple[str, str]:
    """Two sessions, each with one open request (`req_a`, `req_b`); their ids."""
    s1, s2 = await new_session(store), await new_session(store)
    for sid, rid in ((s1, "req_a"), (s2, "req_b")):
        await store.commit(
            Commit(session_id=sid, expected_seq=1, events=[], new_requests=[approval(sid, rid)])
        )
    return s1, s2


@pytest.mark.parametrize("alone", [True, False], ids=["request_session", "without"])
async def test_a_request_of_another_session_is_not_read_whole(
    store: Store, monkeypatch: pytest.MonkeyPatch, alone: bool
) -> None:
    """Another session's request is None, as a missing one is, and with `request_session`
    (both built-in stores) is not read whole; the session's own is read whole once. A store
    of the application's own without it has each request read whole, once."""
    s1, _ = await _two_requests(store)
    if not alone:
        monkeypatch.setattr(store, "request_session", None)  # as if it had none
    real = store.get_request
    read: list[str] = []

    async def get_request(request_id: str) -> Any:
        read.append(request_id)
        return await real(request_id)

    monkeypatch.setattr(store, "get_request", get_request)
    for rid in ("req_b", "req_c"):
        assert await request_in(store, rid, s1) is None, rid
    assert read == ([] if alone else ["req_b", "req_c"])
    read.clear()
    own = await request_in(store, "req_a", s1)
    assert own is not None and own.request.id == "req_a"
    assert read == ["req_a"]

"""The store's channel memos (`keep_channel_memos`) take JSON text or None for each value, as
`Shared` writes them: anything else is a `UsageError` naming it, on both stores, and nothing is
kept (not a value one store keeps and the other refuses, or reads back as other text)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import signoff as so
from signoff.stores import Store

BAD: list[Any] = [5, True, 1.5, b'"x"', {"channel": "C1"}, ["x"], "\x00", '"a\x00b"']


@pytest.mark.parametrize("bad", BAD, ids=repr)
async def test_a_memo_value_that_is_not_json_text_is_refused_and_keeps_nothing(
    store: Store, bad: Any
) -> None:
    memos: Any = store  # both stores have them; the Store protocol does not name them
    keep, read = memos.keep_channel_memos, memos.channel_memo
    await keep({"hub.ch:post:r1": '{"ts":"1"}'}, time.time())
    with pytest.raises(so.UsageError, match="hub.ch:post:r2"):
        await keep({"hub.ch:post:r1": None, "hub.ch:post:r2": bad}, time.time())
    assert await read("hub.ch:post:r1") == '{"ts":"1"}'  # the memo dropped beside it stays
    assert await read("hub.ch:post:r2") is None

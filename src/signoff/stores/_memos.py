"""The names and values of the memos a channel keeps in the store for whichever hub delivers to
it next (`keep_channel_memos`, `channel_memo`): rows of `channel_claims` beside the claims, told
apart from them by a `:` that no claim's name has, each holding JSON text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .._exceptions import UsageError

__all__ = ["checked_memo_names", "checked_memos"]


def checked_memo_names(names: Iterable[object]) -> list[str]:
    """`names` as a list, each a string with a `:` (`<hub>.<channel>:<key>`); a `UsageError`
    for one without, which would name a claim and overwrite it."""
    found: list[str] = []
    for name in names:
        if not isinstance(name, str) or ":" not in name:
            raise UsageError(f"a channel memo's name is `<hub>.<channel>:<key>`, not {name!r}")
        found.append(name)
    return found


def checked_memos(memos: Mapping[str, object]) -> list[str]:
    """`checked_memo_names` of `memos`, whose values must each be JSON text (or None, to drop
    the memo): anything else is a `UsageError` naming it, before anything is kept. One store
    kept a number or bytes as text the other refused, and text holding NUL (which JSON never
    does) PostgreSQL refuses while SQLite keeps it."""
    names = checked_memo_names(memos)
    for name in names:
        value = memos[name]
        if value is None:
            continue
        bad = not isinstance(value, str) or "\x00" in value
        if isinstance(value, str) and not bad:
            try:
                json.loads(value)
            except ValueError:
                bad = True
        if bad:
            raise UsageError(
                f"the channel memo {name!r} must be JSON text or None, not {str(value)[:60]!r}"
            )
    return names

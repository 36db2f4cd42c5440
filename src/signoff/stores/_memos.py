"""The names of the memos a channel keeps in the store for whichever hub delivers to it next
(`keep_channel_memos`, `channel_memo`): rows of `channel_claims` beside the claims, told apart
from them by a `:` that no claim's name has."""

from __future__ import annotations

from collections.abc import Iterable

from .._exceptions import UsageError

__all__ = ["checked_memo_names"]


def checked_memo_names(names: Iterable[object]) -> list[str]:
    """`names` as a list, each a string with a `:` (`<hub>.<channel>:<key>`); a `UsageError`
    for one without, which would name a claim and overwrite it."""
    found: list[str] = []
    for name in names:
        if not isinstance(name, str) or ":" not in name:
            raise UsageError(f"a channel memo's name is `<hub>.<channel>:<key>`, not {name!r}")
        found.append(name)
    return found

"""A drive of a session with what its subagent tree needs after it (`driven`): kept apart from
`_child_sessions`, which the runtime's other child hooks fill."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from . import _child_sessions
from ._child_closes import parents_left_to_holders
from ._exceptions import UnknownSession

if TYPE_CHECKING:
    from ._results import GenerateResult
    from ._runtime import Runtime

__all__ = ["driven"]


async def driven(rt: Runtime, session_id: str, drive: Awaitable[GenerateResult]) -> GenerateResult:
    """`drive`, a drive of the session, then `after_drive`; a drive that raises still counts
    what a subagent spent (`counted_once_stopped`): the cancel left that to the drive's end.
    Its tree deleted once the turn gave its lease back (a prune) leaves `after_drive` nothing
    to do: the result stands, whichever session of the tree it found gone first."""
    try:
        with parents_left_to_holders(False):  # its turn's calls wait as anywhere: not a read's
            result = await drive
    except BaseException:
        with contextlib.suppress(Exception):
            await _child_sessions.counted_once_stopped(rt, session_id)
        raise
    try:
        await _child_sessions.after_drive(rt, session_id)
    except UnknownSession:
        if await rt.store.head(session_id) is not None:
            raise  # a session it looked at is gone, but not its tree: not a deletion's doing
    return result

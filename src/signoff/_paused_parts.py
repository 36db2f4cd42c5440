"""A model reply the provider paused (Anthropic's `pause_turn`): each part journaled as it
arrives (`model.paused`, through `ModelRequest.on_pause`), and read back from the turn for a
drive that resumes the reply (`ModelRequest.paused`). Apart from `_model_step`, which calls the
model."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from ._exceptions import ModelError
from ._recording import DriverPart
from ._state_parts import TurnState, kept_usage
from ._sync import to_end
from ._types import Usage, billable, plain_usage
from .models import PausedPart

__all__ = ["journal_pauses", "paused_parts"]


def journal_pauses(
    driver: DriverPart,
    read_through: int,
    journaled: list[Usage],
    then: Callable[[PausedPart], Awaitable[int | None]],
) -> Callable[[PausedPart], Awaitable[int | None]]:
    """What journals each part of the reply that the provider paused (`model.paused`), as it
    arrives and before the model asks for the next: billed, it is counted once, and a drive
    resumed after a crash continues from it instead of paying for it again. What each cost is
    added to `journaled`; the model read the session's events up to `read_through`. Returns
    what `then` says of the part once counted: the output cap of the next part (None: none),
    or it raises `BudgetSpent` when the budgets leave none."""

    async def journal(part: PausedPart) -> int | None:
        usage = part.usage
        if not isinstance(usage, Usage) or (usage != Usage() and billable(usage) is None):
            raise ModelError(f"model's paused part has usage that cannot count: {usage!r}")
        data = {
            "model": part.model,
            "data": part.data,
            "usage": plain_usage(usage).model_dump(),
            "read_through": read_through,
        }
        try:
            text = json.dumps(data, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ModelError(
                f"model's paused part is not plain JSON: {type(exc).__name__}: {exc}", usage=usage
            ) from None
        most = driver.agent.limits.max_response_bytes
        if len(text) > most:  # ASCII JSON: at least as long as it is stored
            raise ModelError(
                f"model's paused part is over {most} bytes (max_response_bytes)", usage=usage
            )
        held = driver.held
        await to_end(driver.record([("model.paused", data)]), lambda: bool(held and held.lost))
        journaled.append(usage)
        return await then(part)

    return journal


def paused_parts(turn: TurnState) -> tuple[PausedPart, ...]:
    """The parts of the reply being made that the provider paused and the log journaled, to
    continue from: the last run of one model's parts read after the turn's last message, as
    parts before them belong to a reply that started over (a message came, which the reply
    must read, or the model changed); none when one is not of the form journaled."""
    start = len(turn.paused)
    for p in reversed(turn.paused):
        read = p.get("read_through")
        if not isinstance(read, int) or turn.last_message_seq > read:
            break
        if p.get("model") != turn.paused[-1].get("model"):
            break
        start -= 1
    try:
        return tuple(
            PausedPart(
                model=str(p["model"]),
                data=dict(p["data"]),
                usage=kept_usage(p["usage"], strict=False),
            )
            for p in turn.paused[start:]
        )
    except (KeyError, TypeError, ValueError):
        return ()

"""`TerminalTextChannel`: the CLI's inline prompts as a `TextChannel`, each request shown is
asked on the terminal, the prompt read in a thread so the hub goes on while the person types."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._exceptions import (
    AnswerError,
    SchemaVersionError,
    SignoffError,
    StoreDamaged,
    StoreError,
    StoreGone,
    UsageError,
)
from .._results import Outcome
from .._types import InputRequest, InputResponse, Principal
from ._base import logger
from ._retries import doubled
from ._state import ChannelState
from ._tty import in_daemon_thread
from .terminal import TerminalChannel, printable
from .text import TextChannel

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["TerminalTextChannel"]

PAUSE = 0.5  # seconds: the first pause before asking again after a store failure, doubled
MOST_PAUSE = 10.0  # seconds: the longest of those pauses
LASTING = (StoreGone, StoreDamaged, SchemaVersionError)  # waiting does not mend these


class TerminalTextChannel(TextChannel):
    """The CLI's inline prompts as a text channel: each request shown is asked on the terminal.

    It wraps a `TerminalChannel` (the one `signoff chat` uses) and answers as `principal`.
    A prompt left unanswered (end of input) leaves the request pending; a hub started again
    asks it again.
    """

    name = "terminal"

    def __init__(
        self,
        terminal: TerminalChannel | None = None,
        *,
        principal: Principal | None = None,
        name: str | None = None,
        accepts: Callable[[InputRequest], bool] | None = None,
    ) -> None:
        super().__init__(name=name, accepts=accepts)
        if terminal is not None and not isinstance(terminal, TerminalChannel):
            raise UsageError(f"terminal must be a TerminalChannel or None, not {terminal!r}")
        if principal is not None and not isinstance(principal, Principal):
            raise UsageError(f"principal must be a so.Principal or None, not {principal!r}")
        self.terminal = terminal or TerminalChannel()
        self.principal = principal
        self._asking: asyncio.Task[None] | None = None
        self._asked: str | None = None  # the request this process last put to a prompt
        self._reading: str | None = None  # the request whose prompt waits for a line now
        # That prompt's read, kept when the hub stops: its thread cannot be stopped, and a hub
        # started again takes the line it reads rather than asking in a second read.
        self._out: tuple[InputRequest, asyncio.Future[InputResponse | None]] | None = None
        self._noted: str | None = None  # the last one told of as closed while it waited
        self._not_taken: str | None = None  # the request whose answer an error refused for now

    async def send_text(self, text: str) -> None:
        # printable: another reviewer's reason or answer must not steer the terminal
        self.terminal.console.print(printable(text))

    def bind(self, runtime: Runtime, state: ChannelState, *, hub: str = "") -> None:
        """As `Channel.bind`; a terminal given no clock counts deadlines by the runtime's,
        which set them (on PostgreSQL the database's)."""
        super().bind(runtime, state, hub=hub)
        if self.terminal.clock is None:
            self.terminal.clock = runtime.now

    async def _show_unseen(self) -> None:
        """As `TextChannel`'s, but the memo of the request shown outlives the process and its
        prompt does not: one this process has not asked is asked, also after a restart."""
        current = self.current
        if current is not None and current.id not in (self._asked, *self._untold):  # untold: closed
            await self._show_current()
        else:
            await super()._show_unseen()

    async def show(self, request: InputRequest) -> None:
        # Asked in a task: the hub goes on while the person types. One prompt reads the
        # terminal at a time: while one is out (its request closed elsewhere, or answered and
        # this is the next), it takes the next line, and its task then asks the one shown.
        if self._asking is not None and not self._asking.done():
            reading = self._reading
            if reading not in (None, request.id, self._noted):  # said once per prompt
                self._noted = reading
                self.terminal.console.print(
                    "  [dim]what you type at the prompt above no longer counts; "
                    "the next request is asked after it[/]"
                )
            return
        self._asking = asyncio.create_task(self._ask(request), name=f"signoff-ask-{request.id}")

    async def _ask(self, request: InputRequest) -> None:
        """Ask `request` (or first take the line of the prompt a stopped hub left out), then
        each request shown next that no prompt has asked, until one is left unanswered (end of
        input) or its answer leaves it on show (refused, or counted); one whose answer was spent
        as its deadline escalated it (`stale`) is asked again, for the group to answer, and so
        is one whose answer an error refused for now (a busy store, an answer of the wrong
        shape): no prompt would be out for it, nor for the requests after it. A store failure
        that passes (busy, locked) does not end them either: the one shown is asked after a
        pause (`_failed_for_now`)."""
        failures = 0
        while True:
            again = None
            try:
                if self._out is None:
                    ask = functools.partial(self.terminal.ask, request)
                    read = in_daemon_thread(ask, f"signoff-ask-{request.id}")
                    self._out = (request, asyncio.ensure_future(read))
                request, reading = self._out  # a prompt left out by a hub stopped: its line
                self._asked = self._reading = request.id
                try:
                    response = await asyncio.shield(reading)
                finally:
                    self._reading = None
                    if reading.done():  # else the hub stopped: a hub started again takes it
                        self._out = None
                if response is None:
                    return
                if await self._still_shown(request):
                    self._not_taken = None
                    taken = await self.answer(request, response, self.principal)
                    if taken is not None and taken.outcome == "stale" and not taken.applied:
                        again = await self._open_here(request)
                    elif taken is None and self._not_taken == request.id:
                        # shown still: not dropped as its session was deleted, nor closed
                        again = next((r for r in self._queue[:1] if r.id == request.id), None)
            except StoreError as exc:
                if isinstance(exc, LASTING):
                    logger.exception("terminal channel: asking %s failed", request.id)
                    return
                failures += 1
                again = await self._failed_for_now(request, exc, failures)
                if again is None:
                    return
                request = again
                continue
            except Exception:
                logger.exception("terminal channel: asking %s failed", request.id)
                return
            failures = 0
            if again is not None:
                request = again
                continue
            current = self.current
            if current is None or current.id == request.id:
                return
            request = current

    async def _failed_for_now(
        self, request: InputRequest, exc: StoreError, failures: int
    ) -> InputRequest | None:
        """The request shown after a pause (doubled for each failure in a row, to `MOST_PAUSE`)
        that follows a store failure that passes, to ask; None when none is shown. Logged once
        in a row; a hub stopped ends the pause (`close` cancels this task)."""
        if failures == 1:
            logger.warning(
                "terminal channel: asking %s failed for now, asking again after a pause "
                "(not logged again while it fails): %s",
                request.id,
                exc,
                exc_info=True,
            )
        else:
            logger.debug("terminal channel: asking %s failed again: %s", request.id, exc)
        await asyncio.sleep(min(doubled(PAUSE, failures - 1), MOST_PAUSE))
        current = self.current
        if current is not None and current.id == request.id:  # its answer was not taken
            self.terminal.console.print(
                f"  [dim]the store failed for now ({printable(str(exc))}); asked again[/]"
            )
        return current

    async def submit(
        self, request: InputRequest, response: InputResponse, principal: Principal | None
    ) -> Outcome:
        """As `Channel.submit`, noting an error that refused the answer for now, for `_ask` to
        ask again; not a refusal (`NotAllowed`) or a close (`AnswerError`), which leave the
        request shown, no prompt out: asked again, the same answer would be refused again."""
        try:
            return await super().submit(request, response, principal)
        except AnswerError:
            raise
        except SignoffError:
            self._not_taken = request.id
            raise

    async def _open_here(self, request: InputRequest) -> InputRequest | None:
        """`request` as stored, if it is open still and this channel takes it as it stands
        (escalated, say); else None."""
        stored = await self.runtime.store.get_request(request.id)
        if stored is None or stored.status != "pending" or not self.accepts(stored.request):
            return None
        return stored.request

    async def _still_shown(self, request: InputRequest) -> bool:
        """Whether the line typed at `request`'s prompt is applied: not if the channel dropped
        the request while it was read (escalated to a group its `accepts` does not take), which
        the person is told; one that closed meanwhile is answered, and the answer says so."""
        if any(r.id == request.id for r in self._queue):
            return True
        stored = await self.runtime.store.get_request(request.id)
        if stored is None or stored.status != "pending":
            return True
        what = request.tool_name if request.kind == "tool-approval" else "the question"
        self.terminal.console.print(
            f"  [dim]what you typed was not applied: {printable(str(what))} is no longer "
            "shown here[/]"
        )
        return False

    async def idle(self) -> None:
        """Wait until the prompts shown so far are answered (or left)."""
        while self._asking is not None and not self._asking.done():
            await asyncio.wait({self._asking})

    async def close(self) -> None:
        if self._asking is not None and not self._asking.done():
            self._asking.cancel()  # the read blocked in its thread goes on (`_out`)
        self._asked = None  # started again, it asks (or waits on the prompt out) anew
        await super().close()

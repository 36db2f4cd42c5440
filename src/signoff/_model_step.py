"""The model step of a turn: the window of the conversation sent to the model, its response
recorded, and the session's budgets (asking a person to raise one that is spent). Apart from
`_engine` so the `Driver` there keeps to its loop and its recording."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ._budgets import (
    call_cap,
    continue_to,
    limit_options,
    limit_question,
    over_budget,
    own_left,
    raised_to,
    spending,
    stopped_at_limit,
)
from ._child_headroom import headroom_now
from ._conversation import MESSAGE_EVENT_TYPES, Conversation, conversation
from ._error_text import error_text
from ._exceptions import BudgetSpent, LeaseLost, ModelError, SignoffError
from ._output_caps import spare
from ._paused_parts import journal_pauses, paused_parts
from ._recording import DriverPart, EventSpec, dump_request, new_id, own_cancel
from ._refused_replies import billing, read_again, refused_cost
from ._response_checks import check_recordable
from ._state import SessionState, delegated_turn
from ._sync import exited
from ._text import cut
from ._types import (
    InputRequest,
    Message,
    ModelResponse,
    ToolResultMessage,
    Usage,
    plain_usage,
    reported_usage,
)
from .models import ModelRequest, PausedPart, ToolSpec
from .models._base import reply_to

__all__ = ["ModelStep"]

_WINDOW_MOST = 2**60
"""The largest `max_messages` read as a window of the newest events (a read of twice as many):
anything larger reaches past any log, and the whole conversation is read instead."""


_NEEDED_MOST = 2**53
"""The most output tokens a `continue` is raised to leave for a call that said it needs more
(`BudgetSpent.needed`): past it, a budget's sum is no longer kept exactly."""


class ModelStep(DriverPart):
    """Calling the model for a turn: a part of `Driver`, mixed into it."""

    # -- the model ----------------------------------------------------------------------------

    async def conversation(self) -> list[Message]:
        s = self.state
        if s.conversation is None:
            s.conversation = await self._windowed() or conversation(
                e
                for e in await self.store.read_events(s.id, types=MESSAGE_EVENT_TYPES)
                if e.seq <= s.seq
            )
        return s.conversation.messages

    async def _windowed(self) -> Conversation | None:
        """With a message window, the conversation from a recent turn on, read from the newest
        message events only: loading a long session then costs the window, not the history.
        None when the window may reach further back (the caller reads everything)."""
        limit = self.agent.limits.max_messages
        if limit is None or limit > _WINDOW_MOST:  # a window no log reaches: read it all
            return None
        want = 2 * limit + 8
        s = self.state
        tail = await self.store.read_events(s.id, types=MESSAGE_EVENT_TYPES, newest=want)
        whole = len(tail) < want
        tail = [e for e in tail if e.seq <= s.seq]
        if whole:
            return conversation(tail)  # that was the whole log
        start = next((i for i, e in enumerate(tail) if e.type == "turn.started"), None)
        if start is None:
            return None
        conv = conversation(tail[start:], partial=True)
        # `window()` keeps the last `limit` messages and the current turn, which started at or
        # after tail[start]: exactly what the whole log would give once there are that many.
        return conv if len(conv.messages) >= limit else None

    async def window(self) -> list[Message]:
        """The messages sent to the model: the last `max_messages`, never cutting this turn."""
        messages = await self.conversation()
        limit = self.agent.limits.max_messages
        if limit is None or len(messages) <= limit:
            return list(messages)
        assert self.state.conversation is not None
        start = min(len(messages) - limit, self.state.conversation.turn_start)
        while start > 0 and isinstance(messages[start], ToolResultMessage):
            start -= 1  # never begin with results whose calls were cut off
        return list(messages[start:])

    async def step_model(self) -> bool:
        """Call the model once and record its response; True when the turn parked or ended."""
        s = self.state
        turn = s.turn
        assert turn is not None
        limits = self.agent.limits
        budget = over_budget(s, limits.tokens_bound, limits.cost_bound)
        stopped = await stopped_at_limit(s, self.store)
        if stopped is not None:
            await self._fail_limit(f"{budget or stopped}; the person chose to stop")
            return True
        if turn.steps >= limits.max_steps:
            await self._fail_limit(f"the turn reached max_steps={limits.max_steps}")
            return True
        past, theirs = await self._past_headroom()
        if past is not None:
            # The budget spent is its parent's: not this session's to raise (it would ask to
            # raise its own). The delegate call fails, naming it (`share_spent`), and the parent
            # asks to continue or stop at its next model step, as this check does below. Its
            # own spent too, it fails all the same: a `continue` on it would fail here next.
            await self._fail_limit(past, share=True)
            return True
        if budget is not None:
            return await self._session_limit(budget)
        if turn.share_spent is not None and await self._share_spent(turn.share_spent, theirs):
            return True
        # The reply may spend on output what the budgets leave, its own or its parent's share,
        # less what its input costs at least (the input of the last call, which this one reads
        # again; a continuation of a paused reply, the last part's): a call whose input alone
        # would spend them is not made.
        messages = await self.window()
        floor = self._input_floor(messages)
        paused = paused_parts(turn) if turn.paused else ()
        if paused:
            floor = max(floor, paused[-1].usage.input_tokens)
        cap, parents, short = call_cap(s, limits, self.agent.model, theirs, floor)
        if cap == 0:  # what is left pays for no output token: no reply is worth asking for
            # A paused reply's next part, whose input is the floor, as the live drive asks it.
            again = bool(paused) and short == paused[-1].usage.input_tokens
            return await self._budget_cut(cap, parents, floor=short, paused=again)
        read_through = s.seq
        journaled: list[Usage] = []  # what the parts of the reply journaled meanwhile cost
        starved: list[tuple[bool, int]] = []  # a next part the budgets left no output for

        async def next_cap(part: PausedPart) -> int | None:
            # Each continuation reads at least what the part before it read: held back first,
            # as before a call, and none is asked for when that leaves no output token.
            theirs = await self._share_left()
            floor = part.usage.input_tokens
            room, by_parent, why = call_cap(self.state, limits, self.agent.model, theirs, floor)
            if room != 0:
                return room
            starved.append((by_parent, why))
            raise BudgetSpent("the budgets leave no output token for the paused reply's next part")

        # Said outright: free output under a cost budget is capped nowhere, but the reply's
        # usage must still be counted.
        budgeted = bool(own_left(s, limits)) or bool(theirs)
        request = ModelRequest(
            session_id=s.id,
            agent=s.agent,
            instructions=self.agent.instructions,
            messages=messages,
            tools=[
                ToolSpec(name=t.name, description=t.description, input_schema=t.json_schema())
                for t in self.agent.tools.values()
            ],
            response_index=s.model_responses,
            max_output_tokens=cap,
            budgeted=budgeted,
            paused=paused,
            on_pause=journal_pauses(self, read_through, journaled, next_cap),
        )
        # The model reads every message now: the calls it proposes start un-aborted.
        self.abort_signal.clear()
        # A cancel folded in meanwhile is not read so: a renewal is still to find it.
        if s.turn is not None and s.turn.status != "cancelled":
            self.seen = max(self.seen, read_through)
        span = self.tracing.model(s, self.agent.model, request, self.agent.tools, parts=journaled)
        try:
            with span:  # ended, and no longer current, however the call ends
                response = await self._complete(request)
                if not isinstance(response, ModelResponse):
                    raise ModelError(f"model returned {type(response).__name__}, not ModelResponse")
                recorded = check_recordable(response, limits)
                if response.cut_off is not None and response.tool_calls:
                    # The last call may be half a call, and the rest a plan cut short.
                    raise ModelError(
                        f"the model's reply was cut off ({response.cut_off}) with "
                        f"{len(response.tool_calls)} tool call(s): none is run",
                        usage=reported_usage(response.usage)
                        if response.cost_reported
                        else response.usage,
                        context_tokens=response.context_tokens,
                    )
                span.responded(response)  # what the call billed, its paused parts too
        except (Exception, asyncio.CancelledError) as exc:
            if not isinstance(exc, Exception) and not own_cancel(exc):
                raise  # this drive is being cancelled, not failed by the model
            if isinstance(exc, LeaseLost) and self.held is not None and self.held.lost:
                raise  # another process drives the turn now: nothing is recorded here
            if isinstance(exc, BudgetSpent) and starved:
                by_parent, why = starved[0]
                return await self._budget_cut(0, by_parent, floor=why, paused=True)
            if isinstance(exc, BudgetSpent) and cap is not None:
                return await self._budget_cut(cap, parents, exc)
            code = exc.code if isinstance(exc, SignoffError) else "model_error"
            # A message of megabytes is cut, not stored on every retry.
            message = cut(error_text(exc), limits.max_response_bytes // 4)
            failed: dict[str, Any] = {"error": {"code": code, "message": message}}
            failed["retryable"] = True
            now = self.state.turn  # reloaded since `s` if journaling a part met another's commit
            if getattr(exc, "start_over", False) is True and now is not None and now.paused:
                # The reply's parts journaled cannot be gone on from: a retry asks afresh.
                failed["start_over"] = True
            spent = refused_cost(exc)
            failed.update(billing(spent, read_again(exc, spent)))
            await self.record(
                [
                    ("turn.failed", failed),
                    # Idle until a retry or the next message, as after any other end of a turn.
                    ("session.waiting", {}),
                ]
            )
            return True
        calls = []
        # A missing or repeated id is replaced by one no call of this response uses.
        taken = {c.id for c in response.tool_calls if c.id}
        seen: set[str] = set()
        for i, c in enumerate(response.tool_calls):
            cid = c.id
            if not cid or cid in seen:
                cid = f"call_{s.seq + 1}_{i}"
                while cid in taken:
                    cid += "_"
                taken.add(cid)
            seen.add(cid)
            # The input as JSON gives it back: a tuple in it is a list live too, as resumed.
            calls.append({"id": cid, "name": c.name, "input": recorded["tool_calls"][i]["input"]})
        data: dict[str, Any] = {
            "text": response.text,
            "tool_calls": calls,
            "usage": plain_usage(response.usage).model_dump(),
        }
        if response.cut_off is not None:  # a partial answer says so
            data["cut_off"] = response.cut_off
        if response.cost_reported:  # the cost is the provider's bill, not a computed price
            data["cost_reported"] = True
        if response.context_tokens is not None:  # what the next call reads again, at least
            data["context_tokens"] = min(response.context_tokens, response.usage.input_tokens)
        if response.model is not None:  # another model than the one asked for answered
            data["model"] = response.model
        if response.reasoning and calls:  # only a response with calls needs its reasoning back
            data["reasoning"] = recorded["reasoning"]
        completed: EventSpec = ("model.completed", data)

        def specs(state: SessionState) -> list[EventSpec]:
            # A message that arrived while the model was thinking keeps the turn open.
            unread = state.turn is not None and state.turn.last_message_seq > read_through
            if unread:
                # What the model read: the messages after it go after this response. Stored
                # only then, as the conversation needs it only then (it saves bytes per turn).
                return [("model.completed", {**data, "read_through": read_through})]
            if calls:
                return [completed]
            # The answer is the `model.completed` just before: `turn.completed` does not repeat it.
            return [completed, ("turn.completed", {}), ("session.waiting", {})]

        await self.record(specs, billed=[completed])
        return False

    async def _complete(self, request: ModelRequest) -> Any:
        """The model's response to `request`, the call run as the lease's `body`: a lease lost
        meanwhile cancels it and raises `LeaseLost` (its response could not be recorded)."""
        lease = self.held
        if lease is None:
            return await _no_exit(self.agent.model.complete, request)
        lost = LeaseLost(f"the lease on session {self.state.id!r} was lost")
        if lease.lost:
            raise lost
        # The model's coroutine is made inside the task: a task cancelled before it runs leaves
        # none unawaited.
        call = asyncio.ensure_future(_no_exit(self.agent.model.complete, request))
        lease.body = call
        try:
            # Awaiting the task: a cancel of this drive cancels the model call with it.
            response = await call
        except (Exception, asyncio.CancelledError) as exc:
            if lease.lost and (isinstance(exc, Exception) or own_cancel(exc)):
                raise lost from None
            raise
        finally:
            lease.body = None
        if lease.lost:  # a model that ignored the cancel: its response is discarded
            raise lost
        return response

    async def _past_headroom(self) -> tuple[str | None, dict[str, float]]:
        """Whether the child spent its share of what its parent had left when it was created:
        its usage and its own children's, all spent in this (its first) turn, against that
        headroom less what its parent's other subagents spent since (`headroom_now`); and what
        of that share is left, by budget (nothing for a session outside its delegated turn)."""
        s = self.state
        if not _delegated_turn(s):
            return None, {}
        rt = getattr(self.host, "runtime", None)
        bound = dict(s.headroom) if rt is None else await headroom_now(rt, s)
        spent = s.usage + s.delegated
        left = "its parent session had left when it delegated"
        tokens, cost = s.headroom.get("max_tokens"), s.headroom.get("max_cost_usd")
        if tokens is not None and spent.total_tokens >= bound["max_tokens"]:
            by = _less(tokens - bound["max_tokens"], f"{tokens - bound['max_tokens']:g}")
            used = f"the session used {spent.total_tokens} tokens, past the {tokens:g}"
            return f"{used} {left}{by} (session {s.parent})", {}
        if cost is not None and spent.cost_usd >= bound["max_cost_usd"]:
            by = _less(cost - bound["max_cost_usd"], f"{cost - bound['max_cost_usd']:.4f}")
            used = f"the session cost {spent.cost_usd:.4f}, past the {cost:.4f}"
            return f"{used} {left}{by} (session {s.parent})", {}
        return None, spare(bound, spent)

    async def budget_left(self) -> dict[str, float]:
        """What the session's budgets leave for a model call now, by budget (`max_tokens`,
        `max_cost_usd`): the least of its own and of its share of its parent's; empty when none
        bounds it. What an `auto()` review may spend (`ApprovalContext.budget_left`)."""
        theirs = await self._share_left()
        own = own_left(self.state, self.agent.limits)
        return {
            k: min(v for v in (own.get(k), theirs.get(k)) if v is not None)
            for k in ("max_tokens", "max_cost_usd")
            if k in own or k in theirs
        }

    async def _share_left(self) -> dict[str, float]:
        """What the session's share of its parent's budgets leaves, by budget: none of it once
        spent; empty outside the turn its parent delegated."""
        past, theirs = await self._past_headroom()
        if past is not None:
            return {k: 0.0 for k in self.state.headroom if k in ("max_tokens", "max_cost_usd")}
        return theirs

    def _input_floor(self, messages: list[Message], read: int = 0) -> int:
        """The least number of input tokens a call sending `messages` reads: as many as the
        session's last call read of what the conversation keeps (`context_tokens`; or `read`, a
        refused reply's, when more), when these hold everything that call was sent (the whole
        conversation, which only grows); else 0, not known."""
        conv = self.state.conversation
        if conv is None or conv.partial or len(messages) != len(conv.messages):
            return 0
        return max(self.state.last_input_tokens, read)

    async def _budget_cut(
        self,
        cap: int,
        parents: bool,
        exc: BudgetSpent | None = None,
        *,
        floor: int = 0,
        paused: bool = False,
    ) -> bool:
        """The reply was cut off at the `cap` output tokens the budgets left (`exc`), or none was
        worth asking for (with `floor`, for the input it would read; `paused`: the next part of a
        reply the provider paused): what it cost is counted and nothing of it used, and the turn
        stops as at a spent budget (asking the person to raise it; a subagent on its parent's
        share fails, as that is not its to raise)."""
        s = self.state
        spent = None if exc is None else refused_cost(exc)
        kept = None if exc is None else read_again(exc, spent)
        if paused:
            what = "the provider paused the model's reply, and " + (
                f"its next part would read at least {floor} input tokens (as many as its last "
                "part read), leaving not one output token"
                if floor
                else "not one output token was left for its next part"
            )
        elif exc is not None and exc.usage is not None:
            what = f"the model's reply was cut off at the {cap} output tokens left"
        elif floor:
            what = (
                f"the model's next call would read at least {floor} input tokens (as many as "
                "its last call read), leaving not one output token"
            )
        elif cap:
            what = f"the {cap} output tokens left were too few for the model's reply"
        else:
            what = "not one output token was left"
        if parents:
            left = f"its parent session had left when it delegated (session {s.parent})"
            await self._fail_limit(f"{what} of what {left}", usage=spent, kept=kept, share=True)
            return True
        limits = self.agent.limits
        used = "; ".join(t for t, _ in spending(s, limits.tokens_bound, limits.cost_bound, spent))
        problem = f"{what} in the session's budget: {used}"
        # A reply that needed more than the `cap` output tokens left: a `continue` leaves the
        # next twice as many at least, so answers in a row let one as long as it needs run,
        # and as many as the model said a call needs at least, so one answer lets it be made.
        room = max(1, 2 * cap, _needed(exc))
        return await self._session_limit(problem, usage=spent, kept=kept, room=room)

    async def _fail_limit(
        self,
        problem: str,
        *,
        usage: Usage | None = None,
        kept: int | None = None,
        share: bool = False,
    ) -> None:
        """Fail the turn for good with `session_limit_reached`, counting `usage` (a reply the
        budget cut off, which the next call reads `kept` input tokens of again: `billing`);
        `share`: on its share of its parent's budgets, which its parent then asks about."""
        failed: dict[str, Any] = {
            "error": {"code": "session_limit_reached", "message": problem},
            "retryable": False,
            **billing(usage, kept),
            **({"share": True} if share else {}),
        }
        await self.record([("turn.failed", failed), ("session.waiting", {})])

    async def _share_spent(self, child: str, theirs: dict[str, float]) -> bool:
        """A subagent (`child`) stopped on this session's share of its budgets, which its spend
        and the subagent's may not reach (its next call's input left no output token): ask to
        raise them, as at a spent budget, or, where this session's own share of its parent's
        leaves the least, fail on it as the subagent did, for its parent to ask. False when no
        budget bounds it (the model step goes on)."""
        s, limits = self.state, self.agent.limits
        own = own_left(s, limits)
        stopped = f"its subagent (session {child}) stopped on what"
        if theirs and any(v <= own.get(k, float("inf")) for k, v in theirs.items()):
            left = f"its parent session had left when it delegated (session {s.parent})"
            await self._fail_limit(f"{stopped} {left}", share=True)
            return True
        used = "; ".join(t for t, _ in spending(s, limits.tokens_bound, limits.cost_bound, None))
        if not used:
            return False
        return await self._session_limit(f"{stopped} this session's budget left it: {used}")

    async def _session_limit(
        self, problem: str, *, usage: Usage | None = None, kept: int | None = None, room: int = 1
    ) -> bool:
        """A budget is spent: ask the person to continue (raising it as far as the next model
        call needs, `continue_to`) or stop (`stopped_at_limit`); with nobody to ask, fail with
        `session_limit_reached`. `usage` is what a reply the budget cut off cost, counted with
        the request (or the failure), `kept` as `billing` says, and `room` the output tokens
        the `continue` leaves the next call at least."""
        s = self.state
        turn = s.turn
        assert turn is not None
        asked = [
            r
            for r in s.requests.values()
            if r.request.kind == "session-limit" and r.request.child is None  # not a subagent's
        ]
        last = asked[-1] if asked else None
        if last is not None and last.status == "pending":
            if turn.status != "waiting":
                waiting = {"on": "input", "request_ids": [last.request.id]}
                await self.record([("turn.waiting", waiting)])
            return True
        principal = turn.principal
        if turn.source == "schedule" or (
            principal is not None and principal.principal_type == "runtime"
        ):
            await self._fail_limit(
                f"{problem}; nobody can raise the budget of this session", usage=usage, kept=kept
            )
            return True
        # What `continue` raises the budgets to is decided now, and recorded (`raise_to`): as
        # many sizes as the next model call needs, the input it reads held back as before it.
        read = 0 if usage is None else usage.input_tokens if kept is None else kept
        floor = self._input_floor(await self.window(), read)
        paused = paused_parts(turn) if turn.paused else ()
        if paused:
            floor = max(floor, paused[-1].usage.input_tokens)
        limits = self.agent.limits
        to = continue_to(s, limits, self.agent.model, floor, usage, room)
        raised = raised_to(to)
        run = s.usage + s.delegated  # what the run spent, its subagents too, as asked about
        request = InputRequest(
            kind="session-limit",
            id=new_id("req"),
            session_id=s.id,
            turn_id=turn.id,
            agent=s.agent,
            question=limit_question(problem, raised),
            options=limit_options(raised),
            requested_by=principal,
            created_at=self.clock(),
            usage=run if usage is None else run + usage,
        )
        requested: dict[str, Any] = {
            "requests": [dump_request(request)],
            "raise_to": to,
            **billing(usage, kept),
        }
        await self.record(
            [
                ("input.requested", requested),
                ("turn.waiting", {"on": "input", "request_ids": [request.id]}),
            ],
            new_requests=[request],
        )
        return True


def _delegated_turn(s: SessionState) -> bool:
    """Whether the session is a child in the turn its delegate call started (its first): a
    later turn, which a message sent to the child started, spends its own budget only."""
    return bool(s.headroom) and delegated_turn(s)


def _needed(exc: BudgetSpent | None) -> int:
    """The least output tokens the model said its call needs (`BudgetSpent.needed`), when it
    said a count (one of a model of one's own may be anything): 0 otherwise."""
    needed = getattr(exc, "needed", None)
    if isinstance(needed, bool) or not isinstance(needed, int):
        return 0
    return min(max(needed, 0), _NEEDED_MOST)


def _less(amount: float, shown: str) -> str:
    """How much of the headroom the parent's other subagents took, where they took any."""
    return f", less {shown} spent since by its parent's other subagents" if amount > 0 else ""


async def _no_exit(
    complete: Callable[[ModelRequest], Awaitable[Any]], request: ModelRequest
) -> Any:
    """A model's response, or its `SystemExit` (a stray `sys.exit()` in a scripted step or a
    custom model) as its failure: the event loop would let it end the process."""
    try:
        return await reply_to(complete, request)
    except SystemExit as exc:
        raise exited(exc) from exc

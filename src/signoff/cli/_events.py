"""`signoff events`: a session's event log, printed or followed."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Mapping
from datetime import date, datetime
from typing import Annotated, Any

import typer
from rich.console import Console

from .._agent import Agent
from .._events import Event
from .._exceptions import (
    EventsRewritten,
    SchemaVersionError,
    StoreError,
    StoreGone,
    StoreUnavailable,
    UsageError,
)
from .._key_holds import HELD
from .._runtime import Runtime
from .._text import HIDDEN, escape_as_json
from .._trace_content import shown_data
from ..channels.terminal import compact_json, printable
from ._app import (
    RuntimeArgument,
    SessionArgument,
    StoreOption,
    app,
    clip,
    ctrl_c_interrupts,
    err,
    error_text,
    misuse,
    one_line,
    out,
    refuse_empty_ids,
    refuse_undecodable,
    run,
    runtime_of,
    tool_line,
)
from ._numbers import whole
from ._store_files import reading_store
from ._waiting import FIRST_WAIT, LONGEST_WAIT

__all__ = ["events"]

SEQ = whole(0, 2**63 - 1)


Tools = Mapping[str, Any] | None
"""The tools of the session's agent, by name; None when the command lacks the agent."""


def _summary(event: Event, tools: Tools = None) -> str:
    d = shown_data(event.type, event.data, tools)
    t = event.type
    if t == "session.created":
        return f"agent={d.get('agent')}"
    if t == "turn.started":
        return compact_json(d.get("message"))
    if t == "model.completed":
        calls = [
            f"{c.get('name')}({compact_json(c.get('input'))})" for c in _objects(d, "tool_calls")
        ]
        parts = ([compact_json(d["text"])] if d.get("text") else []) + calls
        cut = f" [cut off: {d['cut_off']}]" if d.get("cut_off") else ""
        return "; ".join(parts) + cut
    if t == "model.paused":  # a part of the reply, not a message: its text is the reply's
        usage = d["usage"] if isinstance(d.get("usage"), dict) else {}
        return f"reply paused: {usage.get('input_tokens')} in, {usage.get('output_tokens')} out"
    if t == "turn.message":
        queued = " (queued)" if d.get("queued") else ""
        return compact_json(d.get("message")) + queued
    if t == "tool.started":
        return str(d.get("tool_name"))
    if t == "tool.step":
        return _step(d)
    if t == "approval.candidate":
        return _candidate(d)
    if t == "tool.completed":
        return tool_line(d)
    if t == "input.requested":
        return ", ".join(
            f"{r.get('id')} ({_object(r.get('action')).get('tool_name') or r.get('kind')})"
            for r in _objects(d, "requests")
        )
    if t == "turn.waiting":
        ids = d.get("request_ids")
        return f"on {d.get('on')}: {', '.join(map(str, ids if isinstance(ids, list) else []))}"
    if t == "approval.settled":
        if d.get("auto") == "timeout":  # no one approved it: its reason says as much again
            return f"{d.get('request_id')} approved automatically when the deadline passed"
        why = f" ({d['reason']})" if d.get("reason") else ""
        return f"{d.get('request_id')} {d.get('decision')} by {_by(d)}{why}"
    if t == "input.resolved":
        return f"{d.get('request_id')} {d.get('outcome')}"
    if t == "input.repeated" and d.get("held_idem") is not None:
        return f"{d.get('request_id')} {HELD[0]}{_by(d)}{HELD[1]}"
    if t == "input.repeated":
        return f"{d.get('request_id')} answered again by {_by(d)} (nothing changed)"
    if t == "turn.completed":
        return str(d.get("text", ""))  # the answer is the model.completed line before it
    if t == "turn.failed":
        retry = " (retryable)" if d.get("retryable") else ""
        return error_text(d.get("error")) + retry
    if t == "turn.cancelled":
        return str(d.get("reason") or "")
    return ""


def _step(d: Mapping[str, Any]) -> str:
    """A journaled step: what it returned, or what it raised (its `error`, recorded instead of
    a `result`: a step that raised read as one that returned None)."""
    said = f"{d.get('tool_name')} step {d.get('name')}"
    error = d.get("error")
    if error is None:
        return f"{said} -> {compact_json(d.get('result'))}"
    kind = error.get("type") if isinstance(error, Mapping) else None
    if not kind:  # a hand-damaged log's: whatever it holds
        return f"{said} raised {clip(error_text(error))}"
    message = error.get("message")
    return f"{said} raised {kind}" + (f": {clip(str(message))}" if message else "")


def _objects(d: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """The objects of the list `d[key]`: a hand-damaged event (no list there, or items of
    another type) is shown as far as it goes, not a traceback ending the listing."""
    items = d.get(key)
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def _object(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _by(d: Mapping[str, Any]) -> str:
    """Who an event's `by` names: a principal's id, or `-` for the application (no one)."""
    by = d.get("by")
    return str(by.get("principal_id", "-")) if isinstance(by, dict) else "-"


def _candidate(d: Mapping[str, Any]) -> str:
    """An `approval.candidate`: a deadline's escalation (to a group, no answer in it), or an
    answer's step: awaiting its response policy, refused by it, a quorum's vote, or stale."""
    why = f" ({d['reason']})" if d.get("reason") else ""
    if d.get("outcome") == "escalated":
        return f"{d.get('request_id')} escalated to {d.get('to')}{why}"
    said = f"{d.get('request_id')} {d.get('decision')} by {_by(d)}: {d.get('outcome')}"
    if d.get("outcome") == "counted":
        return f"{said} ({d.get('votes')} of {d.get('needed')})"
    return said + why


class _Failing:
    """A follower's store failing (its database restarting, say): said on stderr when it starts
    failing and when it works again, not at every try, and tried again less and less often."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.wait = 0.0

    def failed(self, exc: StoreError) -> float:
        """Note a failure; returns the seconds to wait before the next try."""
        if self.since is None:
            self.since = time.monotonic()
            why = " ".join(str(exc).split())  # a driver's message spans lines
            _say(f"the store failed, retrying (said again once it works): {why}")
        self.wait = min(max(FIRST_WAIT, self.wait * 2), LONGEST_WAIT)
        return self.wait

    def worked(self) -> None:
        if self.since is not None:
            _say(f"the store works again (it failed for {time.monotonic() - self.since:.1f}s)")
        self.since, self.wait = None, 0.0


def _say(line: str) -> None:
    err().print(printable(line), soft_wrap=True)


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def _encodable(line: str) -> str:
    """`line` of JSON with what stdout's encoding cannot hold (cp1252 takes no emoji) as JSON's
    escapes: the stream's own `backslashreplace` wrote Python's `\U0001f600`, not JSON."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"

    def escaped(match: re.Match[str]) -> str:
        try:
            match.group().encode(encoding)
        except UnicodeEncodeError:
            return escape_as_json(match)
        return match.group()

    try:
        line.encode(encoding)
    except UnicodeEncodeError:
        return _NON_ASCII.sub(escaped, line)
    return line


def _print(console: Console, event: Event, as_json: bool, follow: bool, tools: Tools) -> None:
    """Print one event: a line of the table, or of JSON; either way each tool call's input as a
    span shows it, secrets masked, or masked whole without the session's agent (`shown_data`)."""
    if as_json:
        shown = {**event.to_dict(), "data": shown_data(event.type, event.data, tools)}
        line = json.dumps(shown, ensure_ascii=False)
        # what JSON leaves raw and a terminal may act on or hide: C1 controls (a CSI), bidi
        # overrides, lone surrogates (UTF-8 cannot hold them), escaped
        typer.echo(_encodable(HIDDEN.sub(escape_as_json, line)))
        return
    when = datetime.fromtimestamp(event.at)
    # The day too, but for today's: a session waits for people for days.
    at = when.strftime("%H:%M:%S" if when.date() == date.today() else "%Y-%m-%d %H:%M:%S")
    console.print(
        f"{event.seq:>4}  [dim]{at}[/]  [bold]{event.type:<18}[/] "
        f"{printable(clip(one_line(_summary(event, tools)), 160))}",
        soft_wrap=True,
    )
    if follow:
        sys.stdout.flush()


async def _tools(runtime: Runtime, agents: Mapping[str, Agent] | None, session_id: str) -> Tools:
    """The tools of the session's agent among `agents`, by the agent its first event names;
    None when `agents` lacks it (or the session has no first event: it is not there)."""
    if not agents:  # only a store: no first event to read
        return None
    first = await runtime.store.read_events(session_id, limit=1)
    name = first[0].data.get("agent") if first and first[0].type == "session.created" else None
    agent = agents.get(name) if isinstance(name, str) else None
    return None if agent is None else agent.tools


async def _print_log(
    runtime: Runtime,
    console: Console,
    session_id: str,
    after: int,
    follow: bool,
    as_json: bool,
    agents: Mapping[str, Agent] | None = None,
) -> None:
    """Print the session's events after `after`, tool input shown by the tools of the session's
    agent among `agents`. Following them, a store that fails is tried again (`_Failing`), from
    the last event printed: at the start only while it is unavailable (a wrong password or
    schema ends it at once, as it ends `worker`), later on any store error but a file replaced
    or a newer schema, which only a restart (or a newer signoff) mends."""
    seen, checked, opened = after, not after, False
    tools: Tools = None
    told = False  # whether `tools` was read
    shown: Event | None = None  # the last event printed: a read after a failure checks it
    failing = _Failing()
    while True:
        try:
            await runtime.open()
            opened = True
            if failing.since is not None:
                await runtime.store.head(session_id)  # it answers again
                failing.worked()
            if not checked:  # else silence, and --follow waits for ever
                head = await runtime.store.head(session_id)
                if head is not None and after > head:
                    raise UsageError(
                        f"--after {after} is past the session's last event ({head}); "
                        "start from a seq it has"
                    )
                checked = True
            if not told:
                tools, told = await _tools(runtime, agents, session_id), True
            async for event in runtime.events(session_id, seen, follow=follow, shown=shown):
                with ctrl_c_interrupts():  # a log read without a wait between its events
                    _print(console, event, as_json, follow, tools)
                seen, shown = event.seq, event
            return
        except (StoreGone, SchemaVersionError, EventsRewritten):  # no retry mends them
            raise
        except StoreError as exc:
            if not follow or not (opened or isinstance(exc, StoreUnavailable)):
                raise
            await asyncio.sleep(failing.failed(exc))


@app.command()
def events(
    session_id: SessionArgument,
    target: RuntimeArgument = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events (Ctrl-C stops).")
    ] = False,
    after: Annotated[
        int,
        typer.Option(
            "--after",
            metavar="SEQ",
            parser=SEQ,
            help="Start after this seq, a whole number from 0 (the whole log).",
        ),
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    store: StoreOption = None,
) -> None:
    """Print a session's event log.

    With --follow, a store that fails (its database restarting, or down when it starts) is said
    on stderr in one line and tried again, each wait longer (up to 5 s), and once it works again
    the events written since are printed from where it stopped; a SQLite file deleted or
    replaced, or a schema a newer signoff upgraded, ends it with status 1."""

    async def go() -> None:
        with misuse():
            refuse_undecodable({"SESSION_ID": session_id})
            refuse_empty_ids({"SESSION_ID": session_id})
        console = out()
        loaded = runtime_of(target, store)  # its agents show their tools' input
        given = store if loaded is None else loaded.store
        runtime = Runtime([], store=reading_store(given))
        agents = None if loaded is None else loaded.agents
        try:
            await _print_log(runtime, console, session_id, after, follow, as_json, agents)
        finally:
            await runtime.close()

    try:
        run(go())
    except typer.Exit as exit_:
        if follow and exit_.exit_code == 130:
            raise typer.Exit(0) from None
        raise

"""Reading and verifying the audit trail, and recording tool setting changes (exporting it is
`_audit_export`'s)."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._agent import Agent
from ._answers import check_text
from ._approval import DENIED_BY_GUARDRAIL, RequestRules, guardrail_setting
from ._audit_logs import Gap, log_ends
from ._audit_requests import PAGE as REQUESTS_PAGE
from ._audit_requests import Leftovers, RequestTrail, request_rows
from ._audit_snapshots import snapshot_problems
from ._exceptions import StoreError, UsageError
from ._types import InputRequest
from .stores import Store
from .stores._audit import (
    DAMAGED,
    AuditEntry,
    AuditRow,
    StoredSnapshot,
    chain_hash,
    int_time_hash,
)
from .stores._base import RequestRow
from .stores._deletions import DELETIONS_STREAM, SESSION_DELETED

__all__ = [
    "AuditEntries",
    "AuditProblem",
    "Chains",
    "check_stream",
    "entries",
    "own_stream",
    "undamaged",
    "record_tool_settings",
    "response_policy_recorded",
    "tool_setting",
    "verify",
]

TOOL_SETTING = "tool.approval_changed"
TOOLS_STREAM = "tools:"  # the streams of tool setting changes: tools:<agent>.<tool>
SIGN_OUTS_STREAM = "dashboard:sign-outs"  # the dashboard's sign-ins signed out (server)
# The dashboard's forms sent, as signoff recorded them for a while (idempotency keys do now):
# old stores may hold this stream, which no session keeps the head of either.
_OLD_FORMS_STREAM = "dashboard:forms"
# the streams no session keeps the head of (deletions: `stores._deletions.DELETIONS_STREAM`)
_OWN_STREAMS = (TOOLS_STREAM, SIGN_OUTS_STREAM, _OLD_FORMS_STREAM, DELETIONS_STREAM)
RESPONSE_POLICY_NOTE = " + response policy"  # ends the setting of a tool with a response policy


def own_stream(stream: str) -> bool:
    """Whether `stream` is one no session keeps the head of (tool settings, the dashboard's,
    deletions)."""
    return stream.startswith(_OWN_STREAMS)


class AuditEntries(list[AuditEntry]):
    """What `rt.audit()` returns: the entries read, oldest first, and `truncated`, True when
    more followed its `limit`, so a trail cut short never reads as the whole."""

    def __init__(self, entries: Iterable[AuditEntry] = (), *, truncated: bool = False) -> None:
        super().__init__(entries)
        self.truncated = truncated

    def __repr__(self) -> str:
        return f"AuditEntries({list.__repr__(self)}, truncated={self.truncated})"


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditProblem:
    """An entry whose hash does not follow from its stream's chain: altered, removed or moved;
    for entries missing from the end of a stream's chain, `n` is the first missing and `id` the
    last entry left (0 if none is). A request row that does not say what the trail recorded of
    its request is named by the request's last entry it was read with (`id` and `n` 0 if no
    entry asks that request), its `reason` naming the request; a snapshot that is not the fold
    of its session's events by the session's last entry up to it (0 and 0 if none), and events
    missing from a log before its last by its last entry before the first of them (0 and 0 if
    none, or if which is first cannot be told)."""

    id: int
    stream: str
    n: int
    reason: str


def check_stream(stream: object, what: str = "stream") -> str | None:
    """A stream or session id to read the trail of: text a store can hold, or None for all."""
    if stream is None:
        return None
    if not isinstance(stream, str):
        raise UsageError(f"{what} must be text or None, not {type(stream).__name__}")
    check_text(stream, what)
    return stream


PAGE = 1000  # entries read at once
SESSIONS_PAGE = 200  # sessions verified at once: their heads, request rows and entries


async def entries(
    store: Store,
    *,
    stream: str | None = None,
    page: int | None = None,
    sessions: list[str] | None = None,
    others: bool = False,
) -> AsyncIterator[AuditEntry]:
    """Every entry (of `stream`, of `sessions`, or of no session with `others`), each stream's
    in order. A store may take an entry's id before its commit (PostgreSQL), so across streams
    a page can miss a lower id still uncommitted: when a later entry of its stream then shows
    a hole, the stream's entries before it are read again. The entries of no session are few
    among all: each read of them looks at a window of `page` entries by id, so no statement
    scans the whole trail to fill a page."""
    page = page or PAGE
    after = 0
    last: dict[str, tuple[int, int]] = {}  # stream -> (n, id) of the last entry given
    scope: dict[str, Any] = {"stream": stream}
    if sessions is not None:
        scope["sessions"] = sessions
    windowed = others and hasattr(store, "audit_window")  # not in a store of an earlier signoff
    if others:
        scope["others"] = True
    while True:
        if windowed:
            upto = await store.audit_window(after_id=after, limit=page)
            if upto is None:
                return
            scope["upto_id"] = upto
        batch = await store.audit(**scope, after_id=after, limit=page)
        for entry in batch:
            n, last_id = last.get(entry.stream, (0, 0))
            if stream is None and entry.n > n + 1:
                async for missed in entries(store, stream=entry.stream, page=page):
                    if last_id < missed.id < entry.id:
                        yield missed
                    elif missed.id >= entry.id:
                        break
            yield entry
            last[entry.stream] = (entry.n, entry.id)
            after = max(after, entry.id)
        if windowed:
            after = scope["upto_id"]
        elif len(batch) < page:
            return


def _damaged(e: AuditEntry) -> str | None:
    """Which of `e`'s numbers the store holds no whole number for (`DAMAGED`), if one."""
    if e.n == DAMAGED:
        return "n"
    return "seq" if e.seq == DAMAGED else None


def undamaged(e: AuditEntry) -> AuditEntry:
    """`e`, to be listed or exported: one with a number the store holds no whole number for is a
    StoreError naming it, not a place in its chain made up (verifying names it and goes on)."""
    what = _damaged(e)
    if what is not None:
        raise StoreError(
            f"audit entry {e.id} of {e.stream!r} is damaged: its {what} is not a number"
        )
    return e


class Chains:
    """Each stream's chain as checked so far, entry by entry in its order."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, str | None]] = {}
        self.last_id: dict[str, int] = {}
        self.last_seq: dict[str, int] = {}
        self.unplaced: set[str] = set()  # streams whose last entry has no number to link to

    def _expected(self, e: AuditEntry) -> str:
        """The hash `e` should have, following its stream's entries checked before (as an int
        clock's entry was hashed before times were hashed as floats, if that is its hash)."""
        prev = self.last.get(e.stream, (0, None))[1]
        expected = chain_hash(
            prev, stream=e.stream, n=e.n, type=e.type, at=e.at, seq=e.seq, data=e.data
        )
        if e.hash != expected and e.hash == int_time_hash(
            prev, stream=e.stream, n=e.n, type=e.type, at=e.at, seq=e.seq, data=e.data
        ):
            return e.hash
        return expected

    def follows(self, e: AuditEntry) -> bool:
        """Whether `e`'s hash follows from its content and its stream's entries checked before."""
        return e.hash == self._expected(e)

    def check(self, e: AuditEntry) -> AuditProblem | None:
        """The problem with `e` following its stream's entries checked before, if any."""
        n, prev = self.last.get(e.stream, (0, None))
        expected = self._expected(e)
        before = self.last_seq.get(e.stream)
        reason = None
        damaged = _damaged(e)
        if damaged is not None:
            reason = f"its {damaged} is not a whole number"
        elif e.n != n + 1:
            reason = f"expected entry {n + 1}"
        elif e.prev != prev and not (e.prev is None and e.stream in self.unplaced):
            # (a store finds the hash before an entry by its number: none follows one of none)
            reason = "previous hash differs"
        elif e.hash != expected:
            reason = "content does not match"
        elif e.seq is not None and before is not None and e.seq <= before:
            reason = f"event {e.seq} is not after event {before} of the entry before"
        # Continue from the stored hash, so one altered entry is named once (one of no number
        # in the place it was read in).
        self.last[e.stream] = (n + 1 if e.n == DAMAGED else e.n, e.hash)
        (self.unplaced.add if e.n == DAMAGED else self.unplaced.discard)(e.stream)
        self.last_id[e.stream] = e.id
        if e.seq is not None and e.seq != DAMAGED:
            self.last_seq[e.stream] = max(e.seq, before or 0)
        if reason is None:
            return None
        return AuditProblem(id=e.id, stream=e.stream, n=e.n, reason=reason)


async def verify(store: Store, *, stream: str | None = None) -> list[AuditProblem]:
    """Recompute every chain; each entry that does not match is named, and so is a chain that
    stops short of the head the store keeps for it (its last entries removed) or goes past it
    (entries added after its last), a session entry pointing at an event an earlier entry
    of its session stands for (a step shown twice), a log that no longer ends at the event its
    session row keeps as its last (its newest events deleted) or misses events before it (a
    gap, `_audit_logs`), a request row that says other than the entries of its request
    (`_audit_requests`), and a snapshot that is not the fold of its session's events
    (`_audit_snapshots`). A whole store is checked a page of sessions at a time, then the
    other streams, so what is held does not grow with it; a session deleted meanwhile, its
    deletion recorded, is not named."""
    left = Leftovers()
    problems: list[AuditProblem] = []
    since = None  # the deletions recorded before: a session erased later is no tampering
    if not (stream is not None and own_stream(stream)) and hasattr(store, "log_ends"):
        since = await _deletions_head(store)
    async for group in _groups(store, stream):
        problems += await _check(store, group, left)
    named = left.paired()
    after = ""
    while left.asks and stream is None:
        # Asked without a row in their session: named unless the row is in another session
        # whose rows were not checked (its chain broken), which only all the rows can tell.
        page = await store.stored_requests(after=after, limit=REQUESTS_PAGE)
        left.found(row.id for row in page)
        if len(page) < REQUESTS_PAGE:
            break
        after = page[-1].id
    for entry_id, sid, n, reason in named + left.missing():
        problems.append(AuditProblem(id=entry_id, stream=sid, n=n, reason=reason))
    return problems if since is None else await _but_deleted(store, problems, since)


async def _deletions_head(store: Store) -> int:
    """How many deletions the `store:deletions` chain holds now, before verifying begins."""
    return (await store.audit_heads(stream=DELETIONS_STREAM)).get(DELETIONS_STREAM, (0, None))[0]


async def _but_deleted(
    store: Store, problems: list[AuditProblem], since: int
) -> list[AuditProblem]:
    """`problems` but those of sessions deleted while they were verified: a deletion meanwhile
    erases a session between two of verification's reads (its head read, then no entry), which
    is no tampering. A session counts as deleted so only if it is gone now and an entry of the
    deletions chain past its `since`-th, following its chain and within its head, names it: a
    session row deleted by hand, which no such entry names, stays named."""
    streams = sorted({p.stream for p in problems if not own_stream(p.stream)})
    gone = set()
    for i in range(0, len(streams), SESSIONS_PAGE):  # those with no session row now
        page = streams[i : i + SESSIONS_PAGE]
        gone |= set(page) - set(await store.log_ends(page))
    if not gone:
        return problems
    named: list[tuple[int, set[str]]] = []
    chains = Chains()
    async for e in entries(store, stream=DELETIONS_STREAM):
        if chains.check(e) is None and e.n > since and e.type == SESSION_DELETED:
            named.append((e.n, gone & _deleted_by(e.data)))
    # The head read after the entries: one past it was appended by hand, with no deletion.
    head = await _deletions_head(store)
    deleted = {sid for n, sids in named if n <= head for sid in sids}
    return [p for p in problems if p.stream not in deleted]


def _deleted_by(data: dict[str, Any]) -> set[str]:
    """The ids of the sessions a deletion's entry says it deleted."""
    sessions = data.get("sessions")
    ids = (
        {s.get("id") for s in sessions if isinstance(s, dict)}
        if isinstance(sessions, list)
        else set()
    )
    return {i for i in ids if isinstance(i, str)}


@dataclass(slots=True, kw_only=True)
class _Group:
    """Streams verified together: their heads, and what their entries are checked against
    (none of it for the streams of no session), then the entries themselves, `found`."""

    heads: dict[str, tuple[int, str | None]]
    found: AsyncIterator[AuditEntry]
    rows: list[RequestRow] = field(default_factory=list)
    audited: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    ends: dict[str, tuple[int, int]] = field(default_factory=dict)
    gaps: dict[str, Gap] = field(default_factory=dict)
    snapshots: dict[str, StoredSnapshot] = field(default_factory=dict)


async def _groups(store: Store, stream: str | None) -> AsyncIterator[_Group]:
    """The streams to verify, a group at a time. Each group's heads are read before its rows,
    its rows before its audited events and snapshots, and those before its entries: a commit
    meanwhile only adds entries past these heads, each row comes with the length its session's
    chain had when it was read, and each audited event read has its entry, committed with it,
    among those read after. A deletion meanwhile erases all of a session's: `verify` then
    finds it recorded (`_but_deleted`)."""
    if stream is not None:
        heads = await store.audit_heads(stream=stream)
        found = entries(store, stream=stream)
        if stream.startswith(_OWN_STREAMS):  # no requests in its stream
            yield _Group(heads=heads, found=found)
        else:
            yield await _session_group(store, heads, [stream], found)
        return
    if not hasattr(store, "audit_sessions"):
        # A store that cannot page its sessions (written for an earlier signoff): each stream
        # it keeps a head for, one at a time.
        for sid, head in (await store.audit_heads()).items():
            found = entries(store, stream=sid)
            if sid.startswith(_OWN_STREAMS):
                yield _Group(heads={sid: head}, found=found)
            else:
                yield await _session_group(store, {sid: head}, [sid], found)
        return
    after = ""
    while True:
        heads = await store.audit_sessions(after=after, limit=SESSIONS_PAGE)
        if heads:
            sessions = list(heads)
            yield await _session_group(store, heads, sessions, entries(store, sessions=sessions))
        if len(heads) < SESSIONS_PAGE:
            break
        after = sessions[-1]
    yield _Group(heads=await store.audit_heads(others=True), found=entries(store, others=True))


async def _session_group(
    store: Store,
    heads: dict[str, tuple[int, str | None]],
    sessions: list[str],
    found: AsyncIterator[AuditEntry],
) -> _Group:
    """A group of `sessions` whose `heads` were read: their rows, audited events, where their
    logs end (and their gaps) and their snapshots, read in that order, before their entries are
    `found`."""
    if len(sessions) == 1:  # by its id, as a store of an earlier signoff reads them too
        rows = await request_rows(store, session_id=sessions[0])
    else:
        rows = await request_rows(store, sessions=sessions)
    audited = await _audited(store, sessions)
    ends, gaps = await log_ends(store, sessions)
    return _Group(
        heads=heads,
        found=found,
        rows=rows,
        audited=audited,
        ends=ends,
        gaps=gaps,
        snapshots=await store.snapshots(sessions) if hasattr(store, "snapshots") else {},
    )


async def _audited(store: Store, sessions: list[str]) -> dict[str, list[tuple[int, str]]]:
    """The audited events of `sessions` in their logs, `(seq, type)` each; none from a store
    written for an earlier signoff, which cannot list them."""
    if not hasattr(store, "audited_events"):
        return {}
    return await store.audited_events(sessions)


async def _check(store: Store, group: _Group, left: Leftovers) -> list[AuditProblem]:
    """The problems of one group of streams, all of whose entries are `found`; the rows and
    requests that only another group can pair are `left` to it."""
    heads, ends, gaps, snapshots = group.heads, group.ends, group.gaps, group.snapshots
    chains = Chains()
    requests = RequestTrail()
    unentried = _Unentried(group.audited)
    past: dict[str, None] = {}  # streams with entries past the head read above, in order
    placed: dict[str, tuple[int, int]] = {}  # the last entry of each session up to its snapshot
    before_gap: dict[str, tuple[int, int]] = {}  # and before the first event missing in its log
    problems: list[AuditProblem] = []
    async for e in group.found:
        unentried.see(e, chains)
        problem = chains.check(e)
        if problem is not None:
            problems.append(problem)
        requests.see(e)
        head = heads.get(e.stream, (0, None))[0]
        if e.n > head and head != DAMAGED:
            past[e.stream] = None
        snapshot = snapshots.get(e.stream)
        if snapshot is not None and e.seq is not None and 0 <= e.seq <= snapshot.seq:
            placed[e.stream] = (e.id, e.n)
        gap = gaps.get(e.stream)
        if gap is not None and e.seq is not None and 0 <= e.seq < gap.first:
            before_gap[e.stream] = (e.id, e.n)
    last, last_id = chains.last, chains.last_id
    for sid, (n, digest) in heads.items():
        seen, seen_hash = last.get(sid, (0, None))
        keeper = "stream" if sid.startswith(_OWN_STREAMS) else "session"
        if n == DAMAGED:
            reason = f"the length of the chain its {keeper} keeps is not a whole number"
        elif seen < n:
            missing = f"entry {n} is" if seen + 1 == n else f"entries {seen + 1} to {n} are"
            reason = f"{missing} missing from the end of the {keeper}'s chain"
        elif seen == n and seen_hash != digest:
            reason = f"the chain does not end with the hash its {keeper} keeps"
        else:
            continue
        problems.append(AuditProblem(id=last_id.get(sid, 0), stream=sid, n=seen + 1, reason=reason))
    for sid in past:
        # Heads only move forward: entries still past them now were not written with them.
        n = (await store.audit_heads(stream=sid)).get(sid, (0, None))[0]
        seen = last[sid][0]
        if seen > n:
            keeper = "stream" if sid.startswith(_OWN_STREAMS) else "session"
            extra = f"entry {seen} is" if seen == n + 1 else f"entries {n + 1} to {seen} are"
            reason = f"{extra} past the end of the chain its {keeper} keeps"
            problems.append(AuditProblem(id=last_id[sid], stream=sid, n=n + 1, reason=reason))
    broken = {p.stream for p in problems}
    for sid, (head, end) in ends.items():
        # Its newest events deleted (those of no entry, or with their entries and the chain
        # head rewound): the session row still says where its log ended.
        if head != end and sid not in broken:
            reason = f"the event log ends at event {end}, but its session keeps {head} as its last"
            n = last.get(sid, (0, None))[0] + 1
            problems.append(AuditProblem(id=last_id.get(sid, 0), stream=sid, n=n, reason=reason))
    broken = {p.stream for p in problems}
    for sid, missed in unentried.left(chains).items():
        if sid in broken:
            continue  # its entries no longer say which events they stand for
        for seq, kind, n, entry_id in missed:
            reason = (
                f"event {seq} of the log ({kind}) is audited, but no entry of the session's "
                "chain stands for it"
            )
            problems.append(AuditProblem(id=entry_id, stream=sid, n=n, reason=reason))
    found = requests.check(group.rows, heads, broken, left)
    # A log named already (an event with no entry, too) is not folded again for its snapshot,
    # nor named for a gap, which a snapshot after it names as its events not folding.
    logged = {p.stream for p in problems}
    folded = await snapshot_problems(store, snapshots, placed, logged)
    logged.update(sid for _, sid, _, _ in folded)
    found += folded
    for sid, gap in gaps.items():
        if sid not in logged:
            entry_id, n = before_gap.get(sid, (0, 0))
            found.append((entry_id, sid, n, gap.reason))
    for entry_id, sid, n, reason in found:
        problems.append(AuditProblem(id=entry_id, stream=sid, n=n, reason=reason))
    return problems


class _Unentried:
    """The log's audited events of a group of sessions that no entry read stands for: each by
    `(seq, type, n, id)`, `n` the place its entry would take and `id` the entry before it (0
    if none). A session's entries come in order, and so do its audited events."""

    def __init__(self, audited: dict[str, list[tuple[int, str]]]) -> None:
        self.todo = {sid: deque(events) for sid, events in audited.items()}
        self.missed: dict[str, list[tuple[int, str, int, int]]] = {}

    def see(self, e: AuditEntry, chains: Chains) -> None:
        """Take in `e`, before `chains` checks it: the events before its own have no entry."""
        todo, at = self.todo.get(e.stream), e.seq
        if not todo or at is None:
            return
        self._miss(e.stream, chains, lambda seq: seq < at)
        if todo and todo[0][0] == at:
            todo.popleft()

    def left(self, chains: Chains) -> dict[str, list[tuple[int, str, int, int]]]:
        """Every event no entry stood for, by session, once all the entries were seen."""
        for sid in self.todo:
            self._miss(sid, chains, lambda seq: True)
        return self.missed

    def _miss(self, sid: str, chains: Chains, before: Callable[[int], bool]) -> None:
        todo = self.todo[sid]
        n, entry_id = chains.last.get(sid, (0, None))[0], chains.last_id.get(sid, 0)
        while todo and before(todo[0][0]):
            seq, kind = todo.popleft()
            self.missed.setdefault(sid, []).append((seq, kind, n + 1, entry_id))


def tool_setting(agent: Agent, name: str) -> str:
    """The approval setting shown for a tool: what the guardrails make of it (as the dashboard
    names it) or its policy's name, then the rules its requests take and its response policy
    (which still decides who answers a request parked before a guardrail denied the tool)."""
    tool = agent.tools[name]
    guarded = guardrail_setting(agent.guardrails, name)
    setting = guarded or tool.approval.describe()
    rules = getattr(tool.approval, "rules", None)  # a policy of the app's may have others
    if isinstance(rules, RequestRules) and guarded != DENIED_BY_GUARDRAIL:
        if guarded is not None:
            rules = rules.guarded()
        said = rules.described(quorum=f"{rules.approvers} approvers" not in setting)
        setting += f" [{said}]" if said else ""
    if tool.response_policy is not None:
        setting += RESPONSE_POLICY_NOTE
    return setting


async def response_policy_recorded(store: Store, request: InputRequest) -> bool:
    """Whether the last recorded setting of the request's tool has a response policy (every
    runtime records its tools' settings when it opens the store): what tells, for a request
    recorded before requests carried `response_policy`, that a policy decides it."""
    if request.kind != "tool-approval" or request.tool_name is None:
        return False
    setting = None
    async for entry in entries(store, stream=f"{TOOLS_STREAM}{request.agent}.{request.tool_name}"):
        setting = entry.data.get("new")
    return isinstance(setting, str) and setting.endswith(RESPONSE_POLICY_NOTE)


async def record_tool_settings(store: Store, agents: Iterable[Agent], now: float) -> None:
    """Record each tool whose approval setting differs from the last one recorded. Each entry is
    written only if its stream has not moved since it was read, so runtimes opening at once
    record a change once; what they skipped is compared again with what the others wrote."""
    agents = list(agents)
    for _ in range(3):
        rows = []
        for agent in agents:
            for name in agent.tools:
                stream = f"{TOOLS_STREAM}{agent.name}.{name}"
                new = tool_setting(agent, name)
                old, n = None, 0
                async for e in entries(store, stream=stream):
                    old, n = e.data.get("new"), e.n
                if old != new:
                    rows.append(
                        AuditRow(
                            stream=stream,
                            type=TOOL_SETTING,
                            at=now,
                            seq=None,
                            data={"agent": agent.name, "tool": name, "old": old, "new": new},
                            after=n,
                        )
                    )
        if not rows:
            break
        await store.record_audit(rows)

"""The `Store` protocol every backend implements, and the records it moves."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .._events import Event
from .._exceptions import SchemaVersionError
from .._types import InputRequest
from ._audit import AuditEntry, AuditRow, LogShape, StoredSnapshot
from ._initiators import InitiatorFilter
from ._pending import PendingFilter, created_before
from ._session_rows import SessionSummary

__all__ = [
    "AUDIT_RECORDED",
    "CHANNEL_CLAIMED",
    "CHANNEL_MEMOS",
    "CHANNEL_RELEASED",
    "Commit",
    "FaultHook",
    "LEASE_ACQUIRED",
    "LEASE_CLAIMED",
    "LEASE_RELEASED",
    "LEASE_RENEWED",
    "Loaded",
    "PendingFilter",
    "READ_BYTES",
    "RequestRow",
    "Resolve",
    "Store",
    "SessionSummary",
    "StoredRequest",
    "created_before",
    "lapsed_ancestors_sql",
    "older_schema",
    "parent_of",
]

READ_BYTES = 4 << 20
"""How much event JSON one read of `Runtime.events()` holds (`read_events(max_bytes=...)`):
500 events of megabytes each would otherwise be held at once, per stream. The server's event
stream reads less at a time, 64 KiB (`signoff.server._sse.READ_BYTES`), or this if smaller."""

FaultHook = Callable[[Literal["before", "after"], str], None]
"""Test-only: called right before and right after each commit, named by its first event type,
each recording of audit entries no event carries, named `AUDIT_RECORDED`, and each write of a
lease, a channel claim or channel memos, named by the labels below."""

AUDIT_RECORDED = "audit.recorded"
"""The fault hook's label of `record_audit` (tool setting changes, dashboard sign-outs)."""
LEASE_ACQUIRED = "lease.acquired"
"""The fault hook's label of `acquire_lease`."""
LEASE_RENEWED = "lease.renewed"
"""The fault hook's label of `renew_lease` (made on a timer, not at a fixed place in a run)."""
LEASE_RELEASED = "lease.released"
"""The fault hook's label of `release_lease` (a drive's end, a runtime's close)."""
LEASE_CLAIMED = "lease.claimed"
"""The fault hook's label of `claim` (a worker taking sessions with work)."""
CHANNEL_CLAIMED = "channel.claimed"
"""The fault hook's label of `claim_channel` (a channel hub taking or keeping its channel)."""
CHANNEL_RELEASED = "channel.released"
"""The fault hook's label of `release_channel`."""
CHANNEL_MEMOS = "channel.memos"
"""The fault hook's label of `keep_channel_memos` (a click kept before its 200, say)."""


def older_schema(where: str, found: int, needed: int) -> SchemaVersionError:
    """The error of a store opened with `migrate=False` whose schema (`found`, 0 for none) is
    older than this signoff's: upgrading is `signoff db upgrade`'s to do, once no process of
    the older signoff still writes rows without what the new schema adds."""
    if found == 0:
        return SchemaVersionError(
            f"{where} has no signoff schema (this signoff needs store schema {needed}): run "
            "`signoff db upgrade` to create it"
        )
    return SchemaVersionError(
        f"{where} is at store schema {found}, this signoff needs {needed}: run "
        "`signoff db upgrade` (once no older signoff uses it)"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolve:
    """Compare-and-set of one request from `pending` to a final status, inside a commit."""

    request_id: str
    status: Literal["settled", "expired", "withdrawn"]
    outcome: str
    resolution: dict[str, Any]


@dataclass(slots=True, kw_only=True)
class Commit:
    """Everything one transaction writes to one session.

    It applies only if the session's head is still `expected_seq` (and, given a lease token, the
    lease is still ours: that token, and `lease_owner`'s if given, and given `expected_event`,
    the event there is still that one); every `Resolve` must find its request pending, or
    nothing is written.
    """

    session_id: str
    expected_seq: int
    events: Sequence[Event]
    lease_token: int | None = None
    # The owner the lease was granted to: a token alone repeats once the lease row is deleted
    # (by hand, a restore), and the holder that never knew would write beside the new one.
    lease_owner: str | None = None
    new_requests: Sequence[InputRequest] = ()
    updated_requests: Sequence[InputRequest] = ()  # new data for still-open requests
    resolve: Sequence[Resolve] = ()
    snapshot: dict[str, Any] | None = None
    durable: bool = False
    status: str | None = None
    expires_at: float | None = None
    # False when the events only record what time did (a passed TTL): the session row keeps
    # its `updated_at` (its last activity, which prune ages it by) instead of the last event's
    # `at`. A store that ignores it moves `updated_at` as before.
    activity: bool = True
    release_lease: bool = False  # with lease_token: the drive ends here, so free the lease too
    # With release_lease: the turn ends here after waiting for a person, so it was slow anyway
    # and the store may tidy up at no cost to back-to-back turns (SQLite folds its WAL).
    waited: bool = False
    # The event at `expected_seq` the commit was planned on (`SessionState.shown`; its type and
    # time are compared): a store that lost it in a crash, and had that seq written again since,
    # refuses the commit (`AppendConflict`) rather than have it build on what is gone.
    expected_event: Event | None = None
    # Without a lease token: `(owner, ttl, now)`, as `acquire_lease` takes them, to grant that
    # owner the session's lease in the same transaction if no other owner's is live, so no claim
    # takes the turn the commit makes runnable before the drive it is for. The store sets
    # `granted` to the lease's token (None: not granted; a store that cannot leaves it None).
    grant: tuple[str, float, float] | None = None
    granted: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Loaded:
    """A session as stored: its latest snapshot (if any) and the events after it, and the head
    its row kept when read (before the events), to tell a damaged log from a short one."""

    session_id: str
    agent: str
    snapshot: dict[str, Any] | None
    events: list[Event]
    head: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredRequest:
    """A request as its row keeps it: the request, its status (`pending`, `settled`, `expired`
    or `withdrawn`) and, once closed, its outcome and resolution; and when its session's TTL
    passes (None: never), read with it so that a mirror of it needs no second read."""

    request: InputRequest
    status: str
    outcome: str | None
    resolution: dict[str, Any] | None
    session_expires_at: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRow:
    """A request's row as `Store.stored_requests` reads it for verification: its columns as
    stored, the request and resolution read back (None, and `damage` saying why, if they cannot
    be), and how many audit entries its session's chain had when the row was read."""

    id: str
    session_id: str
    audit_n: int
    agent: object
    kind: object
    tool: object
    created_at: object
    status: object
    outcome: object
    request: InputRequest | None
    resolution: dict[str, Any] | None
    deadline: object  # the `expires_at` column the sweep finds due requests by
    damage: str | None = None


@runtime_checkable
class Store(Protocol):
    """Durable home of sessions: the event log plus tables derived from it in the same commit.
    A row it cannot decode raises `StoreDamaged` (a server's listing leaves that session out);
    any other `StoreError` is the store failing, and fails the listing.

    A store may also offer `server_time()` (the clock the runtime times everything by, as of
    the middle of the call: a wait before its query reads it is made up for) and
    `granted_head(session_id, token, *, shown=None)` (the head it read when it granted that
    lease, which saves a drive a round trip; None if `shown`, the event a cached state ends at,
    was not the event at that head); the runtime uses them when present, as PostgreSQL's store
    has them. The runtime always passes `shown=` to `head` and `granted_head`: a store written
    before it took `shown` must take it (and check it) to be used by this signoff.
    Both stores have `keep_channel_memos(memos, now, durable=False)` (`durable`: synced as an
    answer's commit is), `channel_memo(name)` and `channel_memos(prefix)` (each name, value and
    when it was kept): JSON texts a channel keeps for the hub that delivers to it next (on
    another machine, another state).
    Likewise `lapsed_sessions(now, limit=, offset=, agents=, after=, ids=)`, the running or
    waiting sessions (of `agents` only, and of `ids` only, if given) whose TTL passed by
    `now`, by expiry then id, past `after` (an expires_at and id: the sweep pages by it, so
    one recorded meanwhile shifts no later one out) (both stores have it: a sweep then reads
    only those of its agents; a listing asks about its page's sessions, `ids`, and reads
    every lapsed one of their agents where the method has no `ids`);
    `orphaned_children(agents, limit=, offset=, after=)`, the running or waiting sessions of
    `agents` still on the turn a parent (`parent_of`) delegated from a turn since ended or
    replaced, by id, past the id `after` (the sweep pages by it; one without `after` is paged
    by offset) (both stores have it: the orphan sweep then reads only those, not every child);
    `lapsed_ancestors(now)`, the ids of the sessions with open requests above a running or
    waiting subagent session whose TTL passed by `now`, or above one with an open request past
    its deadline (both stores have it: counting the open requests then reads the mirrors of
    only those sessions, not of the whole queue);
    `pending_counted(flt)`, `pending(flt)` and `count_pending(flt)` read in one snapshot (both
    stores have it: a listing's total then never differs from its page by a commit between);
    `sessions_counted(...)`, `sessions(...)` and `count_sessions(...)` (the same keywords) read
    in one snapshot, likewise for the listings of sessions;
    `lease_held(session_id, now)`, whether a drive holds the session's lease at `now` (both
    stores have it: a listing then reads that, where it took the lease and gave it back, a
    write that a store it may only read refuses);
    `running_unheld(agent, now, last_types=, among=, ids=, limit=, after=)`, the running
    sessions of `agent` (of `ids` only, if given) whose TTL has not passed by `now`, whose
    lease no drive holds at `now` and whose last event (of those of `among`'s types, if given)
    is of one of `last_types`, by id past `after` (both stores have it: the inline sweep then
    reads those only, not the lease and events of every running session; a listing asks about
    its page's sessions, `ids`, and reads each of them where the method has no `ids`).
    These three only a sweep reads: a row of theirs that cannot be read is listed in its place
    as a `DamagedSession` (`_swept_rows`), which the sweep logs and passes.
    `pending_keys(flt)` lists each row `pending(flt)` would as `(created_at, id, session id)`,
    its data unread (both stores have it: a background reader, or a listing people read, then
    reads a page with a damaged row again a row at a time, passing that one,
    `_queue_page.passing_page`).
    `request_session(request_id)` is the id of the session holding that request (None if there
    is no such request), its data unread (both stores have it: the server decides whether a
    caller may see a request before reading it, so a foreign one's 404 costs what a missing
    one's does, however large its input).
    `check_deletion(session_id, now=, force=)` raises what `delete_session` would refuse the
    session with, deleting nothing (both stores have it: `signoff delete` then says so before
    it asks whether to delete).
    A store whose `pending()` honours `PendingFilter.due_by` lists only the due requests."""

    url: str

    async def open(self) -> None:
        """Connect and check the schema (creating or upgrading it where allowed); the store's
        other calls open it first if need be."""
        ...

    async def close(self) -> None:
        """Let go of the connections; a closed store can be opened again."""
        ...

    async def create_session(
        self,
        session_id: str,
        agent: str,
        events: Sequence[Event],
        expires_at: float | None,
        *,
        status: str = "idle",
        lease: tuple[str, float, float] | None = None,
    ) -> int | None:
        """Write a new session with its first events in one transaction; a `session_id`
        already stored is a `StoreError`, and one `delete_session` erased `SessionDeleted`,
        each writing nothing. The events may start its first
        turn too (`status` is then the one that turn gives it: a new session and its first
        message are one write); none of them is an audited one (`AUDIT_TYPES`). With `lease`
        (`owner, ttl, now`, as `acquire_lease` takes them) the session is leased to that owner
        in the same write, and the lease's token is returned (None without one)."""
        ...

    async def load(self, session_id: str) -> Loaded | None:
        """The session's latest snapshot and the events after it, or None if there is no such
        session: what the runtime rebuilds its state from."""
        ...

    async def read_events(
        self,
        session_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        newest: int | None = None,
        max_bytes: int | None = None,
        shown: Event | None = None,
    ) -> list[Event]:
        """Events after `after` (of `types`, if given), oldest first: the first `limit` of them,
        or the newest `newest`. With `max_bytes` (not with `newest`) the read stops after the
        event that brings their JSON to that size, so one read of large events holds a bounded
        amount: fewer than `limit` then does not mean the log ends there. `shown`, the event at
        `after` a follower read before, is checked in the same read (`EventsRewritten`)."""
        ...

    async def head(self, session_id: str, *, shown: Event | None = None) -> int | None:
        """The seq of the session's last event, or None if there is no such session. `shown`,
        an event a cached state ended at, is checked in the same read (`EventsRewritten`)."""
        ...

    async def commit(self, commit: Commit) -> None:
        """Apply `commit` in one transaction, or nothing of it: `AppendConflict` if the head
        moved, `LeaseLost` if the lease was taken over, `RequestClosed` if a request it resolves
        is no longer pending, `UnknownSession` if the session is gone. The session row takes the
        commit's `status` (if given) and `expires_at`, and, unless `activity` is False, the last
        event's `at` as its `updated_at`."""
        ...

    async def get_request(self, request_id: str) -> StoredRequest | None:
        """One request as stored, open or closed, or None if there is no such request."""
        ...

    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        """The requests `flt` picks, oldest first (by `created_at`, then those of one moment
        in the order asked, then id: `_pending.listing_order`), one page
        (`flt.limit` from `flt.offset`, past `flt.after` if given)."""
        ...

    async def count_pending(self, flt: PendingFilter) -> int:
        """How many requests `flt` picks, all pages together (for a listing's total)."""
        ...

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        """Lease the session to `owner` until `now + ttl` and return the new token (which fences
        commits under older ones), or None while another owner's lease is live (on PostgreSQL,
        also one granted before the server last started, for one TTL of its own after that:
        its holder could not renew it while the server was down)."""
        ...

    async def renew_lease(
        self, session_id: str, owner: str, token: int, ttl: float, now: float
    ) -> bool:
        """Extend lease `token` of `owner` to `now + ttl`, never earlier than it already runs
        (a renewal applied late must not shorten it); False if that lease is no longer held."""
        ...

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        """Let go of lease `token` of `owner`, so another may drive the session at once; nothing
        if that lease is no longer held."""
        ...

    async def claim(
        self,
        owner: str,
        ttl: float,
        now: float,
        limit: int,
        agents: Sequence[str] | None = None,
        *,
        skip: Sequence[str] = (),
    ) -> list[tuple[str, int]]:
        """Lease up to `limit` sessions that have work and no live lease, nor a lapsed one that
        `acquire_lease` leaves to its holder, unless `owner` is that holder (of `agents` only, if
        given: a worker leaves others' sessions to workers that can drive them), none of `skip`
        (those its process drives now: a lease of theirs lapsed under a stall is still theirs
        to renew, not a second drive's to take in the same process)."""
        ...

    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        initiated_by: InitiatorFilter | None = None,
    ) -> list[SessionSummary]:
        """Sessions (of `agent`, in `status`, started by whom `initiated_by` picks, if given),
        most recently active first."""
        ...

    async def count_sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        initiated_by: InitiatorFilter | None = None,
    ) -> int:
        """How many sessions `sessions` would list with no limit (of `agent`, in `status`,
        started by whom `initiated_by` picks)."""
        ...

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        """Test-only: call `hook` right before and after each commit, each `record_audit` and
        each write of a lease, a channel claim or channel memos (None removes it), to inject a
        crash at either point."""
        ...

    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append audit entries no event carries (tool setting changes) to their streams'
        hash chains."""
        ...

    async def audit(
        self,
        *,
        stream: str | None = None,
        after_id: int = 0,
        limit: int = 1000,
        sessions: Sequence[str] | None = None,
        others: bool = False,
        upto_id: int | None = None,
    ) -> list[AuditEntry]:
        """Entries after `after_id` (and up to `upto_id`, if given) in id order: of `stream`, of
        the `sessions` listed, or with `others` of no session row (tool-setting and dashboard
        streams, and the entries of a session whose row is gone); of every stream if none is
        given."""
        ...

    async def audit_window(self, *, after_id: int = 0, limit: int = 1000) -> int | None:
        """The id of the `limit`-th entry after `after_id` in id order, or of the last one if
        fewer follow (None if none does): a read of few entries among all (`others`) up to it
        looks at `limit` entries at most, not at the whole trail to fill a page."""
        ...

    async def claim_channel(
        self,
        name: str,
        owner: str,
        ttl: float,
        now: float,
        *,
        after_id: int | None = None,
        succeeds: str | None = None,
        renewing: bool = False,
        memos: Mapping[str, str | None] | None = None,
    ) -> tuple[bool, int | None, float | None]:
        """Take or keep the claim `name` (a channel hub's on a channel) for `owner` until
        `now + ttl`, if it is free, lapsed or `owner`'s (or its owner's name starts with
        `succeeds`): `(True, the position saved in it, when it lapsed or was given back)`,
        saving `after_id` first if given; else `(False, None, None)`. With `renewing`, only
        while it still names `owner` (a hub's renewal never takes back a claim another hub
        took, even one given back since); `memos` (as `keep_channel_memos` takes them) are kept
        in the same transaction, only if the claim is held. A store with a clock of its own
        (PostgreSQL) times claims by it rather than by `now`. A store without it (an earlier
        signoff's) leaves each hub to deliver on its own; one written before it took
        `renewing` and `memos` must take them to be used by this signoff."""
        ...

    async def release_channel(self, name: str, owner: str, now: float) -> None:
        """Give back the claim `name` if `owner` holds it, as of `now`; its position stays."""
        ...

    async def audit_heads(
        self, *, stream: str | None = None, others: bool = False
    ) -> dict[str, tuple[int, str | None]]:
        """The last entry `(n, hash)` of each audit chain (of `stream` only, if given; of the
        streams other than sessions only, with `others`) as the store keeps it apart from the
        entries, in the session's row or the stream's head row, so entries removed from a
        chain's end are noticed too."""
        ...

    async def audit_sessions(
        self, *, after: str = "", limit: int = 100
    ) -> dict[str, tuple[int, str | None]]:
        """The chain heads of the first `limit` sessions with ids after `after`, in id order,
        `(0, None)` for a session with no entry: verification goes through a store this way,
        a page of sessions at a time."""
        ...

    async def audited_events(self, sessions: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
        """The `(seq, type)` of each event of an audited type (`AUDIT_TYPES`) of the `sessions`
        listed, in seq order, by session (one that has none is left out), in one statement:
        verification checks that each has its entry in the session's chain."""
        ...

    async def log_ends(self, sessions: Sequence[str]) -> dict[str, tuple[int, int]]:
        """`(head, last)` of each of the `sessions` listed (one with no row is left out): the
        last event its session row keeps, and the last seq in its log (0 if none), read in one
        statement: verification reads which sessions are still there by it, and where their
        logs end from a store without `log_shapes`."""
        ...

    async def log_shapes(self, sessions: Sequence[str]) -> dict[str, LogShape]:
        """What `log_ends` reads, and how many event rows each log holds, their lowest seq and
        the sum of their seqs (`LogShape`), read in one statement: verification checks that the
        log ends where its session says and holds each event up to there, so an event row
        deleted from its middle is a gap it names. A store without it (an earlier signoff's)
        is verified by `log_ends`, its gaps unseen."""
        ...

    async def snapshots(self, sessions: Sequence[str]) -> dict[str, StoredSnapshot]:
        """The snapshot of each of the `sessions` listed that has one, read in one statement:
        verification checks that it is the fold of the session's events up to its `seq`."""
        ...

    async def stored_requests(
        self,
        *,
        session_id: str | None = None,
        after: str = "",
        limit: int = 1000,
        sessions: Sequence[str] | None = None,
    ) -> list[RequestRow]:
        """Request rows (of one session, or of the `sessions` listed, if given) with ids after
        `after`, in id order, each read in one statement with its session's `audit_n`, for
        checking against the trail."""
        ...


def lapsed_ancestors_sql(ph: str, prefix: str = "", deadline: str = "expires_at") -> str:
    """`lapsed_ancestors(now)`'s query, the same on both stores (`ph` the driver's placeholder,
    `prefix` the tables' schema): the sessions above a lapsed subagent, or above one holding an
    open request past its deadline (from the index of those), up the `parent` links. The lapsed
    subagents are a range of `sessions_children` (status, then `deadline`: the column indexed,
    PostgreSQL's copy kept for children only); one with no TTL has a NULL deadline, which no
    `<=` matches and neither store's range reaches."""
    return (
        "WITH RECURSIVE above(sk) AS ("
        f"SELECT parent FROM {prefix}sessions WHERE parent IS NOT NULL "
        f"AND status IN ('running', 'waiting') AND {deadline} <= {ph} "
        f"UNION SELECT c.parent FROM {prefix}requests d JOIN {prefix}sessions c ON c.sk = d.sk "
        f"WHERE d.status = 'pending' AND d.expires_at <= {ph} AND c.parent IS NOT NULL "
        f"UNION SELECT c.parent FROM {prefix}sessions c JOIN above a ON c.sk = a.sk "
        "WHERE c.parent IS NOT NULL) "
        f"SELECT s.id FROM {prefix}sessions s JOIN above a ON a.sk = s.sk WHERE EXISTS "
        f"(SELECT 1 FROM {prefix}requests r WHERE r.sk = s.sk AND r.status = 'pending' "
        # OFFSET 0 keeps PostgreSQL checking each session found by the index of requests: it
        # overestimates the sessions above, and would otherwise read every pending request.
        "LIMIT 1 OFFSET 0) ORDER BY s.sk"
    )


def parent_of(events: Sequence[Event]) -> tuple[str | None, str | None]:
    """The parent session a new session's `session.created` names (a subagent's), if any, and
    the parent's turn that delegated to it where it names one (else the store takes the
    parent's current turn)."""
    first = events[0] if events else None
    if first is None or first.type != "session.created":
        return None, None
    parent, turn = first.data.get("parent"), first.data.get("parent_turn")
    if not isinstance(parent, str):
        return None, None
    return parent, turn if isinstance(turn, str) else None

"""A SQLite store's WAL fold (the checkpoint a park runs once no lease is left, `wal.fold`) killed
halfway, some of the WAL's pages copied into the database file and the WAL not yet truncated:
the store opens the file, the parked turn and its request are there whole, the file passes
SQLite's integrity check, and the approved turn ends with the tool run once.

The kill lands inside the checkpoint's copy, not before or after it (a thread watching the file
lost the race to a copy of a few milliseconds): at the fold, the child caps the size of the
files it may write (`RLIMIT_FSIZE`) at half what the copy will grow the database file to, with
`SIGXFSZ` at its default action, so the kernel kills it at the write that crosses the cap, as
abruptly as SIGKILL (no handler, no cleanup, nothing of SQLite's after that write runs)."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
from pathlib import Path

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from . import _proof
from ._forks import Scripts
from .test_sqlite_upgrade import _child_env

# Parks a turn whose prompt (random text SQLite cannot shrink) makes a WAL of some megabytes,
# autocheckpoints off, so the fold has pages to copy; at the fold, the cap (the file's size now
# and half the WAL's). It prints the prompt's digest first; "not killed" if it lived.
_PARK = """
import asyncio, base64, hashlib, os, resource, signal, sys
import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent
url, db = sys.argv[1], sys.argv[2]

@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    \"\"\"Refund an order.\"\"\"
    return "refunded"

agent = scripted_agent(
    "support", [call_tools(call("refund", order_id="1")), reply("done")], tools=[refund]
)
prompt = base64.b64encode(os.urandom(3 << 20)).decode()
print(hashlib.sha256(prompt.encode()).hexdigest(), flush=True)

def hook(when, label):
    if when == "before" and label == "wal.fold":
        cap = os.path.getsize(db) + os.path.getsize(db + "-wal") // 2
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it: a write would fail
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, resource.RLIM_INFINITY))

async def main():
    async with so.Runtime([agent], store=url) as rt:
        rt.store.conn.execute("PRAGMA wal_autocheckpoint=0")
        rt.store.set_fault_hook(hook)
        await rt.generate("support", prompt=prompt)
        print("not killed", flush=True)

asyncio.run(main())
"""


def refund_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "support", [call_tools(call("refund", order_id="1")), reply("done")], tools=[refund]
    )


async def test_a_wal_fold_killed_halfway_loses_nothing(tmp_path: Path, scripts: Scripts) -> None:
    db = tmp_path / "state.db"
    url = f"sqlite:///{db}"
    async with so.Runtime([], store=url):
        pass  # the file made, its schema folded in: the child's fold copies its turn alone
    before = db.stat().st_size
    done = scripts.run(_PARK, url, str(db), env=_child_env())
    assert done.returncode == -signal.SIGXFSZ, done.stdout + done.stderr
    _proof.record("crash-outside:kills")
    digest = done.stdout.split()[0]
    # Halfway: pages reached the file, and the WAL is still whole (the fold truncates it last).
    killed_at, wal = db.stat().st_size, (tmp_path / "state.db-wal").stat().st_size
    assert before < killed_at and wal > 3 << 20, (before, killed_at, wal)

    log = ExecutionLog()
    async with so.Runtime([refund_agent(log)], store=url) as rt:
        [session] = await rt.sessions()
        [request] = await rt.pending()
        state = await rt.state(session.id)
        assert state.turn is not None and state.turn.status == "waiting"
        [started] = [
            e async for e in rt.events(session.id, follow=False) if e.type == "turn.started"
        ]
        assert hashlib.sha256(started.data["message"].encode()).hexdigest() == digest
        decision = so.Decision(id=request.id, approved=True, reason="ok")
        r = await rt.generate(session_id=session.id, approvals=[decision])
        assert (r.status, r.text) == ("completed", "done")
        assert await rt.verify_audit() == []
    assert log.count("refund") == 1
    assert db.stat().st_size > killed_at  # the fold was cut short: folded whole only now
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

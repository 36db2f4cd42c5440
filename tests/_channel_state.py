"""The channel-state tests' recording channel, a runtime whose tool waits on an approval, an
old-layout state file and a memo damaged in one (shared by the tests/test_channel_state*.py
files and the webhook and Slack state tests).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import signoff as so
from signoff.channels import Channel
from signoff.testing import call, call_tools, scripted_agent

__all__ = [
    "OLD_LAYOUT",
    "Seen",
    "damage_memo",
    "erased",
    "gated",
    "old_state_file",
    "open_one",
]


# -- one hub delivers per state file: the others stand by ---------------------------------------


class Seen(Channel):
    """Records the requests it is told opened."""

    def __init__(self, name: str = "seen") -> None:
        super().__init__(name=name)
        self.opened: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.opened.append(request.id)


def gated(tmp_path: Path, store: str | None = None) -> so.Runtime:
    """A runtime whose every turn opens one approval request (on `store`, or a SQLite file)."""

    @so.tool(approval=so.always())
    async def deploy(env: str) -> str:
        """Deploy."""
        return env

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", env="prod"))], tools=[deploy], repeat_last=True
    )
    return so.Runtime([agent], store=store or f"sqlite:///{tmp_path / 'state.db'}")


async def open_one(rt: so.Runtime) -> str:
    (request,) = (await rt.generate("ops", prompt="deploy")).pending
    return request.id


async def erased(rt: so.Runtime) -> None:
    """A session with six audit entries (a request asked, answered, its call run, the next
    asked), deleted: a hole of six ids."""
    r = await rt.generate("ops", prompt="deploy")
    await rt.respond(
        r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
    )
    await rt.delete_session(r.session_id, reason="GDPR request 12", force=True)


# -- the file's layout: older ones brought up to date in place, newer ones refused --------------

OLD_LAYOUT = """
CREATE TABLE channel_positions (name TEXT PRIMARY KEY, after_id INTEGER NOT NULL);
CREATE TABLE channel_memos (channel TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (channel, key));
"""
"""The tables as signoff wrote them before memos were kept per hub (the file unmarked)."""


def old_state_file(
    path: Path, positions: dict[str, int], memos: list[tuple[str, str, Any]]
) -> None:
    """A state file in the old layout, as a process of that signoff left it."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(OLD_LAYOUT)
    conn.executemany("INSERT INTO channel_positions VALUES (?, ?)", positions.items())
    conn.executemany(
        "INSERT INTO channel_memos VALUES (?, ?, ?)",
        [(channel, key, json.dumps(value)) for channel, key, value in memos],
    )
    conn.close()


def damage_memo(path: Path, hub: str, channel: str, key: str, stored: str | bytes) -> None:
    """Write `stored` as the memo under `key`, as a hand or a tool other than signoff might."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO channel_memos (hub, channel, key, value) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(hub, channel, key) DO UPDATE SET value=excluded.value",
        (hub, channel, key, stored),
    )
    conn.close()

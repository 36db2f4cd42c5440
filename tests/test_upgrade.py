"""Sessions parked by an older signoff resume under this one: stores written by older commits
(tests/fixtures/upgrade, see its README) are migrated on open, every parked turn resumes to the
answer an uninterrupted run gives, each approved tool runs exactly once, and the audit chain
verifies before and after."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from tests import _upgrade
from tests._upgrade import ANSWERS, BOB, SCENARIOS
from tests.conftest import PG_BIN

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
SQLITE = sorted(p.stem for p in FIXTURES.glob("sqlite-*.db"))
POSTGRES = sorted(p.stem for p in FIXTURES.glob("postgres-*.sql"))


async def resume_all(rt: so.Runtime, sessions: dict[str, str]) -> dict[str, str | None]:
    """Answer every open request of each scenario's session as a person would (bob approves),
    then resume the turns that have nothing left to answer; returns each final text."""
    finals: dict[str, str | None] = {}
    for name in SCENARIOS:
        sid = sessions[name]
        result = None
        for _ in range(5):
            pending = await rt.pending(session_id=sid)
            if not pending:
                break
            request = pending[0]
            if request.kind == "question":
                label = ANSWERS[str(request.question)]
                option = next(o for o in request.options if o.label == label)
                answer = {"request_id": request.id, "option_id": option.id}
            else:
                answer = {"request_id": request.id, "option_id": "approve"}
            result = await rt.respond(sid, [answer], principal=BOB)
        if result is None:
            result = await rt.generate(session_id=sid)
        assert result.status == "completed", (name, result)
        finals[name] = result.text
    return finals


@dataclass
class Reference:
    """What an uninterrupted run with this signoff gives: each final text, and the effects
    before and after parking."""

    finals: dict[str, str | None]
    before: list[str]
    after: list[str]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    async def run() -> Reference:
        _upgrade.RAN.clear()
        url = f"sqlite:///{tmp_path_factory.mktemp('reference') / 's.db'}"
        async with so.Runtime(_upgrade.agents(), store=url) as rt:
            sessions = await _upgrade.park(rt)
            before = list(_upgrade.RAN)
            _upgrade.RAN.clear()
            finals = await resume_all(rt, sessions)
        return Reference(finals, before, list(_upgrade.RAN))

    return asyncio.run(run())


def test_the_reference_run_answers_every_scenario(reference: Reference) -> None:
    assert reference.finals["one"] == "user:go one | calls:refund | refund=refunded A1"
    assert reference.finals["flow2"] == (
        "user:go flow2 | calls:setup | setup=charge-K1 basic ship-K1 yes"
    )
    assert reference.finals["boss"] == "user:go boss | calls:worker | worker=" + (
        "user:refund D1 | calls:refund | refund=refunded D1"
    )
    assert "refund B1" in reference.before and "charge K1" in reference.before
    effects = reference.before + reference.after
    assert len(effects) == len(set(effects)) and "wire 500" in reference.after


def test_there_are_fixtures() -> None:
    assert len(SQLITE) >= 3 and len(POSTGRES) >= 3


async def _resume_and_check(url: str, manifest: dict[str, Any], reference: Reference) -> None:
    """Resume every parked scenario of an older store: same answers as the reference run, every
    effect exactly once over both runs, the audit chain whole before and after."""
    _upgrade.RAN.clear()
    async with so.Runtime(_upgrade.agents(), store=url) as rt:
        assert await rt.verify_audit() == []
        assert await resume_all(rt, manifest["sessions"]) == reference.finals
        assert await rt.verify_audit() == []
        for sid in manifest["sessions"].values():
            events = await rt.store.read_events(sid)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
    effects = manifest["ran"] + _upgrade.RAN
    assert sorted(effects) == sorted(reference.before + reference.after)
    _upgrade.RAN.clear()
    async with so.Runtime(_upgrade.agents(), store=url) as rt:  # nothing runs again
        for sid in manifest["sessions"].values():
            assert (await rt.generate(session_id=sid)).status == "completed"
        assert _upgrade.RAN == [] and await rt.pending() == []
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("fixture", SQLITE)
async def test_sessions_parked_in_an_older_sqlite_file_resume(
    fixture: str, tmp_path: Path, reference: Reference
) -> None:
    db = tmp_path / "state.db"
    shutil.copy(FIXTURES / f"{fixture}.db", db)
    manifest = json.loads((FIXTURES / f"{fixture}.json").read_text())
    await _resume_and_check(f"sqlite:///{db}", manifest, reference)


@pytest.mark.parametrize("fixture", POSTGRES)
async def test_sessions_parked_in_an_older_postgres_database_resume(
    fixture: str, pg_url: str, reference: Reference
) -> None:
    restore = [str(PG_BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", pg_url]
    subprocess.run(restore, input=(FIXTURES / f"{fixture}.sql").read_bytes(), check=True)
    manifest = json.loads((FIXTURES / f"{fixture}.json").read_text())
    await _resume_and_check(pg_url, manifest, reference)

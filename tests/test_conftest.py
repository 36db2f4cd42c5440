"""`PgCluster.fresh_database` (tests/conftest.py), which makes each test's PostgreSQL database
while the test before runs: each database goes to one test only, made from the template asked
for; a creation that failed in the background fails the test that takes it; `stop()` leaves no
thread behind."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from .conftest import PgCluster


class Maker:
    """Stands in for `create_database`: names made in order, or the error planned for a turn."""

    def __init__(self, fail_at: int = 0) -> None:
        self.made: list[tuple[str, str | None]] = []
        self.fail_at = fail_at
        self.lock = threading.Lock()  # called from the test and from the background thread

    def __call__(self, template: str | None = None) -> str:
        with self.lock:
            if len(self.made) + 1 == self.fail_at:
                self.made.append(("failed", template))
                raise RuntimeError("CREATE DATABASE failed")
            name = f"db_{len(self.made) + 1}"
            self.made.append((name, template))
            return name


def cluster(tmp_path: Path, maker: Maker, monkeypatch: pytest.MonkeyPatch) -> PgCluster:
    (tmp_path / "cluster").mkdir()
    made = PgCluster("postgresql://postgres@127.0.0.1:1/postgres", tmp_path / "cluster")
    monkeypatch.setattr(made, "create_database", maker)
    return made


def spare_threads() -> set[threading.Thread]:
    """The threads making databases ahead: the test run's own cluster may have one too."""
    return {t for t in threading.enumerate() if t.name.startswith("pg-spare")}


def test_each_database_goes_to_one_test_from_its_own_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    maker = Maker()
    others = spare_threads()
    pg = cluster(tmp_path, maker, monkeypatch)
    try:
        given = [pg.fresh_database(), pg.fresh_database("tmpl"), pg.fresh_database()]
        given.append(pg.fresh_database("tmpl"))
    finally:
        pg.stop()
    assert len(set(given)) == 4
    templates = dict(maker.made)
    assert [templates[name] for name in given] == [None, "tmpl", None, "tmpl"]
    assert spare_threads() - others == set()


def test_a_creation_that_failed_ahead_fails_the_next_test_and_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    others = spare_threads()
    pg = cluster(tmp_path, Maker(fail_at=2), monkeypatch)
    try:
        assert pg.fresh_database() == "db_1"  # and the second is made in the background: fails
        with pytest.raises(RuntimeError, match="CREATE DATABASE failed"):
            pg.fresh_database()
        assert pg.fresh_database() == "db_3"  # made here: nothing was left pending
    finally:
        pg.stop()
    assert spare_threads() - others == set()
    assert not (tmp_path / "cluster").exists()

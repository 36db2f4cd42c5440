"""libpq settings of a PostgreSQL store that libpq refuses (a bad `sslmode`, a `PGPORT` that is
no port), from the URL, the environment or a service file: a `StoreError` naming the setting
when the store is made, not a database that reads as down."""

from __future__ import annotations

from pathlib import Path

import pytest

from signoff._exceptions import StoreError
from signoff.stores.postgres import PostgresStore


@pytest.mark.parametrize(
    ("url", "env", "named"),
    [
        ("postgresql://u@h/db?sslmode=bogus", {}, "(URL option sslmode)"),
        ("postgresql://u@h1:5432,h2:5433/db?sslmode=bogus", {}, "(URL option sslmode)"),
        ("postgresql://u@h/db?gssencmode=bogus", {}, "(URL option gssencmode)"),
        ("postgresql://u@h/db?target_session_attrs=bogus", {}, "(URL option target_session_"),
        ("postgresql://u@h/db", {"PGSSLMODE": "bogus"}, "(PGSSLMODE in the environment)"),
        ("postgresql://u@h/db", {"PGPORT": "abc"}, "(PGPORT in the environment)"),
        ("postgresql://u@h/db", {"PGPORT": "70000"}, "(PGPORT in the environment)"),
    ],
)
def test_a_setting_libpq_refuses_is_a_store_error_naming_it(
    url: str, env: dict[str, str], named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(StoreError) as info:
        PostgresStore(url)
    message = str(info.value)
    assert message.startswith("invalid PostgreSQL "), message
    bad = env.get("PGPORT", "bogus")
    assert named in message and f'"{bad}"' in message, message


def test_a_service_files_bad_sslmode_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = tmp_path / "svc"
    service.write_text("[signoff_svc]\nsslmode=bogus\n")
    monkeypatch.setenv("PGSERVICEFILE", str(service))
    with pytest.raises(StoreError, match=r'sslmode value: "bogus" \(sslmode in the service file'):
        PostgresStore("postgresql://u@h/db?service=signoff_svc")


@pytest.mark.parametrize(
    "query",
    [
        "sslmode=require",
        "sslmode=verify-full&sslrootcert=system",
        "gssencmode=require",  # libpq refuses it over a Unix socket only: not a bad setting
        "target_session_attrs=read-write",
        "service=missing",  # libpq says so when connecting, naming it
    ],
)
def test_settings_libpq_takes_are_not_refused(query: str) -> None:
    PostgresStore(f"postgresql://u@h1:5432,h2:5433/db?{query}")
    PostgresStore(f"postgresql://u@h/db?{query}")


def test_a_good_pgport_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPORT", "6543")
    monkeypatch.setenv("PGSSLMODE", "disable")
    PostgresStore("postgresql://u@h/db")

"""`with_schema`: a PostgreSQL URL naming the schema a store was given as an argument, so what
opens the store again from its URL alone (the CLI, for a runtime's own store) opens the same
schema; the URL's other options, libpq's and signoff's, are kept."""

from __future__ import annotations

import psycopg
import pytest

from signoff._exceptions import StoreError, UsageError
from signoff.stores import open_store
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._url import split_options, with_schema

from ._pg_events import new_session


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p%40ss@db.example/app",
        "postgresql://u@db.example/app?sslmode=require&pool_max=3",
        "postgres:///app?schema=other",
        "postgresql://db.example/app?application_name=a+b#frag",
    ],
)
def test_the_url_names_the_schema_and_keeps_the_rest(url: str) -> None:
    named = with_schema(url, "tenant_a")
    store = PostgresStore(named)
    assert store.schema == "tenant_a"
    dsn, options = split_options(named)
    before_dsn, before = split_options(url)
    assert dsn == before_dsn
    assert options == {**before, "schema": "tenant_a"}


def test_a_url_naming_the_schema_already_is_unchanged() -> None:
    for url in ("postgresql://h/app", "postgresql://h/app?schema=signoff&pool_max=2"):
        assert with_schema(url, "signoff") == url
    assert with_schema("postgresql://h/app?schema=x", "x") == "postgresql://h/app?schema=x"


async def test_a_store_given_its_schema_names_it_in_its_url(pg_url: str) -> None:
    """What opens a store again from its URL alone (`signoff serve`'s check of its runtime's
    store, a process handed `store.url`, the `--store` the CLI suggests) opens the schema the
    store was given as an argument, not the database's default one: that one is neither
    created nor read."""
    store = PostgresStore(pg_url, schema="tenant_a")
    await store.open()
    again = open_store(store.url)
    try:
        assert isinstance(again, PostgresStore) and again.schema == "tenant_a"
        sid = await new_session(store)
        assert await again.head(sid) == 1
    finally:
        await store.close()
        await again.close()
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT nspname FROM pg_namespace WHERE nspname = 'signoff'")
        assert await cur.fetchall() == []


def test_a_schema_name_ending_in_a_newline_is_refused() -> None:
    """The name was checked with `re.match` and a `$`, which matches before a final newline: a
    schema "trail\\n" was created (and `?schema=trail%0A`, a stray escape in a templated URL)."""
    with pytest.raises(UsageError, match="schema name must be lowercase"):
        PostgresStore("postgresql://u@h/db", schema="trail\n")
    with pytest.raises(StoreError, match="schema name must be lowercase"):
        PostgresStore("postgresql://u@h/db?schema=trail%0A")


@pytest.mark.parametrize("name", ["s" * 52, "1tenant"])
def test_a_lowercase_schema_name_refused_is_told_why(name: str) -> None:
    """A name too long or starting with a digit was told only to be lowercase, which it was."""
    with pytest.raises(StoreError) as info:
        PostgresStore(f"postgresql://u@h/db?schema={name}")
    assert "not start with a digit, and be at most 51 characters long" in str(info.value)
    with pytest.raises(UsageError, match="at most 51 characters"):
        PostgresStore("postgresql://u@h/db", schema=name)

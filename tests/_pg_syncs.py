"""Which commits the PostgreSQL store flushes: a trigger notes the `synchronous_commit` each
event was inserted under, so a test can tell the durable commits from the others."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["seen_syncs", "watch_syncs"]


async def watch_syncs(url: str, server_default: str = "off") -> None:
    """Make `server_default` the database's `synchronous_commit` (for connections opened
    after), and note the setting each event is inserted under from now on."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        dbname = conninfo_to_dict(url)["dbname"]
        await conn.execute(
            f'ALTER DATABASE "{dbname}" SET synchronous_commit = {server_default}'.encode()
        )
        await conn.execute(
            """
            CREATE TABLE public.seen (seq BIGINT, setting TEXT);
            CREATE FUNCTION public.see() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.seen VALUES (NEW.seq, current_setting('synchronous_commit'));
                RETURN NULL;
            END $$;
            CREATE TRIGGER see AFTER INSERT ON signoff.events
                FOR EACH ROW EXECUTE FUNCTION public.see();
            """
        )


async def seen_syncs(url: str) -> list[tuple[Any, ...]]:
    """Each watched event's seq and the `synchronous_commit` it was inserted under, by seq."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT seq, setting FROM public.seen ORDER BY seq")
        return await cur.fetchall()

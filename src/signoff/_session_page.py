"""A page of the sessions and their total read in one snapshot of the store, for the listings
that show a total (`GET /v1/sessions`, the dashboard): a session created, or changing status,
meanwhile cannot set the total and the page apart."""

from __future__ import annotations

from .stores import InitiatorFilter, SessionSummary, Store

__all__ = ["counted_sessions"]


async def counted_sessions(
    store: Store,
    *,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    initiated_by: InitiatorFilter | None,
) -> tuple[list[SessionSummary], int]:
    """`store.sessions()` and `store.count_sessions()` of one snapshot (the store's
    `sessions_counted`; a store without it is read twice, so a commit between the two reads can
    set them apart by a session)."""
    both = getattr(store, "sessions_counted", None)
    if both is None:
        page = await store.sessions(
            agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
        )
        return page, await store.count_sessions(
            agent=agent, status=status, initiated_by=initiated_by
        )
    rows, total = await both(
        agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
    )
    return rows, total

"""A request read by id for a caller who named it: its session's id first, so that a request
of another session is refused before anything large of it is read and decoded, and its refusal
costs what a missing id's does."""

from __future__ import annotations

from typing import cast

from .stores import Store, StoredRequest

__all__ = ["request_in", "session_of"]


async def session_of(store: Store, request_id: str) -> tuple[str | None, StoredRequest | None]:
    """The id of the session holding `request_id` (None if there is no such request), read
    alone where the store has `request_session` (both built-in stores do): a foreign request's
    input is then not read and decoded, which would make its 404 slower than a missing one's.
    A store without it has the whole request read, returned beside the id."""
    alone = getattr(store, "request_session", None)
    if alone is not None:
        return cast(str | None, await alone(request_id)), None
    stored = await store.get_request(request_id)
    return (None, None) if stored is None else (stored.request.session_id, stored)


async def request_in(store: Store, request_id: str, session_id: str) -> StoredRequest | None:
    """The stored request `request_id` if it is one of session `session_id`, read whole only
    then; None for a missing id and for another session's alike, at the same cost."""
    owner, stored = await session_of(store, request_id)
    if owner != session_id:
        return None
    stored = stored or await store.get_request(request_id)
    if stored is None or stored.request.session_id != session_id:  # deleted since
        return None
    return stored

"""The principals and the event reader the seed tests (eve, helix, anvil) share."""

from __future__ import annotations

import signoff as so

ALICE = so.Principal(authenticator="test", principal_id="alice", attributes={"tenant_id": "t1"})
MALLORY = so.Principal(authenticator="test", principal_id="mallory", attributes={"tenant_id": "t2"})


async def event_types(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]

"""Who started each session, as its row keeps it: the initiator's identity and tenant, written
when the session is created, so listings filter sessions and requests by it in SQL."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._events import Event
from .._exceptions import StoreError, UsageError
from .._state_parts import load_principal
from .._types import Principal
from ._codec import unpack_event

__all__ = [
    "ANONYMOUS",
    "InitiatorFilter",
    "checked_filter",
    "initiator_columns",
    "initiator_key",
    "stored_initiator",
    "tenant_key",
]

ANONYMOUS = ""
"""The `initiator` column of a session started without a principal (from Python). NULL stands
for unknown instead: a first event that did not say (a damaged log, when an upgrade filled the
column), or a row an older signoff still running wrote; no filter matches it, so only an admin
lists it."""


def initiator_key(principal: Principal) -> str:
    """The `initiator` column naming `principal`: the identity `Principal.same_as` compares, as
    JSON (escaped to ASCII, so any text, a NUL too, is stored and compared as is)."""
    identity = [
        principal.authenticator,
        principal.issuer,
        principal.principal_type,
        principal.principal_id,
    ]
    return json.dumps(identity, separators=(",", ":"))


def tenant_key(tenant: object) -> str | None:
    """The `tenant` column of a tenant attribute: text as JSON, anything else none (only text
    tenants are filtered in SQL; `==` on other values is Python's own)."""
    return json.dumps(tenant) if isinstance(tenant, str) else None


def initiator_columns(events: Sequence[Event]) -> tuple[str | None, str | None]:
    """The `(initiator, tenant)` columns of a new session, from its `session.created` event:
    `ANONYMOUS` when no principal started it, NULL (unknown) when the event does not say."""
    first = events[0] if events else None
    if first is None or first.seq != 1 or first.type != "session.created":
        return None, None
    return _columns(first.data)


def stored_initiator(data: Any) -> tuple[str | None, str | None]:
    """`initiator_columns` of a stored first event's packed data (an upgrade's fill)."""
    try:
        return _columns(unpack_event(data))
    except (StoreError, AttributeError, TypeError):
        return None, None


def _columns(data: Any) -> tuple[str | None, str | None]:
    try:
        principal = load_principal(data.get("initiator"))
    except (ValueError, AttributeError, TypeError):  # pydantic's errors are ValueErrors
        return None, None
    if principal is None:
        return ANONYMOUS, None
    return initiator_key(principal), tenant_key(principal.attributes.get("tenant"))


@dataclass(frozen=True, slots=True, kw_only=True)
class InitiatorFilter:
    """Sessions started by `principal` (the same identity), or by anyone carrying the `tenant`
    attribute (text), or, with `anonymous`, by no principal: any of them matches. A session
    whose first event does not say who started it matches none."""

    principal: Principal | None = None
    tenant: str | None = None
    anonymous: bool = False

    def __post_init__(self) -> None:
        if self.principal is not None and not isinstance(self.principal, Principal):
            raise UsageError(
                f"InitiatorFilter(principal=...) must be a Principal or None, not "
                f"{self.principal!r}"
            )
        if self.tenant is not None and not isinstance(self.tenant, str):
            raise UsageError(
                f"InitiatorFilter(tenant=...) must be text or None, not {self.tenant!r}"
            )
        if not isinstance(self.anonymous, bool):
            raise UsageError(
                f"InitiatorFilter(anonymous=...) must be True or False, not {self.anonymous!r}"
            )
        if self.principal is None and self.tenant is None and not self.anonymous:
            raise UsageError("InitiatorFilter needs a principal, a tenant or anonymous=True")

    def where(self, ph: str, table: str) -> tuple[str, list[Any]]:
        """The SQL condition over the session rows named `table`, and its parameters, with `ph`
        as the driver's placeholder; each part is served by an index of the session rows."""
        parts: list[str] = []
        params: list[Any] = []
        if self.principal is not None:
            parts.append(f"{table}.initiator={ph}")
            params.append(initiator_key(self.principal))
        if self.tenant is not None:
            parts.append(f"{table}.tenant={ph}")
            params.append(tenant_key(self.tenant))
        if self.anonymous:
            parts.append(f"{table}.initiator={ph}")
            params.append(ANONYMOUS)
        return "(" + " OR ".join(parts) + ")", params


def checked_filter(value: object) -> InitiatorFilter:
    """`value`, if it is an `InitiatorFilter`; a `UsageError` otherwise (each store's SQL would
    otherwise fail its own way)."""
    if not isinstance(value, InitiatorFilter):
        raise UsageError(f"initiated_by must be an InitiatorFilter or None, not {value!r}")
    return value

"""What a refusal under the default rule (only the asker may answer) tells the person at the
terminal: the `--as` that answers as the asker, or, for a request the app asked (a scheduled
turn's), that only the application can settle it. `signoff approve` and `signoff chat` share it."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence

from .._exceptions import NotAllowed
from .._types import InputRequest, Principal

APP_ONLY = (
    "the app asked it (so.APP_PRINCIPAL, as for a scheduled turn), which no --as names: only the "
    "application can settle it, from Python with principal=so.APP_PRINCIPAL"
)


def asker_hint(
    command: str | Sequence[str], request: InputRequest, principal: Principal
) -> str | None:
    """What to do instead when `principal` was refused `request`, if the default rule refused it
    (no response policy, quorum, escalation): run `command` (or one of several) as the asker, a
    user `--as` names, or leave it to the app; None where neither would be let answer, or
    `--as` cannot say who."""
    asker = request.requested_by
    if (
        asker is None
        or principal.same_as(asker)
        or request.response_policy
        or request.approvers > 1
        or request.exclude_requester
        or request.escalated_to is not None
        or asker.issuer is not None
    ):
        return None
    if asker.principal_type == "runtime":
        return APP_ONLY
    if asker.principal_type != "user" or ":" in asker.authenticator:
        return None
    who = shlex.quote(f"{asker.authenticator}:{asker.principal_id}")
    commands = [command] if isinstance(command, str) else command
    run = " or ".join(f"signoff {c} --as {who}" for c in commands)
    return f"by default only the asker may answer; as them, run {run}"


@contextlib.contextmanager
def as_hint(
    command: str | Sequence[str], request: InputRequest, principal: Principal
) -> Iterator[None]:
    """Add `asker_hint` to the default rule's refusal, which a person running the command for
    the asker (a token's holder, a web user) would otherwise have to work out: `command` on
    `request`, or the full commands given instead (those that answer a request of the other
    kind than the one typed)."""
    try:
        yield
    except NotAllowed as exc:
        commands = f"{command} {request.id}" if isinstance(command, str) else command
        hint = asker_hint(commands, request, principal)
        if hint is None:
            raise
        raise NotAllowed(f"{exc}: {hint}", exc.request_ids) from None

"""What a refusal under the default rule (only the asker may answer) tells the person at the
terminal: the `--as` that answers as the asker, or, for a request the app asked (a scheduled
turn's), that only the application can settle it. `signoff approve` and `signoff chat` share it."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence

from .._exceptions import NotAllowed
from .._text import is_blank
from .._types import InputRequest, InputResponse, Principal
from ..channels.terminal import shows_as_is
from ._app import answer_flags

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
    said = f"{asker.authenticator}:{asker.principal_id}"
    if asker.principal_type != "user" or ":" in asker.authenticator or not shows_as_is(said):
        return None
    who = shlex.quote(said)
    commands = [command] if isinstance(command, str) else command
    run = " or ".join(f"signoff {c} --as {who}" for c in commands)
    return f"by default only the asker may answer; as them, run {run}"


def answering(
    command: str, request: InputRequest, typed: InputResponse | None, where: Sequence[str] = ()
) -> list[str]:
    """The commands (after `signoff`) that answer `request`: `command` as typed (an `answer`
    with its flag, `approve` or `deny` with its `--reason`, shell-quoted) where the request
    takes that answer, else `approve` or `deny` for an approval and `answer` with each flag a
    question takes. `typed` is None where it was of the wrong kind; `where` (MODULE:RUNTIME,
    `store_args`) follows the id, so that each runs as printed where this one did."""
    rid = shlex.join([request.id, *where])
    if typed is not None:
        option, text = typed.option_id, typed.text
        if command != "answer":
            return [f"{command} {rid}" + ("" if text is None else f" {_flag('--reason', text)}")]
        if option is not None and (
            request.kind == "tool-approval" or any(o.id == option for o in request.options)
        ):
            return [f"answer {rid} {_flag('--option', option, 'ID')}"]
        if text is not None and request.allow_text and not is_blank(text):
            return [f"answer {rid} {_flag('--text', text)}"]
    if request.kind == "tool-approval":
        return [f"approve {rid}", f"deny {rid}"]
    return [f"answer {rid} {flag}" for flag in answer_flags(request)]


def _flag(name: str, value: str, metavar: str = "TEXT") -> str:
    """`name` with `value` shell-quoted, or with its metavar where the one-line error would not
    show `value` as typed (a line break, a tab, a control character): never another value."""
    return f"{name} {shlex.quote(value) if shows_as_is(value) else metavar}"


@contextlib.contextmanager
def as_hint(commands: Sequence[str], request: InputRequest, principal: Principal) -> Iterator[None]:
    """Add `asker_hint` to the default rule's refusal, which a person running the command for
    the asker (a token's holder, a web user) would otherwise have to work out: `commands`
    (`answering`), each a full command that answers `request` as the asker."""
    try:
        yield
    except NotAllowed as exc:
        hint = asker_hint(commands, request, principal)
        if hint is None:
            raise
        raise NotAllowed(f"{exc}: {hint}", exc.request_ids) from None

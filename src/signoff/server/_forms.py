"""One-time tokens of the dashboard's forms that start a conversation or send a message, so that
a double click or a browser sending a form again acts once: the second post is sent where the
first one led (the same session) instead of starting or sending again.

A token is `<issued>.<nonce>.<mac>`: the time its page was made, a random nonce and an HMAC
over them and the viewer, keyed with the server's key; a token of another viewer, a forged one
or one past the sign-in lifetime is refused. Sending a form records its nonce in the audit
trail (stream `dashboard:forms`) before acting, and where it led once that is known; every
process reads the stream as sign-outs are read (`_sign_ins`), and the first entry of a nonce
wins, so two processes given the same form act once between them. A failure undoes the claim,
so sending the form again then tries again. Nonces past the token lifetime are forgotten.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._audit_trail import FORMS_STREAM
from .._exceptions import SignoffError, StoreError
from .._types import Principal
from ..stores import Store
from ..stores._audit import AuditRow

if TYPE_CHECKING:
    from ._context import ServerContext

__all__ = [
    "FORM_FAILED",
    "FORM_LED",
    "FORM_SENT",
    "FormSending",
    "Forms",
    "Refusal",
    "check_form",
    "form_token",
]

log = logging.getLogger("signoff.server")

FORM_SENT = "dashboard.form_sent"
FORM_LED = "dashboard.form_led"  # where a form sent earlier led, once known
FORM_FAILED = "dashboard.form_failed"  # it failed: sending it again tries again

_SKEW = 300  # seconds a token's time may be ahead of this process's clock (another process's)
_PAGE = 1000


def _mac(key: bytes, viewer: Principal, issued: str, nonce: str) -> str:
    raw = "\0".join(
        ("signoff-form", viewer.authenticator, viewer.principal_id, issued, nonce)
    ).encode()
    return base64.urlsafe_b64encode(hmac.new(key, raw, hashlib.sha256).digest()[:18]).decode()


def form_token(key: bytes, viewer: Principal, now: float) -> str:
    """A new form's token for `viewer`, made at `now`."""
    issued, nonce = str(int(now)), secrets.token_urlsafe(18)
    return f"{issued}.{nonce}.{_mac(key, viewer, issued, nonce)}"


def check_form(
    key: bytes, viewer: Principal, value: str, now: float, lifetime: float
) -> tuple[str, int] | None:
    """The nonce and time of `value` if this server made it for `viewer` within `lifetime` of
    `now`; None for anything else."""
    if not value.isascii() or len(value) > 200:
        return None
    parts = value.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 15 or not parts[1]:
        return None
    issued = int(parts[0])
    if not now - lifetime < issued <= now + _SKEW:
        return None
    if not hmac.compare_digest(_mac(key, viewer, parts[0], parts[1]).encode(), parts[2].encode()):
        return None
    return parts[1], issued


@dataclass(slots=True)
class _Sent:
    """A form's first sending as the stream records it."""

    claim: str
    issued: int
    target: str | None


@dataclass(slots=True)
class Forms:
    """The forms sent, as this process last read them from the store."""

    lifetime: float
    _sent: dict[str, _Sent] = field(default_factory=dict)  # nonce -> its first sending
    _head: int = 0  # the stream's length when last read
    _after: int = 0  # the id of the last entry read
    _local: dict[str, asyncio.Event] = field(default_factory=dict)  # sent by this process now

    async def claim(
        self,
        store: Store,
        nonce: str,
        issued: int,
        viewer: Principal,
        target: str | None,
        now: float,
        wait: float = 5.0,
    ) -> tuple[str | None, str | None]:
        """Record that the form `nonce` is being sent, leading to `target` if that is known yet.
        Returns the claim to pass to `led` or `failed` when this sending is the first; else
        None and where the first one led, waiting up to `wait` seconds for one under way (None
        if that is still not known: it is slow, or its process died)."""
        for _ in range(3):
            claim = await self._claim(store, nonce, issued, viewer, target, now)
            if claim is not None:
                return claim, None
            where = await self._target(store, nonce, now, wait)
            if where is not None or nonce in self._sent or nonce in self._local:
                return None, where
            # the first sending failed (`failed`): this one tries again
        return None, None

    async def _claim(
        self,
        store: Store,
        nonce: str,
        issued: int,
        viewer: Principal,
        target: str | None,
        now: float,
    ) -> str | None:
        await self._read(store, now)
        if nonce in self._local or nonce in self._sent:
            return None
        self._local[nonce] = asyncio.Event()
        claim = secrets.token_urlsafe(12)
        data = {
            "form": nonce,
            "claim": claim,
            "issued": issued,
            "target": target,
            "authenticator": viewer.authenticator,
            "principal_id": viewer.principal_id,
        }
        try:
            await store.record_audit([_row(FORM_SENT, now, data)])
            await self._read(store, now)
        except BaseException:
            self._done(nonce)
            raise
        first = self._sent.get(nonce)
        if first is None or first.claim != claim:  # another process sent it first
            self._done(nonce)
            return None
        return claim

    async def led(self, store: Store, nonce: str, claim: str, target: str, now: float) -> None:
        """Record where the form `nonce` led (sent first under `claim`)."""
        try:
            data = {"form": nonce, "claim": claim, "target": target}
            await store.record_audit([_row(FORM_LED, now, data)])
            first = self._sent.get(nonce)
            if first is not None and first.claim == claim:
                first.target = target
        finally:
            self._done(nonce)

    async def failed(self, store: Store, nonce: str, claim: str, now: float) -> None:
        """Undo the claim of the form `nonce`: what it asked for did not happen."""
        try:
            data = {"form": nonce, "claim": claim}
            await store.record_audit([_row(FORM_FAILED, now, data)])
            first = self._sent.get(nonce)
            if first is not None and first.claim == claim:
                del self._sent[nonce]
        finally:
            self._done(nonce)

    async def _target(self, store: Store, nonce: str, now: float, wait: float) -> str | None:
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            local = self._local.get(nonce)
            if local is None:
                await self._read(store, now)
            first = self._sent.get(nonce)
            if first is not None and first.target is not None:
                return first.target
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or (local is None and first is None):
                return None
            if local is not None:
                try:
                    await asyncio.wait_for(local.wait(), left)
                except TimeoutError:
                    return None
            else:  # another process sends it
                await asyncio.sleep(min(left, 0.1))

    def release(self, nonce: str) -> None:
        """This process is done with its sending of the form `nonce` (whether or not it
        recorded how that went): others waiting on it read the stream."""
        self._done(nonce)

    def _done(self, nonce: str) -> None:
        event = self._local.pop(nonce, None)
        if event is not None:
            event.set()

    async def _read(self, store: Store, now: float) -> None:
        heads = await store.audit_heads(stream=FORMS_STREAM)
        head = heads.get(FORMS_STREAM, (0, None))[0]
        if head == self._head:
            return
        while True:
            batch = await store.audit(stream=FORMS_STREAM, after_id=self._after, limit=_PAGE)
            for entry in batch:
                self._after = max(self._after, entry.id)
                data = entry.data
                nonce, claim = data.get("form"), data.get("claim")
                if not isinstance(nonce, str) or not isinstance(claim, str):
                    continue
                first = self._sent.get(nonce)
                target = data.get("target")
                if entry.type == FORM_SENT and first is None:
                    issued = data.get("issued")
                    if isinstance(issued, int) and not isinstance(issued, bool):
                        place = target if isinstance(target, str) else None
                        self._sent[nonce] = _Sent(claim, issued, place)
                elif first is None or first.claim != claim:
                    continue  # about a sending that lost, or one already forgotten
                elif entry.type == FORM_LED and isinstance(target, str):
                    first.target = target
                elif entry.type == FORM_FAILED:
                    del self._sent[nonce]
            if len(batch) < _PAGE:
                break
        self._head = head
        self._forget_expired(now)

    def _forget_expired(self, now: float) -> None:
        # A token past its lifetime is refused anyway (`check_form`), so its sending can go.
        before = now - self.lifetime
        for nonce in [n for n, s in self._sent.items() if s.issued <= before]:
            del self._sent[nonce]


def _row(kind: str, now: float, data: Mapping[str, object]) -> AuditRow:
    return AuditRow(stream=FORMS_STREAM, type=kind, at=now, seq=None, data=dict(data))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a form's sending is refused: an HTTP status, a stable code and a message."""

    status: int
    code: str
    message: str


class FormSending:
    """One post of a form, by its token: absent (a script's post, which acts as asked), or
    checked as this viewer's and claimed (`first`) before the form acts."""

    def __init__(self, ctx: ServerContext, viewer: Principal, token: str | None) -> None:
        self.ctx, self.viewer = ctx, viewer
        self.now = ctx.runtime.clock()
        self.given = token is not None
        self.checked = (
            None
            if token is None
            else check_form(ctx.secret, viewer, token, self.now, ctx.sign_in_lifetime)
        )
        self.claim: str | None = None

    async def first(self, target: str | None) -> str | Refusal | None:
        """None when this is the form's first sending (then record where it led with `led`,
        or that it failed with `failed`, and `close` it); else where the first one led (its
        `target`), or why that is not known."""
        if not self.given:
            return None
        if self.checked is None:
            return Refusal(
                400,
                "invalid_form",
                "this form is out of date or not yours: reload the page and send it again",
            )
        nonce, issued = self.checked
        store = self.ctx.runtime.store
        claim, where = await self.ctx.forms.claim(
            store, nonce, issued, self.viewer, target, self.now
        )
        if claim is not None:
            self.claim = claim
            return None
        if where is None:
            return Refusal(
                409,
                "form_already_sent",
                "this form was sent already, and where it led is not known yet (it may have "
                "failed): see the queue, or reload the page to send it again",
            )
        return where

    async def led(self, target: str) -> None:
        """Record where the form led, for a second sending of it to follow."""
        if self.claim is not None and self.checked is not None:
            await self.ctx.forms.led(
                self.ctx.runtime.store, self.checked[0], self.claim, target, self.now
            )

    async def failed(self, exc: BaseException) -> None:
        """Undo the claim when the runtime refused what the form asked (nothing was done, so
        sending it again may try again); after a store failure or a crash whether it was done
        is not known, and sending it again leads to the session rather than acting twice."""
        if self.claim is None or self.checked is None:
            return
        if isinstance(exc, SignoffError) and not isinstance(exc, StoreError):
            try:
                await self.ctx.forms.failed(
                    self.ctx.runtime.store, self.checked[0], self.claim, self.now
                )
            except StoreError as lost:  # the error that failed the form is the one to show
                log.warning("could not record that a dashboard form failed: %s", lost)

    def close(self) -> None:
        """This post is over: a second sending waiting on it goes on."""
        if self.claim is not None and self.checked is not None:
            self.ctx.forms.release(self.checked[0])

"""`CallSpy`: records which of some async methods a piece of work called, by label, so a test
can compare what two requests cost (the same store reads for a foreign id as for a missing one)."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable
from typing import Any

import httpx
import pytest


class CallSpy:
    """Wraps async methods (`wrap`) and records, in order, those called during `during`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.on = False
        self._monkeypatch = monkeypatch

    def wrap(self, obj: Any, names: Iterable[str], prefix: str = "") -> None:
        """Spy on each of `names` that `obj` has, recorded as `prefix` + the name."""
        for name in names:
            if hasattr(obj, name):
                self._monkeypatch.setattr(obj, name, self._spied(getattr(obj, name), prefix + name))

    def _spied(self, real: Any, label: str) -> Any:
        async def spied(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls.append(label)
            return await real(*args, **kwargs)

        return spied

    async def during(self, call: Awaitable[httpx.Response]) -> tuple[httpx.Response, list[str]]:
        """The response to `call` and the spied calls it made."""
        self.calls.clear()
        self.on = True
        try:
            response = await call
        finally:
            self.on = False
        return response, list(self.calls)

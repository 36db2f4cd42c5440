"""The audit trail at its edges: tampering on both stores, exports checked offline, paging
while commits land, and malformed arguments."""

import io
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import ManualClock

from .test_audit import agent, run_scenario


async def test_malformed_audit_arguments_are_usage_errors(tmp_path: Path) -> None:
    """A limit that is not a whole number from 0, a stream that is not text or holds a lone
    surrogate, and an export target that takes no text are refused by name, not failed on."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        assert await rt.audit(sid, limit=0) == []
        assert len(await rt.audit(sid, limit=2)) == 2
        for limit in (-1, "3", 2.5, True, 2**63):
            with pytest.raises(so.UsageError, match="limit"):
                await rt.audit(sid, limit=limit)  # type: ignore[arg-type]
        for bad in (123, b"ses", "ses\ud800"):
            with pytest.raises(so.UsageError):
                await rt.audit(bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.audit(stream=bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.verify_audit(bad)  # type: ignore[arg-type]
            with pytest.raises(so.UsageError):
                await rt.export_audit(io.StringIO(), bad)  # type: ignore[arg-type]
        for out in (None, io.BytesIO()):
            with pytest.raises(so.UsageError, match="text"):
                await rt.export_audit(out)  # type: ignore[arg-type]

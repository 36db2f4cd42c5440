"""Shared by the approval tests: a principal and the gated tools they call."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import ExecutionLog

ALICE = so.Principal(authenticator="test", principal_id="alice")


def refund_tool(log: ExecutionLog, approval: Any) -> so.Tool:
    @log.tool(approval=approval)
    async def refund(order_id: str, amount: float = 10.0) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount, "order_id": order_id}

    return refund


def gate_tool(log: ExecutionLog) -> so.Tool:
    @log.tool(approval=so.always())
    async def gate(x: int) -> int:
        """Gate."""
        return x

    return gate

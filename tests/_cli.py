"""The `signoff` command's tests' agents and helpers: the runtimes the commands load by
`tests._cli:NAME`, a store URL fixture, parking a turn, reading its log, invoking the CLI.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app

__all__ = [
    "agent",
    "bracketed",
    "ctrl_c_after",
    "ctrl_c_timed",
    "deployer",
    "double",
    "flaky",
    "flaky_step",
    "park_flaky",
    "_free_port",
    "invoke",
    "issue_refund",
    "limited_runtime",
    "log",
    "offline_runtime",
    "park",
    "pg_schemas",
    "refunds_run",
    "refused_usage",
    "runtime_module",
    "ROOT",
    "sizer",
    "TARGET",
    "tenant_runtime",
    "treasurer",
    "url",
]


ROOT = Path(__file__).resolve().parents[1]


@so.tool(approval=lambda input: input.amount > 100)
async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": amount}


def _refund_1042() -> so.ModelResponse:
    """The model's call to refund order 1042 by 180, over `issue_refund`'s approval threshold."""
    return so.ModelResponse(
        tool_calls=[
            so.ToolCall(
                name="issue_refund", input={"order_id": "1042", "amount": 180, "reason": "broken"}
            )
        ]
    )


def _answer(conversation: list[so.Message]) -> so.ModelResponse:
    last = conversation[-1]
    assert isinstance(last, so.ToolResultMessage)
    if isinstance(last.content, dict) and last.content.get("denied"):
        return so.ModelResponse(text=f"Not refunded: {last.content.get('reason')}.")
    if "approval" in last.content:  # approved with a reason: it sits beside the result
        reason = last.content["approval"]["reason"]
        return so.ModelResponse(
            text=f"Refunded {last.content['result']['refunded']:.2f} ({reason})."
        )
    return so.ModelResponse(text=f"Refunded {last.content['refunded']:.2f}.")


agent = so.Agent(
    name="support",
    model=so.models.Scripted(
        [
            _refund_1042(),
            _answer,
        ]
    ),
    tools=[issue_refund],
)


TARGET = "tests._cli:agent"


@so.tool(approval=so.always(approvers=2, expires_in=3600))
async def wire_money(to: str, amount: float) -> dict[str, Any]:
    """Send money."""
    return {"sent": amount, "to": to}


treasurer = so.Agent(
    name="treasurer",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(name="wire_money", input={"to": "ACME", "amount": 5000})]
            ),
            so.ModelResponse(text="Wired."),
        ]
    ),
    tools=[wire_money],
)


def _both(conversation: list[so.Message]) -> so.ModelResponse:
    results = [m for m in conversation if isinstance(m, so.ToolResultMessage)]
    said = [
        f"{r.call_id}: {'denied' if r.is_error else 'refunded'}"
        for r in sorted(results, key=lambda r: r.call_id)
    ]
    return so.ModelResponse(text="; ".join(said))


double = so.Agent(
    name="double",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        id=f"call_{order}",
                        name="issue_refund",
                        input={"order_id": order, "amount": 150, "reason": "broken"},
                    )
                    for order in ("1042", "1043")
                ]
            ),
            _both,
        ]
    ),
    tools=[issue_refund],
)


async def _four_eyes(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
    """Anyone but the person whose turn asked may approve."""
    who, asker = ctx.response.principal, ctx.request.principal
    return "rejected" if who is None or who == asker else "allowed"


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=_four_eyes))
async def deploy(env: str) -> str:
    """Deploy to an environment."""
    return f"deployed to {env}"


deployer = so.Agent(
    name="deployer",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="deploy", input={"env": "prod"})]),
            so.ModelResponse(text="Deployed."),
        ]
    ),
    tools=[deploy],
)


class _Flaky:
    """Fails the first time it is called after a tool result, then answers."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, conversation: list[so.Message]) -> so.ModelResponse:
        if not self.failed:
            self.failed = True
            raise so.ModelError("upstream timed out")
        return _answer(conversation)


flaky_step = _Flaky()


flaky = so.Agent(
    name="flaky",
    model=so.models.Scripted(
        [
            _refund_1042(),
            flaky_step,
        ]
    ),
    tools=[issue_refund],
)


def park_flaky(store: str) -> so.GenerateResult:
    """A `flaky` turn parked on its refund's approval in `store`: the model fails once the
    approval lets the turn go on."""
    flaky_step.failed = False
    rt = so.Runtime([flaky], store=store)
    try:
        return rt.generate_sync("flaky", "Refund order 1042")
    finally:
        rt.close_sync()


def _picked(conversation: list[so.Message]) -> so.ModelResponse:
    last = conversation[-1]
    assert isinstance(last, so.ToolResultMessage)
    return so.ModelResponse(text=f"You chose {last.content['answer']}.")


sizer = so.Agent(
    name="sizer",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        name="ask_question",
                        input={
                            "question": "Which size?",
                            "options": [
                                {"label": "Small", "description": "The 250 g bag."},
                                {"label": "Large", "description": "The 1 kg bag."},
                            ],
                        },
                    )
                ]
            ),
            _picked,
        ]
    ),
    tools=[so.ask_question()],
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def park(url: str, auth: so.Principal | None = None) -> tuple[str, str]:
    """Run a turn to `waiting` in this process and return (session id, request id)."""
    rt = so.Runtime([agent], store=url)
    try:
        r = rt.generate_sync("support", "Refund order 1042", auth=auth)
        assert r.status == "waiting"
        return r.session_id, r.pending[0].id
    finally:
        rt.close_sync()


def log(url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def refunds_run(events: list[so.Event]) -> int:
    return sum(
        1
        for e in events
        if e.type == "tool.completed"
        and e.data["tool_name"] == "issue_refund"
        and e.data["status"] == "ok"
    )


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def refused_usage(result: Any) -> str:
    """The message of a command line refused as Click refuses one it parses (a misuse found
    before anything ran): exit status 2, the command's usage, the message in an error box,
    returned with its lines joined."""
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Usage: "), result.stderr
    assert "Traceback" not in result.output
    boxed = [ln.strip("│ ") for ln in result.stderr.splitlines() if ln.startswith("│")]
    return " ".join(boxed)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


bracketed = so.Agent(
    name="ops [eu] [/x]",
    model=so.models.Scripted([so.ModelResponse(text="done [/] here")], repeat_last=True),
)


def offline_runtime() -> so.Runtime:
    """A runtime that leaves its turns to workers, with settings of its own."""
    clock = time.time
    return so.Runtime(
        [agent],
        store="sqlite:///:memory:",
        clock=clock,
        inline=False,
        lease_ttl=7.0,
        lease_wait=3.0,
        poll_interval=0.3,
    )


@so.tool
async def lookup(order_id: str) -> str:
    """Look an order up."""
    return "shipped"


def limited_runtime() -> so.Runtime:
    """A parent whose two subagents ask, in this order, an approval and (over its token budget)
    a session-limit prompt."""
    billing = so.Agent(
        name="billing",
        model=so.models.Scripted(
            [
                _refund_1042(),
                so.ModelResponse(text="Refunded."),
            ]
        ),
        tools=[issue_refund],
    )
    orders = so.Agent(
        name="orders",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[so.ToolCall(name="lookup", input={"order_id": "3"})],
                    usage=so.Usage(input_tokens=0, output_tokens=50),
                ),
                so.ModelResponse(text="Order 3 shipped."),
            ]
        ),
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    parent = so.Agent(
        name="support",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[
                        so.ToolCall(id="d1", name="billing", input={"message": "refund 1042"}),
                        so.ToolCall(id="d2", name="orders", input={"message": "where is 3?"}),
                    ]
                ),
                so.ModelResponse(text="All done."),
            ]
        ),
        tools=[so.delegate("billing"), so.delegate("orders")],
    )
    return so.Runtime([parent, billing, orders], store="sqlite:///:memory:")


def runtime_module(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    store: str,
    *,
    imported: str | None = None,
    agent: str = "agent",
) -> str:
    """Write a module of `tmp_path` whose `runtime` serves `agent` over `store` (Python source),
    importable and with SIGNOFF_STORE unset: its MODULE:RUNTIME, as a user names their own."""
    module = f"{name}_{uuid.uuid4().hex}"
    header = "import signoff as so\n" + (f"{imported}\n" if imported else "")
    (tmp_path / f"{module}.py").write_text(
        f"{header}from tests._cli import {agent}\nruntime = so.Runtime([{agent}], store={store})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("SIGNOFF_STORE", raising=False)
    return f"{module}:runtime"


def tenant_runtime(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, pg_url: str, agent: str = "agent"
) -> str:
    """`runtime_module` over `PostgresStore(pg_url, schema='tenant_a')`: a schema named as an
    argument, not in the URL, which every command must still honour."""
    return runtime_module(
        tmp_path,
        monkeypatch,
        name,
        f"PostgresStore({pg_url!r}, schema='tenant_a')",
        imported="from signoff.stores.postgres import PostgresStore",
        agent=agent,
    )


def pg_schemas(pg_url: str) -> set[str]:
    """The names of the schemas of the database at `pg_url`."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        return {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def ctrl_c_after(
    args: list[str],
    marker: str,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: int | None = None,
    timeout: float = 30,
) -> tuple[int, str, str]:
    """Run `args` as typed at a shell, send SIGINT once the first line of its stderr is
    `marker` (asserted), and return its status, its stdout and the rest of its stderr."""
    status, out, rest, _ = ctrl_c_timed(
        args, marker, cwd=cwd, env=env, stdin=stdin, timeout=timeout
    )
    return status, out, rest


def ctrl_c_timed(
    args: list[str],
    marker: str,
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    stdin: int | None = None,
    timeout: float = 30,
) -> tuple[int, str, str, float]:
    """`ctrl_c_after`, and the seconds from the SIGINT to the process's exit: how long the
    Ctrl-C took, without the interpreter's start and imports before the marker."""
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line == marker, line + proc.stderr.read()
        pressed = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=timeout)
        took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, rest, took

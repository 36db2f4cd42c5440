"""Helpers shared by the server tests: a demo runtime, and uvicorn on a loopback port.

`make_runtime` is also the `MODULE:RUNTIME` target the multi-process tests serve
(`tests.test_server_common:make_runtime`), reading its store from `SIGNOFF_TEST_STORE`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.routing import BaseRoute

import signoff as so
from signoff.server import AccessRule, TokenAuth, create_app

from ._forks import python_env
from ._ttl import ttl_agent

ROOT = Path(__file__).resolve().parent.parent

# The TLS context every httpx client or call builds unless given one (42 ms of CPU each: the CA
# bundle loaded anew), though the server tests only speak plain http:// to a local server: one,
# made once, passed as `verify=PLAIN`.
PLAIN = httpx.create_ssl_context()

ALICE = so.Principal(
    authenticator="token", principal_id="alice", attributes={"tenant": "acme", "name": "Alice"}
)
BOB = so.Principal(
    authenticator="token",
    principal_id="bob",
    attributes={"tenant": "acme", "name": "Bob", "role": "manager"},
)
MALLORY = so.Principal(authenticator="token", principal_id="mallory", attributes={"tenant": "evil"})
ADMIN = so.Principal(authenticator="token", principal_id="root", attributes={"admin": True})
TOKENS = {
    "alice-token": ALICE,
    "bob-token": BOB,
    "mallory-token": MALLORY,
    "admin-token": ADMIN,
}


def _echo(conversation: list[so.Message]) -> so.ModelResponse:
    """Says what the last tool returned, so a test can see what reached the model."""
    last = conversation[-1]
    if isinstance(last, so.ToolResultMessage):
        status = "error" if last.is_error else "ok"
        return so.ModelResponse(text=f"tool {status}: {json.dumps(last.content, sort_keys=True)}")
    return so.ModelResponse(text="nothing to report")


def tool_output(text: str) -> Any:
    """What `_echo` reported: the JSON after `tool ok: ` / `tool error: `."""
    _, sep, payload = text.partition(": ")
    assert sep, text
    return json.loads(payload)


def make_agents() -> list[so.Agent]:
    @so.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
        """Refund an order in full or in part."""
        return {"refunded": amount, "order_id": order_id}

    @so.tool
    async def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        return {"order_id": order_id, "total": 180.0}

    refund = so.ModelResponse(
        tool_calls=[
            so.ToolCall(
                name="issue_refund",
                input={"order_id": "1042", "amount": 180, "reason": "arrived broken"},
            )
        ],
        usage=so.Usage(input_tokens=1200, output_tokens=80, cost_usd=0.0042),
    )
    two = so.ModelResponse(
        tool_calls=[
            so.ToolCall(
                name="issue_refund",
                input={"order_id": "2210", "amount": 149.5, "reason": "damaged in transit"},
            ),
            so.ToolCall(
                name="issue_refund",
                input={"order_id": "2211", "amount": 320, "reason": "charged twice"},
            ),
        ],
        usage=so.Usage(input_tokens=2310, output_tokens=164, cost_usd=0.0081),
    )
    support = so.Agent(
        name="support",
        model=so.models.Scripted([refund, _echo], repeat_last=True),
        tools=[issue_refund, lookup_order],
    )
    batch = so.Agent(
        name="batch",
        model=so.models.Scripted([two, _echo], repeat_last=True),
        tools=[issue_refund],
    )
    ask = so.ModelResponse(
        tool_calls=[
            so.ToolCall(
                name="ask_question",
                input={
                    "question": "Which size should the replacement be?",
                    "options": [
                        {"label": "Small", "description": "The size ordered first."},
                        {"label": "Large", "description": "One size up."},
                    ],
                },
            )
        ]
    )
    helper = so.Agent(
        name="helper",
        model=so.models.Scripted([ask, _echo], repeat_last=True),
        tools=[so.ask_question()],
    )

    @so.tool(approval=so.always(approvers=2))
    async def wire_money(to: str, amount: float) -> dict[str, Any]:
        """Send money to an account."""
        return {"sent": amount, "to": to}

    wire = so.ModelResponse(
        tool_calls=[so.ToolCall(name="wire_money", input={"to": "ACME GmbH", "amount": 5000})]
    )
    treasury = so.Agent(
        name="treasury",
        model=so.models.Scripted([wire, _echo], repeat_last=True),
        tools=[wire_money],
    )

    def managers_only(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        if who is not None and who.attributes.get("role") == "manager":
            return so.Allowed()
        return so.Rejected("only a manager may approve invoices")

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=managers_only))
    async def pay_invoice(invoice: str) -> dict[str, Any]:
        """Pay a supplier's invoice."""
        return {"paid": invoice}

    pay = so.ModelResponse(tool_calls=[so.ToolCall(name="pay_invoice", input={"invoice": "INV-7"})])
    finance = so.Agent(
        name="finance",
        model=so.models.Scripted([pay, _echo], repeat_last=True),
        tools=[pay_invoice],
    )
    return [support, batch, helper, treasury, finance]


def make_runtime(store: str | None = None) -> so.Runtime:
    url = store or os.environ["SIGNOFF_TEST_STORE"]
    return so.Runtime(make_agents(), store=url, poll_interval=0.05)


_ANALYSED: dict[tuple[int, ...], list[BaseRoute]] = {}


def analysed_once(app: FastAPI) -> FastAPI:
    """`app` (made by `create_app`) with the included routers of the first app that included the
    same ones, as that app analysed them: FastAPI analyses an included router's routes (their
    parameters, bodies and responses) at an app's first request, ~30 ms of CPU that a test
    making an app per case paid every time. That depends on the routers alone: the app keeps its
    own runtime, context (throttle, sign-ins, streams), middleware, lifespan and other routes."""
    routes = app.router.routes
    included = [i for i, route in enumerate(routes) if hasattr(route, "include_context")]
    key = tuple(id(getattr(routes[i], "original_router")) for i in included)  # noqa: B009
    first = _ANALYSED.setdefault(key, [routes[i] for i in included])
    for i, route in zip(included, first, strict=True):
        routes[i] = route
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread; yields its base URL.

    It waits until this server has bound its port (not merely until something answers there:
    another process on the machine may have taken the port first, and then we pick another).
    """
    for _ in range(5):
        port = free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="critical",
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if server.started:
            break
        server.should_exit = True
        thread.join(timeout=10)
    else:
        raise RuntimeError("could not start a test server")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def spawn_serve(
    store: str, tokens: Sequence[str], log: IO[bytes], port: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `signoff serve` on `store`; returns once *this* process has bound its port."""
    # This tree's code, not whichever checkout the virtualenv's editable install points at.
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**python_env(), "SIGNOFF_TEST_STORE": store, "PYTHONPATH": path}
    for _ in range(1 if port is not None else 5):
        chosen = port or free_port()
        args = ["serve", "tests.test_server_common:make_runtime", "--port", str(chosen)]
        args += ["--store", store]
        for token in tokens:
            args += ["--token", token]
        start = log.seek(0, os.SEEK_END)
        proc = subprocess.Popen(
            [sys.executable, "-m", "signoff", *args], cwd=ROOT, env=env, stdout=log, stderr=log
        )
        banner = f"Uvicorn running on http://127.0.0.1:{chosen}".encode()
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            log.seek(start)
            if banner in log.read():
                return proc, f"http://127.0.0.1:{chosen}"
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    log.seek(0)
    raise RuntimeError(f"signoff serve did not start:\n{log.read().decode(errors='replace')}")


@contextmanager
def served(store: str, **kwargs: Any) -> Iterator[str]:
    """A token-authenticated server for the demo runtime on `store`."""
    runtime = make_runtime(store)
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05, **kwargs)
    with running(app) as base:
        yield base


@contextmanager
def server_processes(store: str, count: int, *tokens: str) -> Iterator[list[str]]:
    """`count` processes of `signoff serve` on one store; API tokens are given as
    SECRET=PRINCIPAL_ID."""
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    with tempfile.TemporaryFile() as log:
        try:
            for _ in range(count):
                proc, base = spawn_serve(store, tokens, log)
                procs.append(proc)
                bases.append(base)
            yield bases
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def read_sse(
    response: httpx.Response, count: int = 10_000, timeout: float = 10.0, until: str | None = None
) -> list[dict[str, Any]]:
    """Parse SSE messages from a streaming response until `count` events (or one of type
    `until`) have arrived, or the stream ends."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    for line in response.iter_lines():
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(out)} of {count} events arrived")
        if line == "":
            if "data" in current:
                out.append(current)
                if len(out) >= count or current.get("event") == until:
                    return out
            current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            current["data"] = json.loads(value)
        elif field in ("id", "event", "retry"):
            current[field] = value
    return out


def ttl_app(tmp_path: Path, now: list[float]) -> tuple[Any, Any]:
    """A server for one agent whose sessions expire 60 s after their last event, on a clock
    the test moves."""

    agent = ttl_agent()
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/ttl.db", clock=lambda: now[0])
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), poll_interval=0.02, heartbeat=0.1, sweep_every=None
    )
    return runtime, app


@asynccontextmanager
async def in_process(
    store_url: str,
    access: AccessRule | None = None,
    tokens: Mapping[str, so.Principal] = TOKENS,
    agents: Sequence[so.Agent] = (),
) -> AsyncIterator[tuple[so.Runtime, httpx.AsyncClient]]:
    """The server app over `make_agents()` and `agents` in process (no sweeper), its lifespan
    running, and an httpx client on it; `access=` only when given, so the default rule stays the
    server's own."""
    runtime = so.Runtime([*make_agents(), *agents], store=store_url)
    extra: dict[str, Any] = {} if access is None else {"access": access}
    app = create_app(
        runtime, auth=TokenAuth(dict(tokens)), sweep_every=None, close_runtime=True, **extra
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        yield runtime, c

"""The examples in the README and docs/ run as written, so the documentation cannot silently rot.

What the docs name is checked against the code in tests/test_docs_names.py, the CLI they show in
tests/test_docs_cli.py, the HTTP API in tests/test_docs_api.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from signoff import ToolContext

from ._docs import DOCS, ROOT, blocks


def section(title: str) -> str:
    """The README text under the `## title` heading, up to the next one."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def python_snippet(title: str) -> str:
    [code] = re.findall(r"```python\n(.*?)```", section(title), re.S)
    return str(code)


def test_the_in_python_example_runs_and_prints_what_its_comments_say(tmp_path: Path) -> None:
    code = python_snippet("In Python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for run in (1, 2):  # a second run reuses the store the first one left
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "waiting issue_refund {'order_id': '1042', 'amount': 180.0, 'reason': 'broken'}",
            "completed Done. I've refunded 180.00.",
            "completed",  # the same store, from plain code: `with` and a `*_sync` call
        ], run
    assert (tmp_path / ".signoff" / "state.db").exists()
    # the printed results are the ones the comments promise
    assert "# waiting issue_refund {...}" in code and "# completed Done. ..." in code
    assert "# completed\n" in code and "with so.Runtime(" in code


def test_a_policy_function_is_told_from_a_predicate_as_the_readme_says(tmp_path: Path) -> None:
    """README: a function whose first parameter is annotated `so.ApprovalContext` or named `ctx`
    / `context` (or wrapped in `so.policy`) gets the context; any other (or `so.predicate`) gets
    the validated input."""
    import signoff as so
    from signoff._approval import ApprovalArg

    row = " ".join(section("Approval policies").split())
    assert "named `ctx` / `context`" in row and "`so.policy(fn)`" in row

    def typed(c: so.ApprovalContext) -> so.ApprovalStatus:
        return "user-approval" if c.tool_name == "refund" else "not-applicable"

    def ctx(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        return typed(ctx)

    def context(context: so.ApprovalContext) -> so.ApprovalStatus:
        return typed(context)

    def on_input(input: object) -> bool:
        return getattr(input, "amount", 0) > 100

    def on_c(c: object) -> bool:  # any other name: a predicate of the input
        return getattr(c, "amount", 0) > 100

    cases: list[ApprovalArg] = [typed, ctx, context, so.policy(lambda c: typed(c)), on_input, on_c]
    cases += [so.predicate(lambda ctx: getattr(ctx, "amount", 0) > 100)]
    for n, approval in enumerate(cases):

        @so.tool(name="refund", approval=approval)
        async def refund(amount: float) -> float:
            """Refund."""
            return amount

        call = so.ToolCall(name="refund", input={"amount": 180})
        model = so.models.Scripted([so.ModelResponse(tool_calls=[call])])
        rt = so.Runtime(
            [so.Agent(name="a", model=model, tools=[refund])], store=f"sqlite:///{tmp_path}/{n}.db"
        )
        try:
            r = rt.generate_sync("a", prompt="refund")
            assert r.status == "waiting", n
            assert [p.policy_error for p in r.pending] == [None], n
        finally:
            rt.close_sync()


def test_the_server_examples_run_as_written(tmp_path: Path) -> None:
    """docs/server.md's `create_app` example serves the example agent, and its Python client
    example (in an async function, its `...` loop body stopping at the end of the turn)
    approves the refund through it."""
    import asyncio

    import examples.support as support

    import signoff as so

    from .test_server_common import running

    demo = so.Agent(
        name="support",
        model=so.models.Scripted([support.demo_model], repeat_last=True),
        tools=list(support.agent.tools.values()),
    )
    app_code, client_code = blocks("docs/server.md", "python")
    scope: dict[str, object] = {"runtime": so.Runtime([demo], store=f"sqlite:///{tmp_path}/s.db")}
    exec(app_code, scope)
    with running(scope["app"]) as base:
        client_code = client_code.replace("http://127.0.0.1:8000", base)
        client_code, found = re.subn(
            r"^( *)(async for event in live\.follow\(\)): \.\.\.",
            r'\1\2:\n\1    if event.type == "turn.completed":\n\1        break',
            client_code,
            flags=re.M,
        )
        assert found == 1, client_code
        body = "".join(f"    {line}\n" for line in client_code.splitlines())
        scope = {}
        exec(f"async def main():\n{body}    return r, live\n", scope)
        r, live = asyncio.run(asyncio.wait_for(scope["main"](), 30))  # type: ignore[operator]
    assert r.pending[0].action.tool_name == "issue_refund"
    assert r.pending[0].requested_by.principal_id == "alice"
    assert live.open_requests() == []
    assert [v.status for v in live.requests.values()] == ["settled"]


def test_the_subagents_example_runs_and_parks_as_its_comments_say(tmp_path: Path) -> None:
    """docs/subagents.md's example, with scripted models for its `model=...` and inside an async
    function: the child's approval is asked on the support session, and answering it there
    (by `respond`, or by the `send` the comment offers) completes the parent's turn."""
    import asyncio

    import signoff as so

    [code] = blocks("docs/subagents.md", "python")
    assert code.count("model=...") == 2
    respond, send = re.findall(
        r"^(?:# or: )?(await rt\.(?:respond|send)\(.*?\))$", code, re.M | re.S
    )

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        """Refund an order."""
        return {"refunded": amount}

    def scripted(call: so.ToolCall, text: str) -> so.models.Scripted:
        return so.models.Scripted(
            [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text=text)]
        )

    for n, answer in enumerate((respond, send)):
        models = iter(
            [
                scripted(
                    so.ToolCall(name="issue_refund", input={"order_id": "1042", "amount": 5}),
                    "refunded",
                ),
                scripted(
                    so.ToolCall(name="billing", input={"message": "refund 1042"}),
                    "billing: refunded",
                ),
            ]
        )
        source = code[: code.index("await rt.respond(")]
        source = source.replace("model=...", "model=next(models)")
        source = source.replace('"sqlite:///state.db"', f'"sqlite:///{tmp_path}/{n}.db"')
        source += f"done = {answer}\nawait rt.close()\nreturn r, done\n"
        scope: dict[str, object] = {
            "models": models,
            "issue_refund": issue_refund,
            "alice": so.Principal(authenticator="token", principal_id="alice"),
        }
        body = "".join(f"    {line}\n" for line in source.splitlines())
        exec(f"async def main():\n{body}", scope)
        parked, done = asyncio.run(asyncio.wait_for(scope["main"](), 30))  # type: ignore[operator]
        assert parked.status == "waiting", n
        (mirror,) = parked.pending
        assert mirror.source == "child" and mirror.child is not None, n
        assert (mirror.child.agent, mirror.action and mirror.action.tool_name) == (
            "billing",
            "issue_refund",
        ), n
        assert (done.status, done.text) == ("completed", "billing: refunded"), n


def test_the_channels_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's Channels example, with its secrets defined and `auth=...` filled in, builds
    a hub whose state file is where it says and an app that serves Slack's endpoint."""
    import httpx

    import signoff as so

    from .test_server_common import running

    [code] = re.findall(r"```python\n(.*?)```", section("Channels"), re.S)
    assert code.count("auth=...") == 1
    monkeypatch.chdir(tmp_path)
    scope: dict[str, object] = {
        "runtime": so.Runtime([], store=f"sqlite:///{tmp_path}/s.db"),
        "BOT_TOKEN": "xoxb-test",
        "SIGNING_SECRET": "signing-secret",
        "WEBHOOK_SECRET": "webhook-secret",
    }
    exec(code.replace("auth=...", "dev=True"), scope)
    with running(scope["app"]) as base:
        unsigned = httpx.post(f"{base}/channels/slack/interactivity", content=b"payload=%7B%7D")
    assert unsigned.status_code == 401, unsigned.text  # mounted, and checks Slack's signature
    assert (tmp_path / ".signoff" / "channels.db").exists()


def _offline_env() -> dict[str, str]:
    """A subprocess's environment for the example: this checkout importable, and no provider
    configured, so it runs its offline demo model, as on a machine with none."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for name in ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    return env


def test_the_chat_transcript_in_the_readme_is_what_chat_prints(tmp_path: Path) -> None:
    """The README's `./scripts/chat` session, typed into `signoff chat examples.support:runtime
    --as dev:dev` (what the script runs) in a directory of its own, is what it prints, line for
    line from its
    header on; only the session id differs. (Read from a pipe, what is typed is not echoed: it
    and its line break are left out of the transcript.)"""
    [transcript] = re.findall(r"```\n\$ \./scripts/chat\n(.*?)```", section("Quick start"), re.S)
    typed = re.findall(r"(?:\? you: |\(y/N\) )(.+)$", transcript, re.M)
    assert typed == ["refund order 1042, it arrived broken", "y"]
    env = _offline_env()
    env.pop("SIGNOFF_STORE", None)  # the example runtime's own store, as the script uses
    out = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", "examples.support:runtime", "--as", "dev:dev"],
        input="".join(f"{t}\n" for t in typed),
        cwd=tmp_path,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    expected = re.sub(r"(\? you: |\(y/N\) ).+\n", r"\1", transcript)
    printed = re.sub(r"ses_\w+", "ses_", out.stdout)
    assert printed.startswith(re.sub(r"ses_\w+", "ses_", expected)), (expected, printed)
    assert (tmp_path / ".signoff" / "state.db").exists()


@pytest.mark.parametrize(
    ("environ", "args", "runs"),
    [
        ({}, [], "examples.support:runtime --as dev:dev"),
        ({}, ["--session", "ses_1"], "examples.support:runtime --as dev:dev --session ses_1"),
        ({}, ["--as", "web:alice"], "examples.support:runtime --as web:alice"),
        ({}, ["--as=web:alice"], "examples.support:runtime --as=web:alice"),
        ({"SIGNOFF_PRINCIPAL": "web:alice"}, [], "examples.support:runtime"),
    ],
)
def test_scripts_chat_acts_as_the_demo_dashboard_unless_told_otherwise(
    environ: dict[str, str], args: list[str], runs: str
) -> None:
    """`./scripts/chat` adds `--as dev:dev` (the demo dashboard's principal) unless the caller
    says who they are, by `--as` or `SIGNOFF_PRINCIPAL` (which it overrode)."""
    script = (ROOT / "scripts" / "chat").read_text()
    assert "./scripts/setup\n" in script and "exec .venv/bin/signoff chat " in script
    dry = script.replace("./scripts/setup\n", "").replace("exec .venv/bin/signoff chat ", "echo ")
    env = {k: v for k, v in os.environ.items() if k != "SIGNOFF_PRINCIPAL"} | environ
    out = subprocess.run(
        ["bash", "-c", dry, str(ROOT / "scripts" / "chat"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == runs


def test_what_scripts_chat_leaves_pending_the_demo_dashboard_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README said the dashboard answers a request chat leaves pending; chat acted as
    `local:<user>` and the demo's dev dashboard as `dev:dev`, which the default rule refused
    (403 `not_allowed`). `./scripts/chat` acts as `dev:dev`: the dashboard approves it."""
    import httpx

    import signoff as so
    from signoff.server import create_app

    from .test_server_common import running

    env = _offline_env()
    store = f"sqlite:///{tmp_path / 'state.db'}"
    out = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", "examples.support:runtime"]
        + ["--as", "dev:dev", "--store", store],
        input="refund order 1042, it arrived broken\n",
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    import importlib

    import examples.support

    monkeypatch.setenv("SIGNOFF_MODEL", "demo")
    example = importlib.reload(examples.support)  # its refunds so far forgotten
    runtime = so.Runtime([example.agent], store=store)
    with running(create_app(runtime, dev=True)) as base:
        (pending,) = httpx.get(f"{base}/v1/requests", verify=False).json()["items"]
        body = {"inputResponses": [{"requestId": pending["id"], "optionId": "approve"}]}
        sid = pending["session_id"]
        r = httpx.post(f"{base}/v1/sessions/{sid}/responses", json=body, verify=False)
        assert r.status_code == 200, r.text
        assert r.json()["pending"] == [] and "refunded 180.00" in r.json()["text"], r.text
    runtime.close_sync()


def test_the_packages_the_quick_start_says_setup_installs_are_the_ones_it_installs() -> None:
    """`./scripts/setup` run as root installs Debian packages the tests need: the Quick start
    names each, so a new user knows what it adds to their machine (pgbouncer was left out)."""
    setup = (ROOT / "scripts" / "setup").read_text()
    installed = re.findall(r"apt-get install -y -qq ([\w.-]+)", setup)
    shown = {"chromium": "Chromium", "postgresql-15": "PostgreSQL 15"}
    text = " ".join(section("Quick start").split())
    said = re.search(r"and install Debian's (.*?) for the tests when run as root", text)
    assert said, text
    named = re.split(r", | and ", said.group(1))
    assert sorted(named) == sorted(shown.get(p, p) for p in installed), (named, installed)


def test_the_audit_example_runs_and_checks_out(tmp_path: Path) -> None:
    """docs/audit.md's example, in an async function over a parked session: the trail reads,
    verifies with no problem, exports, and the export verifies offline; an altered export
    does not."""
    import asyncio

    import signoff as so
    from signoff.testing import call_tools, reply, scripted_agent

    [code] = blocks("docs/audit.md", "python")

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(name="refund", input={"order_id": "1"})), reply("done")],
        tools=[refund],
    )

    async def main() -> dict[str, Any]:
        async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/a.db") as rt:
            parked = await rt.generate("a", prompt="refund 1")
            assert parked.status == "waiting"
            scope: dict[str, Any] = {"rt": rt, "so": so, "session_id": parked.session_id}
            body = "".join(f"    {line}\n" for line in code.splitlines())
            exec(f"async def example():\n{body}    return locals()\n", scope)
            found: dict[str, Any] = await scope["example"]()
            return found

    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        found = asyncio.run(main())
    finally:
        os.chdir(cwd)
    assert [e.type for e in found["entries"]][:1] == ["input.requested"]
    assert found["problems"] == []
    lines = (tmp_path / "trail.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) >= len(found["entries"])
    assert so.verify_audit_export(lines) == []
    first = json.loads(lines[0])
    first["data"] = {**first["data"], "forged": True}
    problems = so.verify_audit_export([json.dumps(first), *lines[1:]])
    assert [(p.stream, p.n, p.reason) for p in problems][:1] == [
        (first["stream"], 1, "content does not match")
    ]


def test_the_tracing_example_prints_the_spans_its_comments_say(tmp_path: Path) -> None:
    """docs/tracing.md's example: a turn parked by one runtime and approved from another is two
    drives, each with its model call, the second with the tool body, read from the exporter."""
    [code] = blocks("docs/tracing.md", "python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    promised = [line.removeprefix("# ") for line in code.splitlines() if line.startswith("# ")]
    assert [line.rstrip() for line in out.stdout.splitlines()] == promised
    assert promised[-1] == "invoke_agent support completed"


def test_the_testing_example_is_a_test_file_that_passes(tmp_path: Path) -> None:
    """docs/testing.md's example is a pytest file a user copies: it passes as written."""
    [code] = blocks("docs/testing.md", "python")
    assert code.startswith("# test_shop.py: run with pytest\n")
    (tmp_path / "test_shop.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_shop.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout, out.stdout


PYTHON_BLOCKS = {
    # a line of each fenced python block in the docs -> the test of this module that runs it
    "async with so.Runtime([agent]": (
        test_the_in_python_example_runs_and_prints_what_its_comments_say
    ),
    "hub = ChannelHub(runtime": test_the_channels_example_runs_as_written,
    "app = create_app(runtime, auth=TokenAuth(": test_the_server_examples_run_as_written,
    "async with AsyncClient(": test_the_server_examples_run_as_written,
    "support = so.Agent(name=": test_the_subagents_example_runs_and_parks_as_its_comments_say,
    "problems = await rt.verify_audit()": test_the_audit_example_runs_and_checks_out,
    "so.Runtime([refunds], store=STORE": (
        test_the_tracing_example_prints_the_spans_its_comments_say
    ),
    "# test_shop.py: run with pytest": test_the_testing_example_is_a_test_file_that_passes,
}


def test_every_python_block_in_the_docs_is_run_by_a_test() -> None:
    """Each fenced python block of the README and docs/ is one a test above runs, so a new
    example cannot go unchecked: it needs an entry in `PYTHON_BLOCKS` and a test."""
    found = [(doc, block) for doc in DOCS for block in blocks(doc, "python")]
    assert found
    for doc, block in found:
        runs = [marker for marker in PYTHON_BLOCKS if marker in block]
        assert len(runs) == 1, (doc, block[:200], runs)
    unused = [m for m in PYTHON_BLOCKS if not any(m in block for _, block in found)]
    assert unused == [], unused


def test_the_errors_the_readme_says_a_wrong_typed_answer_raises(tmp_path: Path) -> None:
    """README: a pydantic type built with a wrong field raises pydantic's ValidationError, and
    the same answer passed to a call as a dict is `so.InvalidAnswer`."""
    import pydantic

    import signoff as so

    assert "`so.InputResponse(request_id=5)`, raises pydantic's `ValidationError`" in " ".join(
        section("Guarantees").split()
    )
    with pytest.raises(pydantic.ValidationError):
        so.InputResponse(request_id=5, option_id="approve")

    @so.tool(approval=so.always())
    async def refund(amount: int) -> int:
        """Refund."""
        return amount

    call = so.ToolCall(name="refund", input={"amount": 5})
    agent = so.Agent(
        name="a", model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]), tools=[refund]
    )
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    try:
        r = rt.generate_sync("a", prompt="go")
        with pytest.raises(so.InvalidAnswer):
            rt.respond_sync(r.session_id, [{"request_id": 5, "option_id": "approve"}])
    finally:
        rt.close_sync()


def test_a_tool_runs_as_whom_the_readme_says_run_as_names(tmp_path: Path) -> None:
    """README (*Approval policies*): `run_as="approver"` runs an approved call as the person
    whose approval settled it (a quorum's last vote), as the requester by default, and a call
    no one approved (its policy let it run, a deadline approved it) as the requester. `run_as`
    was named among the features and explained nowhere."""
    import signoff as so
    from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime

    said = " ".join(section("Approval policies").split())
    assert '`@so.tool(run_as="approver")` runs it as the person whose approval settled' in said
    assert "(for a quorum, the one whose vote completed it)" in said
    assert 'deadline\'s `on_timeout="approve"` approved) runs as the requester either way' in said

    alice, bob, carol = (
        so.Principal(authenticator="web", principal_id=name) for name in ("alice", "bob", "carol")
    )
    ran_as: dict[str, str | None] = {}

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        return so.Allowed()

    def gated(name: str, run_as: Any, request: Any) -> so.Tool:
        async def body(ctx: ToolContext, amount: int) -> int:  # a module-level hint
            current = ctx.session.auth.current
            ran_as[name] = None if current is None else current.principal_id
            return amount

        spec = so.ApprovalSpec(request, anyone)
        return so.tool(body, name=name, description="Refund.", approval=spec, run_as=run_as)

    tools = [
        gated("quorum", "approver", so.always(approvers=2)),
        gated("plain", "requester", so.always()),
        gated("unasked", "approver", so.never()),
        gated("lapsed", "approver", so.always(expires_in=60, on_timeout="approve")),
    ]
    calls = call_tools(*(call(t.name, amount=1) for t in tools))
    agent = scripted_agent("a", [calls, reply("done")], tools=tools)
    clock = ManualClock()
    with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        r = rt.generate_sync("a", prompt="go", auth=alice)
        asked = {p.tool_name: p.id for p in r.pending}
        approve = [
            so.InputResponse(request_id=asked["quorum"], option_id="approve"),
            so.InputResponse(request_id=asked["plain"], option_id="approve"),
        ]
        rt.respond_sync(r.session_id, approve, principal=bob)
        rt.respond_sync(r.session_id, approve[:1], principal=carol)
        clock.advance(61)
        assert rt.generate_sync(session_id=r.session_id).status == "completed"
        started = {
            e.data["tool_name"]: e.data["principal"]["principal_id"]
            for e in rt.events_sync(r.session_id)
            if e.type == "tool.started"
        }
    expected = {"quorum": "carol", "plain": "alice", "unasked": "alice", "lapsed": "alice"}
    assert ran_as == expected and started == expected


def test_a_script_that_runs_out_does_what_docs_testing_md_says(tmp_path: Path) -> None:
    """docs/testing.md: a session asking past its script's end fails its turn retryably
    (`model_error`), and `repeat_last=True` plays the last step again. `repeat_last`, which
    examples/support.py uses, was documented nowhere."""
    from signoff.testing import reply, scripted_agent, sqlite_runtime

    said = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    assert "fails its turn, retryably (`model_error`, saying to script more)" in said
    assert "`scripted_agent(..., repeat_last=True)`) it is played the last step again" in said
    assert "repeat_last=True" in (ROOT / "examples" / "support.py").read_text()

    short = scripted_agent("short", [reply("one")])
    again = scripted_agent("again", [reply("one"), reply("last")], repeat_last=True)
    with sqlite_runtime(tmp_path, short, again) as rt:
        r = rt.generate_sync("short", prompt="1")
        r = rt.generate_sync(session_id=r.session_id, prompt="2")
        assert r.status == "failed" and r.error is not None
        assert r.error["code"] == "model_error" and r.retryable
        assert "script more" in r.error["message"]
        r = rt.generate_sync("again", prompt="1")
        texts = [rt.generate_sync(session_id=r.session_id, prompt=p).text for p in "234"]
        assert texts == ["last", "last", "last"]

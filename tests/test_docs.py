"""The examples in the README and docs/ run as written, so the documentation cannot silently rot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
        ], run
    assert (tmp_path / ".signoff" / "state.db").exists()
    # the printed results are the ones the comments promise
    assert "# waiting issue_refund {...}" in code and "# completed Done. ..." in code


def test_each_extra_the_docs_name_exists_and_brings_the_client_its_message_promises() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "src" / "signoff").rglob("*.py"))
    named = {
        extra
        for p in texts
        for group in re.findall(r"signoff\[([a-z,]+)\]", p.read_text())
        for extra in group.split(",")  # 'signoff[server,slack]' names two
    }
    assert named and named <= set(extras), sorted(named - set(extras))
    # `so.Client` says "pip install 'signoff[server]'" when httpx is missing
    assert any(dep.startswith("httpx") for dep in extras["server"])


def _own_doc(obj: object) -> str:
    """The docstring `obj` carries itself: not its class's, nor a dataclass's generated one."""
    import inspect

    doc = inspect.getdoc(obj) or ""
    name = getattr(obj, "__name__", "")
    if not doc or doc.startswith(f"{name}(") or doc == inspect.getdoc(type(obj)):
        return ""
    if isinstance(obj, type) and any(doc == inspect.getdoc(base) for base in obj.__mro__[1:]):
        return ""  # inherited from a base class, e.g. pydantic's BaseModel
    return doc


def test_every_public_class_and_function_says_what_it_is() -> None:
    import inspect

    import signoff as so

    missing = [
        name
        for name in so.__all__
        if (inspect.isclass(obj := getattr(so, name)) or inspect.isfunction(obj))
        and not _own_doc(obj)
    ]
    methods = [
        f"Runtime.{name}"
        for cls in so.Runtime.__mro__[:-1]
        for name, fn in vars(cls).items()
        if not name.startswith("_") and not name.endswith("_sync") and inspect.isfunction(fn)
        if not _own_doc(getattr(so.Runtime, name))
    ]
    assert missing + methods == [], missing + methods


def test_a_policy_function_is_told_from_a_predicate_as_the_readme_says(tmp_path: Path) -> None:
    """README: a function whose first parameter is annotated `so.ApprovalContext` or named `ctx`
    / `context` (or wrapped in `so.policy`) gets the context; any other (or `so.predicate`) gets
    the validated input."""
    import signoff as so

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

    cases = [typed, ctx, context, so.policy(lambda c: typed(c)), on_input, on_c]
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


def blocks(doc: str, lang: str) -> list[str]:
    """The fenced code blocks of `doc` (a path under the repository) in language `lang`."""
    return [str(b) for b in re.findall(rf"```{lang}\n(.*?)```", (ROOT / doc).read_text(), re.S)]


def test_every_command_and_option_the_docs_show_is_one_the_cli_takes() -> None:
    """Each `signoff ...` line of a shell block in the README and docs/ names a command the CLI
    has and only options that command takes, so a command copied from the docs is not refused."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    shown = 0
    for doc in ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]:
        text = "\n".join(b for lang in ("bash", "sh", "") for b in blocks(doc, lang))
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            words = line.strip().removeprefix("$ ").split()
            if words[:1] != ["signoff"]:
                continue
            command = root
            for word in words[1:]:
                if word not in getattr(command, "commands", {}):
                    break
                command = command.commands[word]
            assert not hasattr(command, "commands"), (doc, line)  # a command, not a group
            taken = {o for p in command.params for o in p.opts}
            used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line.split("#")[0]))
            assert used <= taken, (doc, line, sorted(used - taken))
            shown += 1
    assert shown >= 10, shown


def test_the_readme_shows_every_command() -> None:
    """Every command of the CLI is shown in a shell block of the README, where an operator
    looks for what the command line can do (`signoff sessions` was only named in passing)."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    every = {
        " ".join([name, *([sub] if sub else [])])
        for name, command in root.commands.items()
        for sub in getattr(command, "commands", None) or [""]
    }
    text = "\n".join(b for lang in ("bash", "sh", "") for b in blocks("README.md", lang))
    shown: set[str] = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["signoff"]:
            shown |= {" ".join(words[1:2]), " ".join(words[1:3])}
    assert every - shown == set()


def test_the_api_table_names_the_routes_the_server_has(tmp_path: Path) -> None:
    """Every `METHOD /v1/...` docs/server.md names is a route of the app, and the table lists
    every route of the API."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    paths = create_app(rt, dev=True).openapi()["paths"]
    served = {
        (method.upper(), re.sub(r"\{\w+\}", "{id}", path))
        for path, ops in paths.items()
        for method in ops
    }
    named = set(re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/v1/[^`?]*)`", blocks_text("server")))
    assert named == served, (sorted(named - served), sorted(served - named))


def blocks_text(name: str) -> str:
    return (ROOT / "docs" / f"{name}.md").read_text()


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


def test_the_chat_transcript_in_the_readme_is_what_chat_prints(tmp_path: Path) -> None:
    """The README's `./scripts/chat` session, typed into `signoff chat examples.support:runtime`
    (what the script runs), prints its lines in its order; only the session id differs."""
    [transcript] = re.findall(r"```\n(\$ \./scripts/chat\n.*?)```", section("Quick start"), re.S)
    lines = transcript.splitlines()[1:]
    typed = [m for line in lines for m in re.findall(r"(?:\? you: |\(y/N\) )(.+)$", line)]
    assert typed == ["refund order 1042, it arrived broken", "y"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    for name in ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        env.pop(name, None)  # the example's offline demo model, as on a machine with no provider
    store = f"sqlite:///{tmp_path}/s.db"
    out = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", "examples.support:runtime", "--store", store],
        input="".join(f"{t}\n" for t in typed),
        cwd=ROOT,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    printed = out.stdout
    for line in lines:
        expected = re.sub(r"(\? you: |\(y/N\) ).+$", r"\1", line).strip()
        expected = re.sub(r"ses_\w+", "ses_", expected)
        at = re.sub(r"ses_\w+", "ses_", printed).find(expected)
        assert at >= 0, (expected, printed)
        printed = re.sub(r"ses_\w+", "ses_", printed)[at + len(expected) :]


DOCS = ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]


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


def test_every_table_in_the_docs_is_one_table() -> None:
    """A Markdown table ends at the first line that is not a row: rows after a paragraph that
    cuts a table show as plain text with pipes. So each run of rows starts with a header row
    and its `|---|` separator, outside code blocks."""
    cut = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        fenced = False
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            starts = line.startswith("|") and not (i and lines[i - 1].startswith("|"))
            if starts and not fenced:
                following = lines[i + 1] if i + 1 < len(lines) else ""
                if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", following):
                    cut.append((doc, i + 1, line[:60]))
    assert cut == []


def test_docs_api_lists_every_public_name_and_only_those() -> None:
    """docs/api.md's tables name each of `signoff.__all__` once, and nothing else."""
    import signoff as so

    api = (ROOT / "docs" / "api.md").read_text()
    rows = re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \|", api, re.M)
    listed = [name for row in rows for name in re.findall(r"`([\w.]+)`", row)]
    assert sorted(listed) == sorted(set(listed)), "listed twice"
    assert sorted(listed) == sorted(so.__all__), (
        sorted(set(so.__all__) - set(listed)),
        sorted(set(listed) - set(so.__all__)),
    )


def test_every_signoff_name_the_docs_use_exists() -> None:
    """Each `so.X`, `signoff.X.Y` and `from signoff.X import Y` of the README and docs/ (text
    and code) names something the package has, so a documented name is never an AttributeError."""
    import importlib

    def resolve(dotted: str) -> object:
        parts = dotted.split(".")
        obj: object = importlib.import_module(parts[0])
        for n, part in enumerate(parts[1:], 2):
            try:
                obj = getattr(obj, part)
            except AttributeError:  # a subpackage not imported by its parent
                obj = importlib.import_module(".".join(parts[:n]))
        return obj

    # The `signoff.*` span attributes and events the tracing docs name are the ones it sets.
    tracing = (ROOT / "src" / "signoff" / "_tracing.py").read_text()
    traced = set(re.findall(r"\"(signoff\.[a-z_.]+)\"", tracing))
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        names = {f"signoff.{n}" for n in re.findall(r"\bso\.([A-Za-z_][\w.]*\w)", text)}
        names |= {f"signoff.{n}" for n in re.findall(r"\bsignoff\.([a-z_][\w.]*\w)", text)}
        for module, imported in re.findall(r"from (signoff[\w.]*) import ([\w, ]+)", text):
            names |= {f"{module}.{n.strip()}" for n in imported.split(",")}
        for name in sorted(names - traced):
            try:
                resolve(name)
            except (AttributeError, ImportError) as exc:
                raise AssertionError(f"{doc} names {name}, which does not exist") from exc
            checked += 1
    assert checked >= 40, checked


def test_the_client_calls_are_the_ones_docs_server_md_names(tmp_path: Path) -> None:
    """docs/server.md: `Client` has the calls it lists with `AsyncClient`'s parameters (its
    `events` without following), `session()` is `AsyncClient`'s only, turn calls return the
    runtime's types, and `pending()` / `sessions()` / `state()` return a page with its total (twice)
    and a dict."""
    import inspect

    import examples.support as support

    import signoff as so
    from signoff.server import AsyncClient, Client, create_app

    from .test_server_common import running

    text = " ".join(blocks_text("server").split())
    calls = ["generate", "send", "respond", "cancel", "state", "pending", "sessions", "events"]
    assert f"(`{'`, `'.join(calls)}`, which returns the events so far" in text
    for name in calls:
        sync = inspect.signature(getattr(Client, name)).parameters
        async_ = dict(inspect.signature(getattr(AsyncClient, name)).parameters)
        if name == "events":
            del async_["follow"]  # `retries` it takes too
        assert list(sync) == list(async_), name
    assert hasattr(AsyncClient, "session") and not hasattr(Client, "session")
    for cls in (Client, AsyncClient):
        assert list(inspect.signature(cls).parameters) == [
            "base_url",
            "token",
            "timeout",
            "transport",
        ]
    assert '`(requests, total)` (50 a page, `status="pending"` by default' in text
    assert "`(summaries, total)` (`so.stores.SessionSummary`s" in text

    demo = so.Agent(
        name="support",
        model=so.models.Scripted([support.demo_model], repeat_last=True),
        tools=list(support.agent.tools.values()),
    )
    rt = so.Runtime([demo], store=f"sqlite:///{tmp_path}/s.db")
    with running(create_app(rt, dev=True)) as base, Client(base) as c:
        r = c.generate("support", "refund order 1042, it arrived broken")
        assert r.status == "waiting" and isinstance(r.pending[0], so.InputRequest)
        page, total = c.pending()
        assert ([p.id for p in page], total) == ([r.pending[0].id], 1)
        state = c.state(r.session_id)
        assert isinstance(state, dict) and state["status"] == "waiting"
        summaries, total = c.sessions()
        assert total == 1 and isinstance(summaries[0], so.stores.SessionSummary)
        assert summaries[0].id == r.session_id and summaries[0].status == "waiting"
        done = c.respond(r.session_id, [{"request_id": r.pending[0].id, "option_id": "approve"}])
        assert done.status == "completed" and isinstance(done.outcomes[0], so.Outcome)
    rt.close_sync()


def test_every_command_and_option_the_docs_name_in_their_text_exists() -> None:
    """The `signoff ...` code spans of the README's and docs/' prose name commands with options
    those commands take, and every `--option` the text names is one some command takes (but
    `--quick`, a benchmark's, and `--strict`, mypy's)."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    every: set[str] = set()

    def collect(command: Any) -> None:
        every.update(o for p in command.params for o in p.opts)
        for sub in getattr(command, "commands", {}).values():
            collect(sub)

    collect(root)
    spans = 0
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
        for span in re.findall(r"`(signoff [^`]*)`", prose):
            command = root
            for word in span.split()[1:]:
                if word not in getattr(command, "commands", {}):
                    break
                command = command.commands[word]
            assert not hasattr(command, "commands"), (doc, span)
            used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", span))
            assert used <= {o for p in command.params for o in p.opts}, (doc, span)
            spans += 1
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", prose)) - {"--quick", "--strict"}
        assert named <= every, (doc, sorted(named - every))
    assert spans >= 20, spans


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


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_and_path_the_docs_name_resolves() -> None:
    """Each relative Markdown link (and its `#anchor`) of the README and docs/ leads to a file
    and heading that exist, and each repository path they name in code spans (`docs/api.md`,
    `tests/test_fuzz.py`, `scripts/`), script they run (`./scripts/demo`) and module they run
    (`python -m bench.overhead`) is there, so a reader following one is not lost."""
    prefixes = ("docs/", "bench/", "tests/", "examples/", "src/", "scripts/")
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # http(s): and mailto: links leave the repository
            path, _, anchor = target.partition("#")
            file = (ROOT / doc).parent / path if path else ROOT / doc
            assert file.exists(), (doc, target)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, (doc, target)
            checked += 1
        for path in re.findall(r"`([\w./-]+)`", prose):
            if path.startswith(prefixes):
                assert (ROOT / path).exists(), (doc, path)
                checked += 1
        for script in re.findall(r"(?<![\w/])\./(scripts/[\w.-]+)", text):  # ./scripts/demo
            assert (ROOT / script).is_file(), (doc, script)
            checked += 1
        for module in re.findall(r"python -m ([\w.]+)", text):  # bench.overhead, signoff
            path = ROOT / "src" / module if module == "signoff" else ROOT / module.replace(".", "/")
            assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module
            checked += 1
    assert checked >= 15, checked


def _error_table() -> set[tuple[int, str]]:
    """The (status, code) pairs of docs/server.md's error table."""
    table = blocks_text("server").split("### Errors", 1)[1].split("\n### ", 1)[0]
    pairs = set()
    for status, codes in re.findall(r"^\| (\d{3}) \| (.*) \|$", table, re.M):
        # a code is the first span of the cell or one after a comma or semicolon
        found = re.findall(r"(?:^|[,;] |, and |, also |also )`([a-z_]+)`", codes)
        pairs |= {(int(status), code) for code in found}
    return pairs


def test_the_error_table_lists_every_code_the_server_sends_and_only_those() -> None:
    """docs/server.md's error table names each (status, code) the API can answer with: the
    codes of the errors the runtime raises (by `status_for`) and the ones the server's routes
    write themselves; and every `NNN code` the docs' prose names is one of those, so a client
    written against the docs handles what it gets."""
    from signoff import _exceptions
    from signoff.server._errors import ERROR_RESPONSES, status_for

    abstract = {
        _exceptions.SignoffError,  # bases, never raised as themselves
        _exceptions.SessionError,
        _exceptions.AnswerError,
        _exceptions.StepFailed,  # raised inside a tool body, which reads it
        _exceptions.RemoteError,  # the client's, not the server's
    }
    sent = {
        (status_for(cls.__new__(cls)), cls.code)  # status_for goes by the class alone
        for cls in vars(_exceptions).values()
        if isinstance(cls, type) and issubclass(cls, _exceptions.SignoffError)
        if cls not in abstract
    }
    source = "\n".join(p.read_text() for p in (ROOT / "src/signoff/server").glob("*.py"))
    written = {
        (int(status), code)
        for status, code in re.findall(r"\b([1-5]\d\d)(?:,|:)\s*\"([a-z_]+)\"", source)
        if code != "error"
    }
    dashboard = {(403, "csrf_failed"), (400, "invalid_form"), (409, "form_already_sent")}
    assert dashboard <= written  # the dashboard's own, named in its section, not the API's
    table = _error_table()
    assert table == (sent | written) - dashboard, (
        sorted(table - sent - written),
        sorted((sent | written) - dashboard - table),
    )
    # the OpenAPI document's error responses describe the same codes (but 405: a route is
    # never called with a method it does not have)
    described = {(405, "method_not_allowed")} | {
        (int(status), code)
        for status, response in ERROR_RESPONSES.items()
        for code in re.findall(r"`([a-z_]+)`", response["description"])
    }
    assert described == table, (sorted(described - table), sorted(table - described))
    for doc in DOCS:
        prose = " ".join((ROOT / doc).read_text().split())
        named = {(int(s), c) for s, c in re.findall(r"\b([1-5]\d\d) `([a-z_]+)`", prose)}
        assert named <= table | dashboard, (doc, sorted(named - table - dashboard))


def test_the_drawn_hierarchy_names_every_error_signoff_raises() -> None:
    """The README sends readers to `src/signoff/_exceptions.py` for the hierarchy of errors:
    it draws every `SignoffError` subclass the package defines, under its real base."""
    import importlib

    import signoff as so

    drawing = (so._exceptions.__doc__ or "").split("\n\n")[1]
    depth = {}
    for line in drawing.splitlines():
        found = re.match(r"^([ │├└─]*)([A-Z]\w+)", line.strip("\n"))
        if found:
            depth[found.group(2)] = len(found.group(1))
    defined: dict[str, type] = {}
    for path in sorted((ROOT / "src" / "signoff").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        if "class " not in path.read_text() or module.endswith("__main__"):
            continue
        for obj in vars(importlib.import_module(module.removesuffix(".__init__"))).values():
            if isinstance(obj, type) and issubclass(obj, so.SignoffError):
                defined[obj.__name__] = obj
    assert sorted(defined) == sorted(depth), (
        sorted(set(defined) - set(depth)),
        sorted(set(depth) - set(defined)),
    )
    names = list(depth)
    for n, name in enumerate(names[1:], 1):
        # the class's base is the nearest line above drawn less deep
        base = next(b for b in reversed(names[:n]) if depth[b] < depth[name])
        assert defined[name].__bases__ == (defined[base],), (name, base)


def test_every_class_name_the_docs_use_exists() -> None:
    """Each CamelCase name in a code span of the README's and docs/' prose (`ConflictingAnswer`,
    `TerminalTextChannel`) is a class or type the package defines, or one of the few outside
    names the docs mention, so a misspelt exception is not caught by an `except` that never
    matches."""
    source = "".join(p.read_text() for p in (ROOT / "src" / "signoff").rglob("*.py"))
    defined = set(re.findall(r"^\s*class (\w+)", source, re.M))
    defined |= set(re.findall(r"^([A-Z]\w*)(?: *:[^=\n]*)? *=", source, re.M))  # type aliases
    outside = {"ValidationError", "KeyboardInterrupt", "SystemExit", "EventSource"}
    outside |= {"HttpOnly", "SameSite"}  # cookie attributes
    checked = 0
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
        for name in set(re.findall(r"`([A-Z][a-z0-9]+[A-Z][a-z]\w*)\b[^`]*`", prose)):
            assert name in defined | outside, (doc, name)
            checked += 1
    assert checked >= 40, checked


def test_every_environment_variable_the_cli_reads_is_documented() -> None:
    """An option the CLI also reads from the environment (`SIGNOFF_STORE`, `SIGNOFF_TOKENS`)
    is named in the README or docs/, so a variable left exported is not a surprise."""
    import typer.main

    from signoff.cli import app

    docs = "".join((ROOT / doc).read_text() for doc in DOCS)
    read: set[str] = set()

    def collect(command: Any) -> None:
        read.update(p.envvar for p in command.params if isinstance(p.envvar, str))
        for sub in getattr(command, "commands", {}).values():
            collect(sub)

    collect(typer.main.get_command(app))
    assert len(read) >= 5 and {v for v in read if f"`{v}`" not in docs} == set()


def test_the_server_extra_is_what_the_server_checks_for() -> None:
    """`pip install 'signoff[server]'` installs the packages whose absence the server names."""
    import tomllib

    from signoff.server._extra import SERVER_EXTRA

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = {re.split(r"[<>=\[ ]", dep)[0] for dep in extras["server"]}
    assert named == set(SERVER_EXTRA)


def test_every_option_of_the_cli_is_documented() -> None:
    """Each `--option` some command takes is named in the README or docs/, so the docs are
    where a user finds what the command line can do, not only `--help`."""
    import typer.main

    from signoff.cli import app

    docs = "".join((ROOT / doc).read_text() for doc in DOCS)
    missing: list[str] = []

    def collect(command: Any, path: str) -> None:
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and not re.search(rf"{opt}(?![\w-])", docs):
                    missing.append(f"{path} {opt}")
        for name, sub in getattr(command, "commands", {}).items():
            collect(sub, f"{path} {name}")

    collect(typer.main.get_command(app), "signoff")
    assert missing == []


def test_the_defaults_the_docs_state_are_the_code_s() -> None:
    """Each default the docs state in numbers is the one the code has, so a changed default
    fails here, naming the sentence to update."""
    import inspect

    import signoff as so
    from signoff import _idempotency, stores
    from signoff.channels import WebhookChannel, verify_webhook
    from signoff.server import AsyncClient, Client, create_app
    from signoff.server._serve import DEFAULT_WORKERS
    from signoff.stores._prompt import REQUEST_WAIT
    from signoff.stores.postgres._borrowed import OPERATION_TIMEOUT
    from signoff.stores.postgres._outage import GRACE

    def d(fn: Any, name: str) -> Any:
        return inspect.signature(fn).parameters[name].default

    mib, readme, server = 1 << 20, "README.md", "docs/server.md"
    stated = [
        (readme, "`Limits(max_result_bytes=)` (1 MiB", d(so.Limits, "max_result_bytes"), mib),
        (readme, "`Limits(max_response_bytes=)` (1 MiB)", d(so.Limits, "max_response_bytes"), mib),
        (readme, "`so.MAX_TEXT_BYTES` (4 MiB", so.MAX_TEXT_BYTES, 4 * mib),
        (readme, "`signoff.stores.READ_BYTES` (4 MiB)", stores.READ_BYTES, 4 * mib),
        (readme, "a session remembers its last 32 keys", _idempotency.KEPT, 32),
        (readme, "`?outage_grace=` seconds of an outage (10 by default)", GRACE, 10),
        (readme, "`?operation_timeout=` seconds (30 by default", OPERATION_TIMEOUT, 30),
        (readme, "`?request_pool_timeout=` seconds (3 by default)", REQUEST_WAIT, 3),
        (readme, "`Runtime(lease_ttl=…)`, 30 s by default)", d(so.Runtime, "lease_ttl"), 30),
        (readme, "`expiring_within` seconds (300 by", d(WebhookChannel, "expiring_within"), 300),
        (readme, "the age (300 s by default)", d(verify_webhook, "tolerance"), 300),
        (server, "(`--workers N`, 4 by default;", DEFAULT_WORKERS, 4),
        (server, "`create_app(workers=N)`, 0 by default)", d(create_app, "workers"), 0),
        (server, "(max_body_size=...)`, 4 MiB by default", d(create_app, "max_body_size"), 4 * mib),
        (server, "12 hours by default", d(create_app, "sign_in_lifetime"), 12 * 3600),
        (server, "the server's `heartbeat` (15 s)", d(create_app, "heartbeat"), 15),
        (server, "`timeout`, 60 s by default", d(Client, "timeout"), 60),
        (server, "`timeout`, 60 s by default", d(AsyncClient, "timeout"), 60),
        (server, "`retries` failures in a row (5 by default", d(AsyncClient.events, "retries"), 5),
    ]
    for model in (so.models.OpenAIChat, so.models.Anthropic):
        stated += [
            (readme, "(`max_retries=2`)", d(model, "max_retries"), 2),
            (readme, "`timeout=120`", d(model, "timeout"), 120),
            (readme, "`max_reply_bytes` (16 MiB", d(model, "max_reply_bytes"), 16 * mib),
        ]
    texts = {doc: " ".join((ROOT / doc).read_text().split()) for doc in DOCS}
    for doc, sentence, actual, documented in stated:
        assert sentence in texts[doc], (doc, sentence)
        assert actual == documented, (doc, sentence, actual)
    assert f"`SIGNOFF_STORE` (default `{stores.DEFAULT_URL}`)" in texts[readme]


def test_every_event_type_the_docs_name_is_one_signoff_writes() -> None:
    """Each `session.*`, `turn.*`, `model.*`, `tool.*`, `input.*` and `approval.*` the docs name
    is an event type of the log, and each `request.*` a webhook event or a request's field, so
    a consumer filtering on a documented type gets events."""
    import signoff as so
    from signoff._events import EVENT_TYPES

    webhooks = (ROOT / "src/signoff/channels/webhooks.py").read_text()
    sent = set(re.findall(r"enqueue\(\"(request\.\w+)\"", webhooks))
    fields = {f"request.{name}" for name in so.InputRequest.model_fields}
    assert {"request.opened", "request.escalated", "request.resolved", "request.expiring"} <= sent
    named: set[str] = set()
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        kinds = "session|turn|model|tool|input|approval|request"
        named |= set(re.findall(rf"`((?:{kinds})\.\w+)`", text))
    events = {n for n in named if not n.startswith("request.")}
    assert len(events) >= 8 and events - EVENT_TYPES == set(), sorted(events - EVENT_TYPES)
    requests = named - events
    assert requests - sent - fields == set(), sorted(requests - sent - fields)


def test_the_queue_s_filters_are_the_ones_the_api_takes(tmp_path: Path) -> None:
    """docs/server.md names the values `GET /v1/requests` takes for `kind` and `status`, its
    default status and its page size, as the OpenAPI document has them."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    params = {
        p["name"]: p["schema"]
        for p in create_app(rt, dev=True).openapi()["paths"]["/v1/requests"]["get"]["parameters"]
    }
    text = " ".join(blocks_text("server").split())
    said = re.search(r"filters by `kind` \((.*?)\) and `status` \((.*?)\),", text)
    assert said, "the sentence on GET /v1/requests' filters is gone"
    kinds = re.findall(r"`([a-z-]+)`", said.group(1))
    statuses = re.findall(r"`([a-z-]+)`", said.group(2))
    assert kinds == params["kind"]["anyOf"][0]["enum"]
    assert statuses == params["status"]["enum"] and params["status"]["default"] == "pending"
    assert "`pending` by default" in said.group(2)
    limit = params["limit"]
    assert f"`limit` (1 to {limit['maximum']}, {limit['default']} by default)" in text


def test_every_gen_ai_attribute_the_tracing_docs_name_is_one_signoff_sets() -> None:
    """The `gen_ai.*` span attributes docs/tracing.md lists are ones the tracing code sets (the
    `signoff.*` ones are checked with the other names above)."""
    source = (ROOT / "src" / "signoff" / "_tracing.py").read_text()
    set_ = set(re.findall(r"\"(gen_ai\.[a-z_.]+)\"", source))
    named = set(re.findall(r"`(gen_ai\.[a-z_.]+)`", blocks_text("tracing")))
    assert len(named) >= 10 and named - set_ == set(), sorted(named - set_)


def test_the_api_table_s_bodies_are_the_request_schemas(tmp_path: Path) -> None:
    """The body column of docs/server.md's API table names each field a POST takes, `?` on the
    optional ones, as the OpenAPI document's request schemas have them (a list's items too), so
    a body written from the table is not refused as an unknown or missing field."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    doc = create_app(rt, dev=True).openapi()
    schemas = doc["components"]["schemas"]

    def fields(schema: dict[str, Any]) -> set[str]:
        """`name` or `name?` for each property, with a list's items' as `name: [...]`."""
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        if "properties" not in schema:  # an optional body: `anyOf` it and null
            schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
            return fields(schema)
        required = set(schema.get("required", []))
        found = set()
        for name, prop in schema.get("properties", {}).items():
            found.add(name if name in required else f"{name}?")
            items = prop.get("items")
            if items is not None:
                found |= {f"{name}: {inner}" for inner in fields(items)}
        return found

    def said(body: str) -> set[str]:
        """The same, read from the table's `{agent, message?}` notation."""
        body = re.sub(r': "\w+"(?:, "\w+")*', "", body.strip("`{} "))  # a value's choices
        found = set()
        for name, items in re.findall(r"(\w+\??)(?:: \[\{(.*?)\}\])?(?:,|$)", body):
            found.add(name)
            if items:
                inner = re.findall(r"(\w+\??)", items)
                found |= {f"{name.rstrip('?')}: {i}" for i in inner}
        return found

    table = blocks_text("server").split("## API", 1)[1].split("\n\n", 2)[1]
    checked = 0
    row = re.compile(r"^\| `POST (/v1/[^`]+)` \| (`[^|]*?(?:\\\|[^|]*?)*`)", re.M)
    for path, body in row.findall(table):
        schema = doc["paths"][path.replace("{id}", "{session_id}")]["post"]["requestBody"]
        documented = said(body.replace("\\|", "|").replace(" | ", ", "))
        actual = fields(schema["content"]["application/json"]["schema"])
        # a field either of two (`optionId | text`) is optional in the schema, required in words
        assert {f.rstrip("?") for f in documented} == {f.rstrip("?") for f in actual}, (
            path,
            sorted(documented),
            sorted(actual),
        )
        checked += 1
    assert checked == 5, checked


def test_the_api_table_s_response_shapes_are_the_response_schemas(tmp_path: Path) -> None:
    """A response shape the API table gives (`{items, total, limit, offset}`) names every key
    of that route's OpenAPI response schema and no other, so a client written from it reads
    the body it gets."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    doc = create_app(rt, dev=True).openapi()
    schemas = doc["components"]["schemas"]
    table = blocks_text("server").split("## API", 1)[1].split("\n\n", 2)[1]
    row = re.compile(r"^\| `GET (/v1/[^`]+)` \|[^|]*\| [^|]*?`\{([\w, ]+)\}`", re.M)
    checked = 0
    for path, shape in row.findall(table):
        route = path.replace("/requests/{id}", "/requests/{request_id}")
        responses = doc["paths"][route.replace("{id}", "{session_id}")]["get"]["responses"]
        ref = responses["200"]["content"]["application/json"]["schema"]["$ref"]
        properties = schemas[ref.rsplit("/", 1)[1]]["properties"]
        assert shape.split(", ") == list(properties), (path, shape, list(properties))
        checked += 1
    assert checked == 3, checked

"""The README's examples run as written, so the documentation cannot silently rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
    named = {m for p in texts for m in re.findall(r"signoff\[([a-z]+)\]", p.read_text())}
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

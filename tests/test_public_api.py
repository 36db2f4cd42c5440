"""The curated public names of `signoff`."""

from pathlib import Path

import signoff as so


def test_public_names_are_exported_and_exist() -> None:
    for name in so.__all__:
        assert hasattr(so, name), name


def test_the_lazy_exports_are_the_public_names() -> None:
    """`signoff/__init__.py` lists the names it loads lazily from `_exports`: a name added to one
    list and not the other would be unexported, or fail on first use."""
    from signoff import _exports

    lazy_elsewhere = {"__version__", "AsyncClient", "Client", "LiveSession"}
    assert set(_exports.__all__) == set(so.__all__) - lazy_elsewhere
    assert len(_exports.__all__) == len(set(_exports.__all__))


def test_core_names_present() -> None:
    expected = {
        "Agent",
        "Runtime",
        "tool",
        "Tool",
        "ToolContext",
        "ApprovalRequired",
        "ApprovalContext",
        "never",
        "once",
        "always",
        "tool_policy",
        "Approved",
        "Denied",
        "Decision",
        "InputResponse",
        "InputRequest",
        "Principal",
        "Limits",
        "ModelResponse",
        "ToolCall",
        "SignoffError",
        "UsageError",
        "UnknownRequest",
        "PartialAnswer",
        "ConflictingAnswer",
        "EventsRewritten",
        "RequestClosed",
        "NotAllowed",
        "SessionExpired",
        "SessionLimitReached",
        "SessionWaiting",
        "SessionDeleted",
        "SubagentSession",
        "SubagentOrphaned",
        "ModelError",
        "RemoteError",
        "StoreError",
        "StoreDamaged",
        "SchemaVersionError",
    }
    assert expected <= set(so.__all__)


def test_errors_share_one_base_and_usage_is_apart() -> None:
    for name in ("UnknownRequest", "PartialAnswer", "ConflictingAnswer", "StoreError"):
        err = getattr(so, name)
        assert issubclass(err, so.SignoffError)
        assert not issubclass(err, so.UsageError)
    assert issubclass(so.UsageError, so.SignoffError)
    assert not issubclass(so.ApprovalRequired, so.SignoffError)


def test_the_http_client_is_importable_lazily_from_the_top() -> None:
    import subprocess
    import sys

    code = (
        "import sys, signoff as so; assert 'fastapi' not in sys.modules; "
        "assert so.Client.__name__ == 'Client' and so.AsyncClient.__name__ == 'AsyncClient'; "
        "assert 'fastapi' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_type_checkers_see_the_lazy_client_classes_and_no_catch_all() -> None:
    """The lazy `so.Client` is typed as the class itself, and a misspelt name is an error to
    mypy rather than an `object` (mypy checks this file: were `__getattr__` visible to it, the
    `type: ignore` below would be unused, which strict mode reports)."""
    import pytest

    client: so.Client = so.Client("http://127.0.0.1:9", token="t")
    live: type[so.LiveSession] = so.LiveSession
    client.close()
    assert isinstance(client, so.Client) and live.__name__ == "LiveSession"
    with pytest.raises(AttributeError, match="no attribute 'Clinet'"):
        so.Clinet  # type: ignore[attr-defined]  # noqa: B018


def test_every_runtime_call_has_a_sync_twin() -> None:
    # README: every async method has a `*_sync` twin, but `work` (a worker's loop) and `open`
    # (done by the first call).
    import inspect

    calls = {
        name
        for name, fn in _attributes(so.Runtime)
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn))
    }
    missing = sorted(c for c in calls - {"work", "open"} if not hasattr(so.Runtime, f"{c}_sync"))
    assert missing == []


def test_each_sync_twin_takes_what_its_async_method_takes_and_says_what_it_does() -> None:
    # A twin of `*args, **kwargs` let a misspelt argument pass the type checker and `help()`.
    import inspect

    for name in dir(so.Runtime):
        if not name.endswith("_sync") or name == "events_sync":
            continue
        twin, method = getattr(so.Runtime, name), getattr(so.Runtime, name.removesuffix("_sync"))
        assert inspect.signature(twin) == inspect.signature(method), name
        assert twin.__name__ == name
        doc = inspect.getdoc(method)
        assert doc and doc in (inspect.getdoc(twin) or ""), name


def _attributes(cls: type) -> set[tuple[str, object]]:
    """The names and values `cls` has, its own and its bases'."""
    # Dunders left out: a class's `__annotations__` is a dict, which a set cannot hold (and the
    # class itself has one once something read it: `help()`, say).
    return {(n, f) for base in cls.__mro__ for n, f in vars(base).items() if not n.startswith("__")}


def test_the_audit_and_session_twins_answer_like_their_async_methods(tmp_path) -> None:
    import io

    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    try:
        r = rt.generate_sync("a", prompt="hello")
        [summary] = rt.sessions_sync(agent="a")
        assert summary.id == r.session_id
        assert rt.verify_audit_sync() == []
        entries = rt.audit_sync(r.session_id)
        out = io.StringIO()
        assert rt.export_audit_sync(out, r.session_id) == len(entries)
    finally:
        rt.close_sync()


def test_close_sync_gives_back_a_lease_the_store_refused_as_close_does(tmp_path) -> None:
    """`close_sync` is `close`, blocking: it also gives back a drive's lease that the store
    refused to release, so another process need not wait out the lease's TTL."""
    import asyncio
    import time

    from signoff.stores import SQLiteStore

    class RefusesOnce(SQLiteStore):
        refuse = False

        async def release_lease(self, session_id: str, owner: str, token: int) -> None:
            if self.refuse:
                self.refuse = False
                raise so.StoreUnavailable("down for a moment")
            await super().release_lease(session_id, owner, token)

    url = f"sqlite:///{tmp_path}/s.db"
    store = RefusesOnce(url)
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    rt = so.Runtime([agent], store=store)
    sid = rt.generate_sync("a", prompt="hello").session_id
    store.refuse = True
    import pytest

    with pytest.raises(so.StoreUnavailable):
        rt.generate_sync(session_id=sid)  # a drive with nothing to do: its release is refused
    rt.close_sync()

    async def taken_at_once() -> bool:
        other = SQLiteStore(url)
        await other.open()
        try:
            return await other.acquire_lease(sid, "elsewhere", 30, time.time()) is not None
        finally:
            await other.close()

    assert asyncio.run(taken_at_once())


def _public_members(cls: type) -> list[tuple[str, object]]:
    out = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name == "model_config":
            continue
        if isinstance(value, property | staticmethod | classmethod) or callable(value):
            out.append((name, value))
    return out


def test_every_public_object_says_what_it_is() -> None:
    """Every public class and function, and every public method and property of a public class,
    of `signoff`, `signoff.models`, `signoff.channels`, `signoff.channels.slack`,
    `signoff.stores` and `signoff.testing` has a docstring (its own, or the one it overrides);
    a dataclass's generated signature is not one."""
    import dataclasses
    import inspect

    import signoff.channels
    import signoff.channels.slack
    import signoff.testing

    missing = []
    modules = (so, so.models, signoff.channels, signoff.channels.slack, so.stores, signoff.testing)
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            generated = dataclasses.is_dataclass(obj) and str(obj.__doc__).startswith(f"{name}(")
            if not obj.__doc__ or generated:
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(obj):
                continue
            for member, value in _public_members(obj):
                doc = value.__doc__ if isinstance(value, property) else None
                doc = doc or inspect.getdoc(getattr(obj, member))
                if not doc:
                    missing.append(f"{module.__name__}.{name}.{member}")
    assert missing == []


def _waiting_runtime(tmp_path: Path) -> tuple[so.Runtime, str, str]:
    """A runtime with one session waiting on the approval of a refund."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    call = so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input={"order_id": "1"})])
    model = so.models.Scripted([call, so.ModelResponse(text="done")], repeat_last=True)
    rt = so.Runtime([so.Agent(name="a", model=model, tools=[refund])], f"sqlite:///{tmp_path}/s.db")
    r = rt.generate_sync("a", prompt="refund order 1")
    assert r.status == "waiting"
    return rt, r.session_id, r.pending[0].id


def test_a_principal_that_is_not_one_is_a_usage_error_and_changes_nothing(tmp_path) -> None:
    """Every call that takes who acts (`auth`, `principal`) refuses a name or a dict by name,
    before it records anything, the same from the async method and its twin."""
    from typing import Any

    import pytest

    rt, sid, rid = _waiting_runtime(tmp_path)
    approve = [so.InputResponse(request_id=rid, option_id="approve")]
    decide = [so.Decision(id=rid, approved=True)]
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("generate", ("a", "hello"), {"auth": "alice"}),
        ("generate", (), {"session_id": sid, "approvals": decide, "auth": {}}),
        ("create_session", ("a",), {"auth": "alice"}),
        ("send", (sid, "hello"), {"principal": "alice"}),
        ("respond", (sid, approve), {"principal": "bob"}),
        ("cancel", (sid,), {"principal": "bob"}),
    ]

    async def call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
        return await getattr(rt, name)(*args, **kwargs)

    try:
        before = (len(rt.sessions_sync()), rt.state_sync(sid).seq)
        for name, args, kwargs in calls:
            [(key, wrong)] = [(k, v) for k, v in kwargs.items() if k in ("auth", "principal")]
            match = f"{key} must be a so.Principal, not {type(wrong).__name__}"
            with pytest.raises(so.UsageError, match=match):
                getattr(rt, f"{name}_sync")(*args, **kwargs)
            with pytest.raises(so.UsageError, match=match):
                rt._sync.run(call(name, args, kwargs))
            assert (len(rt.sessions_sync()), rt.state_sync(sid).seq) == before, name
    finally:
        rt.close_sync()


def test_flags_that_are_not_booleans_are_usage_errors(tmp_path) -> None:
    """`respond(resume="no")` resumed the turn (a non-empty string is true): a flag must be a
    bool, and a refused call records nothing."""
    import pytest

    rt, sid, rid = _waiting_runtime(tmp_path)
    try:
        seq = rt.state_sync(sid).seq
        approve = [so.InputResponse(request_id=rid, option_id="approve")]
        with pytest.raises(so.UsageError, match="resume must be True or False, not 'no'"):
            rt.respond_sync(sid, approve, resume="no")  # type: ignore[arg-type]
        assert rt.state_sync(sid).seq == seq

        async def follow() -> None:
            async for _ in rt.events(sid, follow="no"):  # type: ignore[arg-type]
                pass

        with pytest.raises(so.UsageError, match="follow must be True or False, not 'no'"):
            rt._sync.run(follow())
        assert rt.respond_sync(sid, approve, resume=False).status == "running"
    finally:
        rt.close_sync()


def test_a_guardrail_of_ones_own_returns_the_exported_verdict(tmp_path) -> None:
    """`Guardrail.decide` returns a `Verdict`, which `signoff` exports (before, only
    `signoff._approval` had it): a guardrail written from the public names denies a call."""
    import typing

    assert "Verdict" in so.__all__
    hints = typing.get_type_hints(so.Guardrail.decide)
    assert so.Verdict in typing.get_args(hints["return"])

    class NoRefundsOnSunday(so.Guardrail):
        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            return so.Verdict("deny", "no refunds on Sunday") if ctx.tool_name == "refund" else None

    @so.tool
    async def refund(charge_id: str) -> str:
        """Refund a charge."""
        raise AssertionError("a denied call ran")

    proposal = so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input={"charge_id": "a"})])
    agent = so.Agent(
        name="a",
        model=so.models.Scripted([proposal, so.ModelResponse(text="denied")]),
        tools=[refund],
        guardrails=[NoRefundsOnSunday()],
    )
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    try:
        r = rt.generate_sync("a", prompt="refund a")
        assert r.status == "completed"
        [result] = [m for m in rt.state_sync(r.session_id).messages or [] if m.kind == "tool"]
        assert result.is_error and "no refunds on Sunday" in str(result.content)
    finally:
        rt.close_sync()


def test_the_status_and_kind_literals_are_public() -> None:
    """The values a session, a turn or a request takes (`SessionSummary.status`,
    `SessionState.turn_status`, `InputRequest.kind`, `PendingFilter.status`) are exported as
    the Literal types the signatures use, so a caller's own annotations say the same."""
    from typing import get_args

    import signoff._state_parts as parts
    import signoff._types as types

    assert get_args(so.SessionStatus) == ("idle", "running", "waiting", "failed", "cancelled")
    assert get_args(so.TurnStatus) == ("running", "waiting", "completed", "failed", "cancelled")
    assert get_args(so.RequestKind) == ("tool-approval", "question", "session-limit")
    assert get_args(so.RequestStatus) == ("pending", "settled", "expired", "withdrawn")
    assert so.SessionStatus is types.SessionStatus and so.TurnStatus is parts.TurnStatus

"""`signoff.testing`, the helpers users write their own tests with: each does what it says."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, SecretStr

import signoff as so
from signoff import testing
from signoff.stores import PendingFilter
from signoff.testing import (
    Capture,
    ExecutionLog,
    Flaky,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
)

from .test_server_common import ALICE, make_agents


def test_every_exported_helper_exists_and_says_what_it_does() -> None:
    for name in testing.__all__:
        helper = getattr(testing, name)
        assert (helper.__doc__ or "").strip(), name


def test_the_module_docstring_example_runs(tmp_path: Path) -> None:
    """The example at the top of `signoff.testing`, driven to its assertion."""
    source = (testing.__doc__ or "").split("\n\n", 1)[1]
    setup, check = source.split("...\n")
    namespace: dict[str, Any] = {"so": so, **{n: getattr(testing, n) for n in testing.__all__}}
    exec(setup, namespace)
    rt = sqlite_runtime(tmp_path, namespace["agent"])
    try:
        r = rt.generate_sync("support", prompt="refund order 1")
        (request,) = r.pending
        answer = so.InputResponse(request_id=request.id, option_id="approve")
        assert rt.respond_sync(r.session_id, [answer]).status == "completed"
    finally:
        rt.close_sync()
    exec(check, namespace)


@pytest.mark.parametrize(
    "seconds",
    [-1.0, math.nan, math.inf, "5", None, 10**400],  # text, None or 10**400: a TypeError or
    ids=["back", "nan", "inf", "text", "none", "huge"],  # an OverflowError
)
def test_a_manual_clock_only_moves_forward(seconds: float) -> None:
    """Backwards or to NaN it made deadlines and leases meaningless (NaN: AppendConflict)."""
    clock = ManualClock(1000.0)
    with pytest.raises(so.UsageError, match="seconds"):
        clock.advance(seconds)
    assert clock() == 1000.0
    assert clock.advance(0) == 1000.0 and clock.advance(2.5) == 1002.5


def test_a_manual_clock_never_reaches_inf() -> None:
    """Two finite numbers added up to inf: the runtime then refused every reading of the clock
    (`async with` left the store open)."""
    clock = ManualClock(1e308)
    with pytest.raises(so.UsageError, match="largest time"):
        clock.advance(1e308)
    assert clock() == 1e308


def test_a_manual_clock_starts_at_a_finite_time() -> None:
    for start in (math.nan, "1700000000", None):  # text or None was a bare TypeError
        with pytest.raises(so.UsageError, match="start"):
            ManualClock(start)  # type: ignore[arg-type]


@pytest.mark.parametrize("make", [Capture, Flaky])
def test_capture_and_flaky_refuse_what_cannot_answer(make: Any) -> None:
    """`Capture("Done.")` failed the turn later with "'str' object is not callable"."""
    with pytest.raises(so.UsageError, match="ModelResponse"):
        make("Done.")


NO_CONVERSATION: Any = lambda: reply("x")  # noqa: E731
TWO_ARGUMENTS: Any = lambda a, b: reply("x")  # noqa: E731


def as_any(value: object) -> Any:
    return value


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Capture(NO_CONVERSATION), "Capture"),
        (lambda: Flaky(TWO_ARGUMENTS), "Flaky"),
        (lambda: Flaky(reply("x"), failures=as_any("2")), "failures"),
        (lambda: Flaky(reply("x"), failures=-1), "failures"),
        (lambda: Flaky(reply("x"), failures=True), "failures"),
        (lambda: Flaky(reply("x"), error=as_any("boom")), "error"),
        (lambda: Flaky(reply("x"), error=as_any(KeyboardInterrupt())), "error"),
    ],
    ids=["capture-arity", "flaky-arity", "text", "negative", "bool", "error-text", "base"],
)
def test_capture_and_flaky_refuse_a_mistake_when_made(make: Any, named: str) -> None:
    """Each was taken, then failed the turn at the model call with a bare TypeError (`'<=' not
    supported`, `exceptions must derive from BaseException`, `takes 0 positional arguments`),
    or (a KeyboardInterrupt) broke out of the runtime."""
    with pytest.raises(so.UsageError, match=named):
        make()


def test_flaky_raises_an_exception_class_it_is_given(tmp_path: Path) -> None:
    flaky = Flaky(reply("back"), failures=1, error=TimeoutError)
    with sqlite_runtime(tmp_path, scripted_agent("a", [flaky])) as rt:
        r = rt.generate_sync("a", prompt="x")
        assert (r.status, (r.error or {}).get("message")) == ("failed", "TimeoutError: ")
        assert rt.generate_sync(session_id=r.session_id).text == "back"


class _NeedsAMessage(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)


@pytest.mark.parametrize("error", [_NeedsAMessage, UnicodeDecodeError, so.SessionBusy])
def test_flaky_refuses_an_exception_class_it_cannot_make(error: type[Exception]) -> None:
    """Taken, each failed the turn mid-run with a `TypeError` (missing arguments) instead of
    the error the test meant to play; an instance of it is what to give."""
    with pytest.raises(so.UsageError, match=f"{error.__name__} cannot be made without arguments"):
        Flaky(reply("x"), error=error)


async def test_capture_records_each_conversation_and_answers_each_session(tmp_path: Path) -> None:
    seen = Capture(lambda conversation: reply(f"{len(conversation)} message(s)"))
    async with sqlite_runtime(tmp_path, scripted_agent("a", [seen])) as rt:
        for prompt in ("one", "two"):
            r = await rt.generate("a", prompt=prompt)
            assert r.status == "completed"
    assert len(seen.conversations) == 2
    assert seen.last == [so.UserMessage(text="two")]


def test_capture_last_fails_clearly_before_any_call() -> None:
    with pytest.raises(AssertionError, match="never called"):
        assert Capture().last


def test_an_execution_log_records_a_tool_the_app_already_made(tmp_path: Path) -> None:
    """An app's tools are already `@so.tool`s: `log.tool(tool)` copies one (its name, schema and
    approval kept) and records its runs, where it used to refuse it as "not a function"."""

    @so.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        """Refund an order."""
        return {"refunded": amount}

    log = testing.ExecutionLog()
    recorded = log.tool(issue_refund)
    assert isinstance(recorded, testing.RecordingTool) and recorded.log is log
    assert recorded.name == "issue_refund" and recorded.description == "Refund an order."
    assert recorded.json_schema() == issue_refund.json_schema()
    steps = [
        testing.call_tools(testing.call("issue_refund", order_id="1", amount=500)),
        reply("ok"),
    ]
    rt = sqlite_runtime(tmp_path, scripted_agent("shop", steps, tools=[recorded]))
    try:
        r = rt.generate_sync("shop", prompt="refund order 1")
        assert [p.tool_name for p in r.pending] == ["issue_refund"]  # its approval kept
        assert log.count("issue_refund") == 0
        approve = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
        assert rt.respond_sync(r.session_id, [approve]).status == "completed"
    finally:
        rt.close_sync()
    assert [e.input for e in log.of("issue_refund")] == [{"order_id": "1", "amount": 500.0}]

    class Custom(so.Tool):  # its own invoke, which a copy would not run as it is
        pass

    with pytest.raises(so.UsageError, match="not a Custom"):
        log.tool(Custom(issue_refund.fn))


@pytest.mark.parametrize("made", [False, True])
@pytest.mark.parametrize(
    "option",
    [
        {"approval": so.never()},
        {"name": "refund"},
        {"description": "Refund."},
        {"run_as": "agent"},
        {"max_result_bytes": 100},
    ],
)
def test_an_execution_log_refuses_options_it_would_drop(made: bool, option: dict[str, Any]) -> None:
    """`log.tool(f, approval=so.never())` made a tool that still asked for approval (or kept its
    name, description or `run_as`): the options were dropped unsaid. They are refused, naming
    the form that takes them."""

    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    log = testing.ExecutionLog()
    fn: Any = so.tool(approval=so.always())(issue_refund) if made else issue_refund
    with pytest.raises(so.UsageError, match=r"@log\.tool\(") as refused:
        log.tool(fn, **option)
    assert next(iter(option)) in str(refused.value)


def test_log_tool_takes_every_option_so_tool_does() -> None:
    """`@log.tool(...)` "makes one as `@so.tool` does", but `max_result_bytes=` was a
    TypeError: its options are `so.tool`'s, each kept on the tool it makes."""
    import inspect

    def options(fn: Any) -> dict[str, Any]:
        params = inspect.signature(fn).parameters.values()
        return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}

    assert options(testing.ExecutionLog().tool) == options(so.tool)

    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    made = testing.ExecutionLog().tool(max_result_bytes=100, run_as="approver")(issue_refund)
    assert (made.max_result_bytes, made.run_as) == (100, "approver")
    with pytest.raises(so.UsageError, match="max_result_bytes"):
        testing.ExecutionLog().tool(max_result_bytes=0)(issue_refund)


@pytest.mark.parametrize("on_file", [False, True])
def test_an_execution_log_tells_a_workflow_tools_replay_from_its_first_run(
    tmp_path: Path, on_file: bool
) -> None:
    """A workflow tool's body runs again over its journal once its question is answered (its
    step returning the recorded result): `count()` said 2 where the call ran once, against its
    "1 proves exactly-once". Each execution says whether it replayed; `replays=False` counts
    first runs only."""
    log = testing.ExecutionLog(tmp_path / "runs.jsonl" if on_file else None)
    charged: list[str] = []

    @log.tool
    async def checkout(ctx: so.ToolContext, cart: str) -> str:
        """Charge the cart, then ask how to ship it."""

        async def charge() -> str:
            charged.append(cart)
            return "ch_1"

        charge_id = await ctx.step("charge", charge)
        shipping = await ctx.ask("Ship express?", options=["yes", "no"])
        return f"{charge_id} {shipping.text}"

    steps = [testing.call_tools(testing.call("checkout", cart="c1")), reply("done")]
    with sqlite_runtime(tmp_path, scripted_agent("shop", steps, tools=[checkout])) as rt:
        r = rt.generate_sync("shop", prompt="buy")
        assert (log.count(), log.count(replays=False)) == (1, 1)
        answer = so.InputResponse(request_id=r.pending[0].id, option_id="yes")
        assert rt.respond_sync(r.session_id, [answer]).status == "completed"
    assert charged == ["c1"]
    assert [e.replay for e in log.of("checkout")] == [False, True]
    assert (log.count("checkout"), log.count("checkout", replays=False)) == (2, 1)
    assert log.of("checkout", replays=False) == log.executions[:1]
    assert log.keys("checkout", replays=False) == [log.executions[0].idempotency_key]


@pytest.mark.parametrize(
    ("spent", "limits", "budget"),
    [
        (so.Usage(input_tokens=600, output_tokens=500), so.Limits(max_tokens=1000), "max_tokens"),
        (so.Usage(cost_usd=1.5), so.Limits(max_cost_usd=1.0), "max_cost_usd"),
    ],
)
def test_a_scripted_responses_usage_counts_toward_the_budgets(
    tmp_path: Path, spent: so.Usage, limits: so.Limits, budget: str
) -> None:
    """As docs/testing.md says: budgets are tested by scripting what each response spent."""
    agent = scripted_agent("a", [reply("one", usage=spent), reply("two")], limits=limits)
    with sqlite_runtime(tmp_path, agent) as rt:
        r = rt.generate_sync("a", prompt="x")
        assert r.status == "completed"
        r = rt.generate_sync(session_id=r.session_id, prompt="more")
        assert [(p.kind, budget in (p.question or "")) for p in r.pending] == [
            ("session-limit", True)
        ]


@pytest.mark.parametrize(
    ("directory", "given", "named"),
    [
        (None, {"store": "sqlite:///other.db"}, "store"),  # was a bare TypeError
        ("sqlite:///{}/s.db", {}, "directory"),  # made ./sqlite:/.../s.db/state.db
        ("{}/file.txt", {}, "directory"),  # a file: sqlite3's "unable to open database file"
        (None, {"clock": ManualClock}, r"ManualClock\(\)"),  # the class: an AttributeError
    ],
    ids=["store", "url", "file", "clock-class"],
)
def test_sqlite_runtime_refuses_what_it_would_misuse(
    tmp_path: Path, directory: str | None, given: dict[str, Any], named: str
) -> None:
    (tmp_path / "file.txt").write_text("not a directory")
    where = tmp_path if directory is None else directory.format(tmp_path)
    with pytest.raises(so.UsageError, match=named):
        sqlite_runtime(where, scripted_agent("a", [reply("x")]), **given)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # no store was made


@pytest.mark.parametrize("directory", [None, 123], ids=["none", "int"])
def test_sqlite_runtime_refuses_a_directory_that_is_no_path(directory: Any) -> None:
    """Was a bare TypeError from `Path()`."""
    with pytest.raises(so.UsageError, match="directory to put state.db in"):
        sqlite_runtime(directory, scripted_agent("a", [reply("x")]))


def test_an_execution_log_refuses_what_is_no_file_path(tmp_path: Path) -> None:
    """A directory (or "", which is ".") was taken, and every call of its tools then failed
    before the body ran (`IsADirectoryError`, read by the model); another type was a bare
    TypeError. Each is refused where the log is made."""
    for given in (tmp_path, str(tmp_path), "", 123):
        with pytest.raises(so.UsageError, match="ExecutionLog takes the path of a file"):
            ExecutionLog(given)  # type: ignore[arg-type]
    assert ExecutionLog(tmp_path / "log.jsonl").path == tmp_path / "log.jsonl"


def test_an_execution_log_refuses_a_file_in_no_directory(tmp_path: Path) -> None:
    """A file whose directory did not exist was taken, and every call of its tools then failed
    before the body ran (`FileNotFoundError`, read by the model), so a count of 0 proved
    nothing. It is refused where the log is made; a file in an existing directory is not."""
    for given in (tmp_path / "logs" / "runs.jsonl", str(tmp_path / "a" / "b" / "runs.jsonl")):
        with pytest.raises(so.UsageError, match="in no existing directory: make"):
            ExecutionLog(given)
    (tmp_path / "logs").mkdir()
    log = ExecutionLog(tmp_path / "logs" / "runs.jsonl")
    log.record(
        testing.Execution(tool_name="t", session_id="s", call_id="c", idempotency_key="k", input={})
    )
    assert log.count("t") == 1


@pytest.mark.parametrize(
    "now",
    [datetime.now, lambda: "1700000000", lambda: math.nan, lambda: object()],
    ids=["datetime", "text", "nan", "object"],
)
def test_a_clock_that_returns_no_time_is_named_at_its_first_reading(
    tmp_path: Path, now: Any
) -> None:
    """A fake clock returning a datetime or text was a bare TypeError deep in the runtime; NaN
    was "session already exists" (a StoreError); an object an AttributeError from the store."""
    rt = sqlite_runtime(tmp_path, scripted_agent("a", [reply("x")]), clock=now)
    try:
        with pytest.raises(so.UsageError, match=r"clock returned .*not a time in seconds"):
            rt.generate_sync("a", prompt="x")
    finally:
        rt.close_sync()


def test_an_execution_log_file_with_a_line_it_cannot_read_names_the_file_and_line(
    tmp_path: Path,
) -> None:
    """A line with a key `Execution` does not know (a file some other signoff wrote, or not an
    execution log at all) was a bare `TypeError` from the dataclass, naming neither: it is a
    `UsageError` naming the file, the line and what is wrong. Unknown keys are not skipped:
    the log is written and read by one signoff, and counting what it cannot read would lie."""
    path = tmp_path / "runs.jsonl"
    log = testing.ExecutionLog(path)
    log.record(
        testing.Execution(tool_name="t", session_id="s", call_id="c", idempotency_key="k", input={})
    )
    good = path.read_bytes()
    for bad, says in (
        (b'{"tool_name": "t", "extra": 1}', "extra"),
        (b'["not", "an", "object"]', "object"),
        (b"{not json", "JSON"),
        (b'{"tool_name": "caf\xe9"}', "not UTF-8"),  # was a bare UnicodeDecodeError
    ):
        path.write_bytes(good + b"\n" + bad + b"\n")
        with pytest.raises(so.UsageError) as caught:
            log.count()
        message = str(caught.value)
        assert str(path) in message and "line 3" in message and says in message, message


async def test_store_contents_reads_every_request_page_by_page(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It asked the store for 10,000 requests at most, once, and said nothing of the rest: a
    store with more (or one giving shorter pages) was silently cut off. It reads page after page
    until the store has no more."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sids = [
            (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
            for _ in range(5)
        ]
        everything = await rt.store.pending(PendingFilter(limit=100))
        assert len(everything) >= 5
        real = rt.store.pending

        async def short_pages(flt: PendingFilter) -> list[so.InputRequest]:
            return (await real(flt))[:2]  # a store may give less than the limit it was asked

        monkeypatch.setattr(rt.store, "pending", short_pages)
        contents = await testing.store_contents(rt.store, sids[0])
    assert contents.pending == [r.id for r in everything]
    assert contents.requests == [(r.id, r.status) for r in everything if r.session_id == sids[0]]


async def test_store_contents_lists_each_request_once_when_a_cursors_session_is_deleted(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests of one moment past a page's last one whose session is deleted before the next
    page are listed again by the store (none skipped): the queue held them twice."""
    questions = [call("ask_question", call_id=f"q{i}", question=f"Q{i}?") for i in range(2)]
    agent = scripted_agent(
        "a", [call_tools(*questions), Capture(reply("ok"))], tools=[so.ask_question()]
    )
    async with so.Runtime([agent], store=store_url, clock=ManualClock()) as rt:
        sids = [(await rt.generate("a", prompt="go", auth=ALICE)).session_id for _ in range(3)]
        listed = await rt.store.pending(PendingFilter(limit=100))
        real = rt.store.pending

        async def deleting(flt: PendingFilter) -> list[so.InputRequest]:
            page = await real(flt)
            if flt.session_id is None and flt.after is None and page:  # the queue's first
                await rt.delete_session(page[-1].session_id, by=ALICE, force=True)
            return page

        monkeypatch.setattr(rt.store, "pending", deleting)
        contents = await testing.store_contents(rt.store, sids[0])
    assert contents.pending == [r.id for r in listed]


class _Handle:
    """An object with no JSON form, as a validator may make of an argument."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"handle {self.name}"


def test_an_execution_log_records_an_input_a_validator_made_an_object(
    tmp_path: Path,
) -> None:
    """A tool whose validator turns an argument into an object (a connection handle): the
    logged copy failed every call before its body ran, where the tool itself ran; a test of
    it checked another tool than production's. The input is recorded by the object's `str`,
    and a secret beside it stays masked."""
    log = testing.ExecutionLog(tmp_path / "runs.jsonl")

    @log.tool
    async def connect(target: Annotated[Any, AfterValidator(_Handle)], password: SecretStr) -> str:
        """Connect to a database."""
        assert isinstance(target, _Handle)
        return f"connected {target.name}"

    seen = Capture(reply("done"))
    proposed = testing.call_tools(testing.call("connect", target="db1", password="hunter2"))
    with sqlite_runtime(tmp_path, scripted_agent("ops", [proposed, seen], tools=[connect])) as rt:
        assert rt.generate_sync("ops", prompt="go").status == "completed"
    assert [m.content for m in testing.tool_results(seen.last)] == ["connected db1"]
    (execution,) = log.of("connect")
    assert execution.input == {"target": "handle db1", "password": "**********"}
    assert testing.ExecutionLog(tmp_path / "runs.jsonl").executions == [execution]


def test_call_gives_a_tool_its_id_input_and_takes_the_calls_own_as_call_id(
    tmp_path: Path,
) -> None:
    """`call("get_order", id="42")` took `id` as the call's id, so a tool with an `id`
    parameter could never be scripted: its call failed validation, and the turn went on. Every
    keyword but `call_id` is the tool's input now."""
    log = testing.ExecutionLog()

    @log.tool
    async def get_order(id: str) -> dict[str, str]:
        """Get an order."""
        return {"order": id}

    assert testing.call("get_order", id="42") == so.ToolCall(name="get_order", input={"id": "42"})
    proposed = testing.call("get_order", call_id="c1", id="42")
    assert proposed == so.ToolCall(name="get_order", input={"id": "42"}, id="c1")
    seen = Capture(reply("done"))
    agent = scripted_agent("shop", [testing.call_tools(proposed), seen], tools=[get_order])
    with sqlite_runtime(tmp_path, agent) as rt:
        assert rt.generate_sync("shop", prompt="order 42?").status == "completed"
    (result,) = testing.tool_results(seen.last)
    assert (result.call_id, result.content, result.is_error) == ("c1", {"order": "42"}, False)
    assert [e.input for e in log.of("get_order")] == [{"id": "42"}]


def test_an_execution_log_refuses_a_symlink_into_no_directory(tmp_path: Path) -> None:
    """A symlink, dangling, to a file in a directory that does not exist was taken (its own
    directory exists), and every call of its tools then failed before the body ran; so was a
    symlink loop. Each is refused where the log is made; a symlink to a file to be made in an
    existing directory is not."""
    dangling = tmp_path / "runs.jsonl"
    dangling.symlink_to(tmp_path / "gone" / "runs.jsonl")
    with pytest.raises(so.UsageError, match="in no existing directory: make .*gone"):
        ExecutionLog(dangling)
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(so.UsageError, match="symlink loop"):
        ExecutionLog(tmp_path / "a")
    (tmp_path / "gone").mkdir()
    log = ExecutionLog(dangling)
    log.record(
        testing.Execution(tool_name="t", session_id="s", call_id="c", idempotency_key="k", input={})
    )
    assert log.count("t") == 1 and (tmp_path / "gone" / "runs.jsonl").exists()


def test_clearing_an_execution_log_reached_through_a_symlink_clears_the_file(
    tmp_path: Path,
) -> None:
    """`clear()` deleted the link, not the log it names: the old executions stayed in the
    file, and the next record made a plain file where the link had been."""
    (tmp_path / "logs").mkdir()
    target = tmp_path / "logs" / "runs.jsonl"
    link = tmp_path / "runs.jsonl"
    link.symlink_to(target)
    log = ExecutionLog(link)
    one = testing.Execution(
        tool_name="t", session_id="s", call_id="c", idempotency_key="k", input={}
    )
    log.record(one)
    log.clear()
    assert link.is_symlink() and not target.exists() and log.count() == 0
    log.record(one)
    assert link.is_symlink() and target.exists() and log.count("t") == 1

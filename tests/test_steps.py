"""A journaled step that raised (`_steps`): what its failure records, and what replay raises."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import signoff as so
from signoff._steps import failure_of, raise_recorded
from signoff._tool_context import Journal
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


class Declined(Exception):
    """Builds its message from its argument: its args, given to it again, make another message."""

    def __init__(self, amount: object) -> None:
        super().__init__(f"declined {amount}")


def replayed(error: dict[str, object]) -> BaseException:
    """What replaying the step failure `error` raises, after a round trip through JSON."""
    with pytest.raises(Exception) as info:
        raise_recorded("charge", json.loads(json.dumps(error, allow_nan=False)))
    return info.value


def test_plain_arguments_are_kept_and_the_same_exception_is_raised_again() -> None:
    error = failure_of(ValueError("bad", 3, [1.5, None], {"k": True}))
    assert error["args"] == ["bad", 3, [1.5, None], {"k": True}]
    again = replayed(error)
    assert type(again) is ValueError and again.args == ("bad", 3, [1.5, None], {"k": True})


def test_an_exception_its_args_rebuild_with_another_message_replays_as_step_failed() -> None:
    """`Declined(5)` holds the args `("declined 5",)`: built from them it would say `declined
    declined 5`, so replay raises `StepFailed` with the message the step raised."""
    error = failure_of(Declined(5))
    assert error["args"] == ["declined 5"] and error["message"] == "declined 5"
    again = replayed(error)
    assert isinstance(again, so.StepFailed)
    assert again.error_type == f"{__name__}.Declined" and again.error_message == "declined 5"


@pytest.mark.parametrize(
    "arg",
    [object(), float("nan"), float("inf"), {1: "one"}, ("a", 1), b"x"],
    ids=["object", "nan", "inf", "int-key", "tuple", "bytes"],
)
def test_arguments_the_log_cannot_give_back_as_they_were_are_not_kept(arg: object) -> None:
    """Arguments JSON cannot hold, or gives back changed, are left out (the entry stays plain
    JSON, so the store takes it), and replay raises `StepFailed` with the message."""
    exc = ValueError(arg)
    error = failure_of(exc)
    assert error["args"] is None
    again = replayed(error)
    assert isinstance(again, so.StepFailed)
    assert again.error_type == "ValueError" and again.error_message == str(exc)


def _raised(fn: object, *args: object) -> Exception:
    with pytest.raises(Exception) as info:
        fn(*args)  # type: ignore[operator]
    assert isinstance(info.value, Exception)
    return info.value


@pytest.mark.parametrize(
    "exc",
    [
        _raised(open, "/nonexistent/signoff/quote.json"),
        _raised(json.loads, '{"fee": '),
        FileExistsError(17, "File exists", "a.txt", None, "b.txt"),
    ],
    ids=["file-not-found", "json-decode", "two-filenames"],
)
def test_an_exception_rebuilt_as_pickle_rebuilds_it_is_raised_again(exc: Exception) -> None:
    """An exception whose `args` leave out what its message says (the file of an `OSError`, the
    document of a `JSONDecodeError`) is kept with the arguments that build it again, as pickle
    takes them: a tool's `except FileNotFoundError:` takes the same path on replay, not a
    `StepFailed`."""
    again = replayed(failure_of(exc))
    assert type(again) is type(exc) and str(again) == str(exc)
    if isinstance(exc, OSError):
        assert isinstance(again, OSError)
        assert (again.errno, again.filename, again.filename2) == (
            exc.errno,
            exc.filename,
            exc.filename2,
        )


@pytest.mark.parametrize(
    "exc",
    [
        so.UnknownSession("ses_x"),
        so.SessionBusy("session 'ses_x' is busy", "ses_x"),
        so.SessionExpired("ses_x", ["req_1"]),
        so.UnknownRequest("ses_x", ["req_1"]),
        so.PartialAnswer("ses_x", ["req_1", "req_2"]),
        so.ConflictingAnswer("req_1 was approved", ["req_1"]),
        so.NotAllowed("request req_1: not yours", ["req_1"]),
        so.RemoteError("http://other:8000/v1/sessions: connection refused", "unreachable", 0),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_a_signoff_error_is_raised_again_as_itself_with_its_attributes(exc: Exception) -> None:
    """Most signoff errors take other arguments than the message their `args` hold, so
    `cls(*args)` failed or garbled the message and the replay raised `StepFailed` (a tool's
    `except so.RemoteError:` took another path), or rebuilt the class without its
    `request_ids`. They are rebuilt as pickle rebuilds them, attributes and all."""
    again = replayed(json.loads(json.dumps(failure_of(exc))))
    assert type(again) is type(exc) and str(again) == str(exc)
    assert vars(again) == vars(exc)


class HttpError(Exception):
    """An exception whose constructor keeps a keyword its `args` lack."""

    def __init__(self, message: str, *, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


def test_an_exceptions_attributes_come_back_as_pickle_restores_them() -> None:
    """Attributes set from keywords its `args` lack, or added (`add_note`), came back at their
    defaults: `status` 500 for 404, a CalledProcessError's output None; a tool's `except`
    took another path on replay. Those JSON cannot hold are left out."""
    http = HttpError("not found", status=404)
    http.add_note("while quoting")
    again = replayed(failure_of(http))
    assert type(again) is HttpError and again.status == 404
    assert again.__notes__ == ["while quoting"]
    ran = subprocess.CalledProcessError(3, ["quote"], output="partial\n", stderr="boom")
    again = replayed(failure_of(ran))
    assert isinstance(again, subprocess.CalledProcessError)
    assert (again.returncode, again.stdout, again.stderr) == (3, "partial\n", "boom")
    odd = HttpError("gone", status=410)
    odd.raw = b"\xff"  # type: ignore[attr-defined]
    again = replayed(failure_of(odd))
    assert isinstance(again, HttpError) and again.status == 410 and not hasattr(again, "raw")


def test_an_import_errors_name_and_path_come_back_as_pickle_restores_them() -> None:
    """An `ImportError`'s `name` and `path` are in its pickled state alone, not in its
    `__dict__`: they came back None, and a tool's `if exc.name == ...` took another path on
    replay. A journal written before keeps replaying, without them, as it did."""
    missing = ModuleNotFoundError("No module named 'plugin'", name="plugin")
    again = replayed(failure_of(missing))
    assert type(again) is ModuleNotFoundError and again.name == "plugin" and again.path is None
    broken = ImportError("cannot import name 'rates'", name="plugin", path="/opt/plugin.py")
    broken.add_note("while quoting")
    again = replayed(failure_of(broken))
    assert type(again) is ImportError and str(again) == str(broken)
    assert (again.name, again.path, again.__notes__) == (
        "plugin",
        "/opt/plugin.py",
        ["while quoting"],
    )
    older = {"module": "builtins", "type": "ModuleNotFoundError", "message": str(missing)}
    again = replayed({**older, "args": [str(missing)]})
    assert type(again) is ModuleNotFoundError and again.name is None


async def test_a_tool_branching_on_a_missing_modules_name_takes_the_same_path_on_replay(
    store_url: str,
) -> None:
    """A step importing an optional plugin raises `ModuleNotFoundError`: the tool tells a missing
    plugin (`exc.name`) from another failed import, live and after a restart alike."""
    imports: list[str] = []

    def load_plugin() -> object:
        imports.append("plugin")
        raise ModuleNotFoundError("No module named 'fancy_rates'", name="fancy_rates")

    @so.tool
    async def rates(ctx: so.ToolContext) -> str:
        """Rates from the optional plugin, else ask."""
        try:
            return str(await ctx.step("plugin", load_plugin))
        except ModuleNotFoundError as exc:
            why = "plugin missing" if exc.name == "fancy_rates" else f"import failed ({exc.name})"
            answer = await ctx.ask(f"{why}. Use the default rates?", options=["yes", "no"])
            return f"{why}: defaults {answer.value}"

    seen = Capture(reply("Done."))
    agent = scripted_agent("fx", [call_tools(call("rates")), seen], tools=[rates])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("fx", prompt="rates")
        assert [p.question for p in r.pending] == ["plugin missing. Use the default rates?"]
    async with so.Runtime([agent], store=store_url) as rt:  # a restart: the body replays
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "plugin missing: defaults yes")
    assert imports == ["plugin"]


async def test_a_tool_catching_a_missing_file_takes_the_same_path_on_replay(tmp_path: Path) -> None:
    """The body runs again once the question is answered: its step's `FileNotFoundError` is
    raised again as itself, so the tool's `except` takes it as on the first run."""
    reads: list[str] = []
    missing = tmp_path / "rates.json"

    def read_rates() -> str:
        reads.append("read")
        return missing.read_text()

    @so.tool
    async def rates(ctx: so.ToolContext) -> str:
        """Read the rates file, or ask what to use."""
        try:
            return str(await ctx.step("read", read_rates))
        except FileNotFoundError as exc:
            answer = await ctx.ask(f"{exc.filename} is missing. Use the defaults?", ["yes", "no"])
            return f"defaults: {answer.value}"

    seen = Capture(reply("Done."))
    agent = scripted_agent("fx", [call_tools(call("rates")), seen], tools=[rates])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("fx", prompt="rates")
        assert [p.question for p in r.pending] == [f"{missing} is missing. Use the defaults?"]
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "defaults: yes")
    assert reads == ["read"]


@pytest.mark.parametrize("error", [so.UsageError, so.StoreError])
async def test_a_step_raising_a_signoff_error_is_journaled_and_replays_after_a_restart(
    store_url: str, error: type[so.SignoffError]
) -> None:
    """A step's own failure is journaled whatever its class: one that raised `so.UsageError`
    (a signoff class its function used for a refusal of its own), or `so.StoreError` (its own
    code's, another store's or a signoff server's it called: not the journal's), is not run
    again after a restart, and its replay raises it again, so the tool that caught it takes the
    same path. A `StoreError` was not journaled: the invoice was sent again."""
    sent: list[str] = []

    def send_invoice(to: str) -> str:
        sent.append(to)
        raise error(f"invoice to {to} sent, but its receipt was refused")

    @so.tool
    async def invoice(ctx: so.ToolContext) -> dict[str, str]:
        """Send the invoice; if that raises, ask whether to go on."""
        try:
            return {"sent": str(await ctx.step("send", send_invoice, "acme"))}
        except error as exc:
            answer = await ctx.ask(f"{exc}. Go on?", options=["yes", "no"])
            return {"refused": str(exc), "go_on": answer.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent("billing", [call_tools(call("invoice")), seen], tools=[invoice])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="invoice acme")
        question = "invoice to acme sent, but its receipt was refused. Go on?"
        assert [p.question for p in r.pending] == [question]
    async with so.Runtime([agent], store=store_url) as rt:  # a restart: the body replays
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
        steps = [e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.step"]
    [result] = tool_results(seen.last)
    assert result.content == {
        "refused": "invoice to acme sent, but its receipt was refused",
        "go_on": "yes",
    }
    assert sent == ["acme"]  # its effect once, though the body ran twice
    [step] = steps
    assert step.data["error"]["type"] == error.__name__ and "result" not in step.data


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


class Charged(Exception):
    """A failure after the charge went through, holding what it was about as its argument."""

    def __str__(self) -> str:
        return "charged, then the receipt failed"


_UNWRITABLE = [10**5000, _nested(1000)]
_UNWRITABLE_IDS = ["int-of-5001-digits", "nested-1000-deep"]


@pytest.mark.parametrize("arg", _UNWRITABLE, ids=_UNWRITABLE_IDS)
def test_arguments_too_long_or_too_deep_to_write_are_not_kept(arg: object) -> None:
    """An integer of more digits than a stored number may have, or nesting deeper than
    `MAX_INPUT_DEPTH`, is left out as JSON that cannot hold it is: the entry is written."""
    error = failure_of(Charged(arg))
    assert error["args"] is None and error["message"] == "charged, then the receipt failed"
    json.dumps(error)


@pytest.mark.parametrize("arg", _UNWRITABLE, ids=_UNWRITABLE_IDS)
async def test_a_step_failure_whose_arguments_cannot_be_written_is_journaled(
    store_url: str, arg: object
) -> None:
    """A step that raised holding an integer of 5,001 digits (or a list 1,000 deep) was not
    journaled: writing its arguments raised `ValueError` (`RecursionError`), which its body saw
    instead of its own exception, and its replay was a `ReplayError` (no entry, a question
    after it). Now its failure is journaled without them, and replays as `StepFailed`."""
    charges: list[int] = []

    def charge() -> None:
        charges.append(1)
        raise Charged(arg)

    @so.tool
    async def pay(ctx: so.ToolContext) -> dict[str, str]:
        """Charge the card; if that fails, ask whether to go on."""
        try:
            await ctx.step("charge", charge)
        except (Charged, so.StepFailed) as exc:
            answer = await ctx.ask("The charge failed. Go on?", options=["yes", "no"])
            return {"caught": type(exc).__name__, "go_on": answer.value}
        return {"caught": "nothing"}

    seen = Capture(reply("Done."))
    agent = scripted_agent("billing", [call_tools(call("pay")), seen], tools=[pay])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="pay")
        assert [p.question for p in r.pending] == ["The charge failed. Go on?"]
    async with so.Runtime([agent], store=store_url) as rt:  # a restart: the body replays
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
        steps = [e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.step"]
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, {"caught": "StepFailed", "go_on": "yes"})
    assert charges == [1]
    [step] = steps
    assert step.data["error"]["type"] == "Charged" and step.data["error"]["args"] is None


async def test_a_step_failure_whose_attributes_are_too_big_keeps_its_class(
    tmp_path: Path,
) -> None:
    """Attributes over the tool's result bound (a response's body) are left out of the entry,
    not the exception: it replays as its own class, rebuilt from its arguments."""

    def quote() -> None:
        failed = HttpError("bad gateway", status=502)
        failed.body = "x" * 5000  # type: ignore[attr-defined]
        raise failed

    @so.tool(max_result_bytes=2000)
    async def pay(ctx: so.ToolContext) -> dict[str, str]:
        """Quote, and ask whether to go on if that fails."""
        try:
            await ctx.step("quote", quote)
        except HttpError as exc:
            answer = await ctx.ask("The quote failed. Go on?", options=["yes", "no"])
            return {"caught": type(exc).__name__, "go_on": answer.value}
        return {"caught": "nothing"}

    seen = Capture(reply("Done."))
    agent = scripted_agent("billing", [call_tools(call("pay")), seen], tools=[pay])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="pay")
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
        steps = [e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.step"]
    [result] = tool_results(seen.last)
    assert result.content == {"caught": "HttpError", "go_on": "yes"}
    [step] = steps
    assert step.data["error"]["args"] == ["bad gateway"] and "state" not in step.data["error"]


def test_an_exception_group_is_raised_again_with_its_exceptions() -> None:
    """A step that fans out with a `TaskGroup` raises an `ExceptionGroup`: its exceptions (a
    nested group too) are kept each as a step's would be, and replay raises the group again, so
    a body's `except* ValueError:` takes the same path."""
    inner = ExceptionGroup("retries", [TimeoutError("slow"), KeyError("k")])
    error = failure_of(ExceptionGroup("fetches failed", [ValueError("bad", 3), inner]))
    again = replayed(error)
    assert type(again) is ExceptionGroup and str(again) == "fetches failed (2 sub-exceptions)"
    first, nested = again.exceptions
    assert type(first) is ValueError and first.args == ("bad", 3)
    assert type(nested) is ExceptionGroup and nested.message == "retries"
    assert [(type(e), e.args) for e in nested.exceptions] == [
        (TimeoutError, ("slow",)),
        (KeyError, ("k",)),
    ]


def test_a_group_holding_an_exception_that_cannot_be_rebuilt_replays_as_step_failed() -> None:
    """One of its exceptions built otherwise would send an `except*` another way: the whole
    group replays as `StepFailed`, as a lone exception that cannot be rebuilt does."""
    error = failure_of(ExceptionGroup("two failed", [ValueError("a"), Declined(5)]))
    again = replayed(error)
    assert isinstance(again, so.StepFailed)
    assert again.error_type == "ExceptionGroup"
    assert again.error_message == "two failed (2 sub-exceptions)"


async def test_a_step_whose_task_group_failed_takes_the_same_except_star_on_replay(
    store_url: str,
) -> None:
    """A step running a `TaskGroup` whose task failed is journaled; its replay raised
    `StepFailed` (the group's exceptions were not kept), which the body's `except* ValueError:`
    did not catch: the call that handled the failure live failed after a restart."""
    fetched: list[str] = []

    async def fetch_all() -> list[str]:
        async def fetch(url: str) -> str:
            fetched.append(url)
            if url == "b":
                raise ValueError(f"{url}: 404")
            return url

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(fetch(u)) for u in ("a", "b")]
        return [t.result() for t in tasks]

    @so.tool
    async def crawl(ctx: so.ToolContext) -> dict[str, str]:
        """Fetch the pages; if one is missing, ask whether to go on."""
        try:
            return {"pages": str(await ctx.step("fetch", fetch_all))}
        except* ValueError as group:
            missing = str(group.exceptions[0])
        answer = await ctx.ask(f"{missing}. Go on?", options=["yes", "no"])
        return {"missing": missing, "go_on": answer.value}

    seen = Capture(reply("Done."))
    agent = scripted_agent("web", [call_tools(call("crawl")), seen], tools=[crawl])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("web", prompt="crawl")
        assert [p.question for p in r.pending] == ["b: 404. Go on?"]
    async with so.Runtime([agent], store=store_url) as rt:  # a restart: the body replays
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, {"missing": "b: 404", "go_on": "yes"})
    assert fetched == ["a", "b"]  # once, though the body ran twice


async def test_a_task_group_stepping_in_a_step_is_refused_unjournaled_and_the_fix_runs(
    store_url: str,
) -> None:
    """A step's function that steps from a `TaskGroup`'s task (a bug in the tool's code) is
    refused, and the refusal, wrapped in the group's `ExceptionGroup`, was journaled as the
    step's own failure: once the code was fixed, its replay raised the old group, and the fixed
    step never ran. The refusal is found in the group: nothing is journaled, and the fix runs."""
    ran: list[str] = []
    fixed: list[bool] = []

    @so.tool
    async def sync(ctx: so.ToolContext) -> list[str]:
        """Sync the records while asking whether to notify."""

        async def pull() -> str:
            if not fixed:  # the bug: a step inside the step's function
                async with asyncio.TaskGroup() as group:
                    group.create_task(ctx.step("inner", ran.append, "inner"))
            ran.append("pulled")
            return "pulled"

        async def records() -> str:
            try:
                return str(await ctx.step("pull", pull))
            except Exception as exc:
                return type(exc).__name__

        async def notify() -> str:
            return (await ctx.ask("Notify?", options=["yes", "no"])).value

        return list(await asyncio.gather(records(), notify()))

    seen = Capture(reply("Done."))
    agent = scripted_agent("crm", [call_tools(call("sync")), seen], tools=[sync])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("crm", prompt="sync")
        assert [p.question for p in r.pending] == ["Notify?"]
        assert ran == []
        fixed.append(True)  # the tool's code fixed before the answer
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
        steps = [e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.step"]
    assert tool_results(seen.last)[0].content == ["pulled", "yes"]
    assert ran == ["pulled"]
    [step] = steps
    assert step.data["name"] == "pull" and step.data["result"] == "pulled"


class _Recorded:
    """The engine's journal of a call whose N keyed steps all ran: it counts the entries read."""

    can_ask = True
    keyed = True

    def __init__(self, n: int) -> None:
        self.journal = _Counted(
            {"kind": "step", "name": f"s{i % 10}", "result": i, "n": i // 10} for i in range(n)
        )

    def entries(self) -> list[dict[str, Any] | None]:
        return self.journal

    async def run_step(
        self, index: int, name: str, run: object, *, plain: bool = False, child: bool = False
    ) -> object:
        raise AssertionError(f"step {name!r} {index} ran again")


class _Counted(list[dict[str, Any] | None]):
    reads = 0

    def __iter__(self) -> Iterator[dict[str, Any] | None]:
        for entry in super().__iter__():
            self.reads += 1
            yield entry

    def __getitem__(self, i: Any) -> Any:
        self.reads += 1
        return super().__getitem__(i)


async def test_replaying_n_steps_reads_each_entry_once() -> None:
    """Replay finds each journaled step by a look-up: a scan of every entry per step made a
    tool of N steps cost N² (5,000 steps took 7 s to replay)."""
    n = 2000
    journal = _Recorded(n)
    ctx = so.ToolContext(
        session=so.SessionInfo(
            id="s", agent="a", turn="t", auth=so.SessionAuth(current=None, initiator=None)
        ),
        call_id="c",
        tool_name="t",
        idempotency_key="k",
        journal=cast(Journal, journal),
    )
    results = [await ctx.step(f"s{i % 10}", print) for i in range(n)]
    assert results == list(range(n))
    assert journal.journal.reads <= n

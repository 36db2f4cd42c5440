"""Functions `@tool` cannot take as they are declared: a `UsageError` naming the problem when
the tool is made, not an `AttributeError`, a pydantic error or a body that fails at each call."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"{order_id}: {amount}"


class Refunder:
    """A callable object: no `__name__`."""

    def __call__(self, order_id: str) -> str:
        return order_id


@pytest.mark.parametrize(
    "fn", [functools.partial(refund, amount=5.0), Refunder()], ids=["partial", "object"]
)
def test_a_function_without_a_name_needs_one_given(fn: object) -> None:
    """`fn.__name__` raised `AttributeError` from `@tool`."""
    with pytest.raises(so.UsageError, match="has no __name__: give the tool a name"):
        so.Tool(fn)  # type: ignore[arg-type]


def test_a_parameter_with_a_leading_underscore_is_refused() -> None:
    """pydantic took `_note` for a private attribute: it was left out of the schema, so the
    model could never pass it and every call failed with a TypeError from the body."""

    def note(order_id: str, _note: str) -> str:
        return order_id

    with pytest.raises(so.UsageError, match="parameter '_note' may not begin with '_'"):
        so.Tool(note)


@pytest.mark.parametrize("name", ["model_dump", "model_config", "model_fields"])
def test_a_parameter_named_as_pydantic_s_own_api_is_refused(name: str) -> None:
    """A `ValueError` or a `TypeError` from pydantic (or a model whose `model_dump` is a str)."""
    ns: dict[str, object] = {}
    exec(f"def fn({name}: str) -> str:\n    return 'x'", ns)
    with pytest.raises(so.UsageError, match=f"parameter {name!r} is a name pydantic uses"):
        so.Tool(ns["fn"])  # type: ignore[arg-type]


async def test_a_parameter_named_as_an_old_pydantic_method_works_without_a_warning(
    tmp_path: Path,
) -> None:
    """`schema` or `json` shadow pydantic's deprecated methods, which signoff does not call:
    they work, and the warning pydantic gave (an error under `-W error`) is not given."""

    def check(schema: str, json: str) -> str:
        """Check a document against a schema."""
        return f"{schema}/{json}"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checker = so.Tool(check)
    seen = Capture(reply("Checked."))
    agent = scripted_agent(
        "docs", [call_tools(call("check", schema="s", json="j")), seen], tools=[checker]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        assert (await rt.generate("docs", prompt="check")).status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "s/j")


def numbers(n: int) -> Iterator[int]:
    yield from range(n)


async def stream(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


@pytest.mark.parametrize("fn", [numbers, stream], ids=["generator", "async-generator"])
def test_a_generator_function_is_refused(fn: object) -> None:
    """Its body never ran: the call's result was the generator object, an error at each call."""
    with pytest.raises(so.UsageError, match="is a generator function: a tool returns its result"):
        so.Tool(fn)  # type: ignore[arg-type]


def test_a_keyword_only_context_is_refused() -> None:
    """The context is passed first, by position: a keyword-only one failed every call."""

    def lookup(*, ctx: so.ToolContext, order_id: str) -> str:
        return order_id

    with pytest.raises(so.UsageError, match="the ToolContext parameter 'ctx' must be positional"):
        so.Tool(lookup)


@pytest.mark.parametrize("fn", [numbers, stream], ids=["generator", "async-generator"])
async def test_a_step_given_a_generator_function_is_a_usage_error_before_it_runs(
    tmp_path: Path, fn: object
) -> None:
    """Its body never ran: the generator object, with no JSON form, was journaled as the
    step's failure, replayed as that failure on every run after."""
    seen: list[str] = []

    @so.tool
    async def count(ctx: so.ToolContext) -> str:
        """Count in a step."""
        try:
            await ctx.step("count", fn, 3)  # type: ignore[arg-type]
        except so.UsageError as exc:
            seen.append(str(exc))
        return "counted"

    agent = scripted_agent("c", [call_tools(call("count")), reply("Done.")], tools=[count])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("c", prompt="count")
        assert r.status == "completed", r
        types = [e.type async for e in rt.events(r.session_id, 0, follow=False)]
    assert "tool.step" not in types
    [said] = seen
    assert "is a generator function" in said


def _hinted_int(count: int = "abc") -> int:  # type: ignore[assignment]
    return count


def _none_for_int(count: int = None) -> int:  # type: ignore[assignment]
    return count


def _under_its_bound(count: Annotated[int, Field(ge=1)] = 0) -> int:
    return count


def _field_default(count: int = Field(default="abc", description="How many.")) -> int:  # type: ignore[assignment]
    return count


def _aliased(count: Annotated[int, Field(alias="n")] = "abc") -> int:  # type: ignore[assignment]
    return count


def _boom(value: int) -> int:
    raise RuntimeError("no count today")


def _validator_raises(size: int = 1, count: Annotated[int, AfterValidator(_boom)] = 2) -> int:
    return count


def _not_a_number(rate: float = float("nan")) -> float:
    return rate


@pytest.mark.parametrize(
    ("fn", "shown"),
    [
        (_hinted_int, "'abc'"),
        (_none_for_int, "None"),
        (_under_its_bound, "0"),
        (_field_default, "'abc'"),
        (_aliased, "'abc'"),
        (_validator_raises, "2"),
        (_not_a_number, "nan"),
    ],
    ids=[
        "str-for-int",
        "none-for-int",
        "under-its-bound",
        "field-default",
        "aliased",
        "validator-raises",
        "nan",
    ],
)
def test_a_default_its_hint_refuses_is_refused(fn: Callable[..., Any], shown: str) -> None:
    """The model is shown the default in the schema and a call that leaves the parameter out
    runs the body with it; pydantic does not check defaults, so `count: int = "abc"` gave the
    body a str (and the model a schema of an integer defaulting to text). A NaN default failed
    every such call as invalid input (non-finite numbers are refused)."""
    with pytest.raises(so.UsageError, match=rf"default {re.escape(shown)} of parameter"):
        so.Tool(fn)


class Window(BaseModel):
    days: int = 7


def _fine(
    a: int | None = None,
    b: float = 1,
    c: list[int] = Field(default_factory=list),  # noqa: B008 (pydantic's way)
    d: Window = Window(),  # noqa: B008 (a model's default)
    e: Annotated[int, Field(ge=1)] = 3,
) -> str:
    return f"{a} {b} {c} {d.days} {e}"


def test_defaults_their_hints_take_are_kept_as_they_are() -> None:
    t = so.Tool(_fine)
    validated = t.validate({})
    assert (validated.a, validated.b, validated.c, validated.e) == (None, 1, [], 3)  # type: ignore[attr-defined]
    assert validated.d == Window()  # type: ignore[attr-defined]


def test_a_steps_generator_check_is_inspects_for_every_kind_of_callable() -> None:
    """`ctx.step` reads a plain function's code flags itself (the `inspect` calls took a third
    of a replayed step); for any callable the answer is still `inspect`'s."""
    import inspect

    from signoff._tool_context import _generates

    async def coroutine() -> int:
        return 1

    class Holder:
        def gen(self) -> Iterator[int]:
            yield 1

        async def agen(self) -> AsyncIterator[int]:
            yield 1

        def plain(self) -> int:
            return 1

    held = Holder()
    kinds: list[object] = [numbers, stream, coroutine, len, lambda: 1, Holder]
    kinds += [held.gen, held.agen, held.plain, functools.partial(numbers, 2)]
    for fn in kinds:
        expected = inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
        assert _generates(fn) is expected, fn

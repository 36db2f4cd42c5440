"""The runtime's own settings: what it refuses, what it accepts, and what a copy of it keeps; and
the bound on bytes a follower reads at once."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import SQLiteStore
from signoff.testing import (
    reply,
    scripted_agent,
)


async def test_with_store_keeps_every_setting_but_the_store(tmp_path: Path) -> None:
    """`--store` (CLI and server) goes through `with_store`: the same agents and settings,
    including the state cache's size, on another store; the original runtime is unchanged."""
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    clock = lambda: 1_000.0  # noqa: E731
    first = so.Runtime(
        [agent],
        f"sqlite:///{tmp_path}/one.db",
        clock=clock,
        lease_ttl=7.0,
        lease_wait=3.0,
        cache_size=5,
        poll_interval=0.5,
        inline=False,
    )
    other = first.with_store(f"sqlite:///{tmp_path}/two.db")
    assert other.agents == first.agents and other.store is not first.store
    assert other.store.url.endswith("two.db") and first.store.url.endswith("one.db")
    settings = ("clock", "lease_ttl", "lease_wait", "_cache_size", "poll_interval", "inline")
    assert [getattr(other, s) for s in settings] == [getattr(first, s) for s in settings]
    assert (other.lease_ttl, other._cache_size, other.inline) == (7.0, 5, False)
    r = await other.generate("a", prompt="hello")
    assert r.status == "running"  # inline=False: left to workers, on the other store
    assert [s.id for s in await other.sessions()] == [r.session_id]
    assert await first.sessions() == []
    await first.close()
    await other.close()


@pytest.mark.parametrize(
    "setting",
    [
        {"lease_wait": float("nan")},
        {"lease_wait": -1},
        {"lease_wait": "10"},
        {"cache_size": -1},
        {"cache_size": 2.5},
        {"cache_size": True},
    ],
)
def test_runtime_refuses_a_lease_wait_or_cache_size_it_cannot_use(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    """`lease_wait=nan` waited for a busy session for ever (never `SessionBusy`), and
    `cache_size=-1` made the first call a bare KeyError; both are refused when constructed."""
    with pytest.raises(so.UsageError, match=next(iter(setting))):
        so.Runtime([], store=f"sqlite:///{tmp_path}/s.db", **setting)


async def _async_clock() -> float:
    return 1_000.0


def test_runtime_refuses_an_async_clock_and_names_a_coroutine_a_clock_returns(
    tmp_path: Path,
) -> None:
    """An async clock was taken, and its first reading failed as "clock returned <coroutine
    object ...>", then Python warned at exit that the coroutine was never awaited. It is refused
    when the runtime is made; a plain clock that returns a coroutine is named at its first
    reading, as any other clock returning no time, and its coroutine closed: no warning."""
    with pytest.raises(so.UsageError, match="clock must be a plain function .* an async one"):
        so.Runtime([], store=f"sqlite:///{tmp_path}/s.db", clock=_async_clock)  # type: ignore[arg-type]
    agent = scripted_agent("a", [reply("hi")])
    plain: Any = lambda: _async_clock()  # noqa: E731
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", clock=plain)
    try:
        with pytest.raises(so.UsageError, match=r"clock returned <coroutine object"):
            rt.generate_sync("a", prompt="hello")
    finally:
        rt.close_sync()


def _skewed(skew: float) -> float:
    return 1_000.0 + skew


def test_runtime_refuses_a_clock_that_needs_arguments_before_opening_the_store(
    tmp_path: Path,
) -> None:
    """A clock needing an argument was taken, the store file made, and the first call failed
    with a bare TypeError; it is refused as the runtime is made, nothing opened. One with its
    arguments bound is a clock."""
    path = tmp_path / "s.db"
    with pytest.raises(so.UsageError, match=r"clock must be a function of no arguments .*skew"):
        so.Runtime([], store=f"sqlite:///{path}", clock=_skewed)  # type: ignore[arg-type]
    assert not path.exists()
    agent = scripted_agent("a", [reply("hi")])
    rt = so.Runtime([agent], store=f"sqlite:///{path}", clock=functools.partial(_skewed, 5.0))
    try:
        assert rt.generate_sync("a", prompt="hello").text == "hi"
    finally:
        rt.close_sync()


def test_runtime_takes_a_lease_wait_of_0_and_a_cache_of_0(tmp_path: Path) -> None:
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", lease_wait=0, cache_size=0)
    try:
        assert rt.generate_sync("a", prompt="hello").text == "hi"
    finally:
        rt.close_sync()


class BatchStore(SQLiteStore):
    """Records how many events each bounded read returned."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[int] = []

    async def read_events(self, *args: Any, **kwargs: Any) -> list[so.Event]:
        events = await super().read_events(*args, **kwargs)
        if kwargs.get("limit") is not None:
            self.batches.append(len(events))
        return events


async def test_following_events_holds_a_bounded_number_of_bytes_per_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`events()` reads at most `stores.READ_BYTES` of event JSON at once (500 events of
    megabytes each were held per read), and still yields every event, in order."""
    agent = scripted_agent("a", [reply("hello " * 50)] * 4, repeat_last=True)
    store = BatchStore(f"sqlite:///{tmp_path}/s.db")
    async with so.Runtime([agent], store=store) as rt:
        r = await rt.generate("a", prompt="one")
        for prompt in ("two", "three"):
            await rt.generate(session_id=r.session_id, prompt=prompt)
        head = await store.head(r.session_id)
        monkeypatch.setattr(so.stores, "READ_BYTES", 1)
        seqs = [e.seq async for e in rt.events(r.session_id, follow=False)]
    assert head is not None and seqs == list(range(1, head + 1))
    assert max(store.batches) == 1


def test_a_replaced_runtime_keeps_every_setting_it_is_not_given(tmp_path: Path) -> None:
    """`signoff worker` and `--store` rebuild the runtime a module made: a setting left out of
    the copy (the worker once dropped `cache_size`) would silently change how it runs."""
    import inspect

    from opentelemetry.sdk.trace import TracerProvider

    from signoff._sessions import SessionRunner

    clock = so.testing.ManualClock(1_000.0)
    original = so.Runtime(
        [so.Agent(name="a", model=so.models.Scripted([]))],
        f"sqlite:///{tmp_path / 'a.db'}",
        clock=clock,
        lease_ttl=11.0,
        lease_wait=3.0,
        cache_size=7,
        poll_interval=0.5,
        inline=True,
        tracer_provider=TracerProvider(),
        trace_content=True,
    )
    copy = original._replaced(lease_ttl=2.0, inline=False)
    settings = {
        "clock": "clock",
        "lease_wait": "lease_wait",
        "cache_size": "_cache_size",
        "poll_interval": "poll_interval",
        "tracer_provider": "tracer_provider",
        "trace_content": "trace_content",
    }
    given = {"agents", "store", "lease_ttl", "inline"}
    params = set(inspect.signature(SessionRunner.__init__).parameters) - {"self"}
    assert params == given | set(settings), "a new setting: carry it in Runtime._replaced"
    for attribute in settings.values():
        assert getattr(copy, attribute) == getattr(original, attribute), attribute
    assert (copy.lease_ttl, copy.inline, copy.store) == (2.0, False, original.store)
    assert list(copy.agents) == ["a"]
    moved = original.with_store(f"sqlite:///{tmp_path / 'b.db'}")
    assert (moved.lease_ttl, moved.inline, moved._cache_size) == (11.0, True, 7)


class Shouting(so.Runtime):
    """A runtime subclass overriding a call: its copies must run the override too."""

    async def generate(self, *args: Any, **kwargs: Any) -> so.GenerateResult:
        result = await super().generate(*args, **kwargs)
        return dataclasses.replace(result, text=result.text.upper())


_IMMUTABLE = (bool, int, float, str, type(None), tuple)


async def test_a_copy_keeps_a_subclass_and_shares_nothing_live(tmp_path: Path) -> None:
    """`with_store` and the commands' copies (`_replaced`) keep the runtime's class: rebuilt as
    a plain `Runtime`, a subclass's overrides were lost. Nothing live is shared with the
    original: not its store when another is given, caches, counts, locks, loop or owner id."""
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    original = Shouting([agent], f"sqlite:///{tmp_path}/one.db", lease_ttl=9.0, cache_size=5)
    assert (await original.generate("a", prompt="x")).text == "HI"  # opened, cached, counted
    moved = original.with_store(f"sqlite:///{tmp_path}/two.db")
    assert type(moved) is Shouting and moved.store is not original.store
    settings = {"clock", "lease_ttl", "lease_wait", "_cache_size", "poll_interval", "inline"}
    settings |= {"tracer_provider", "trace_content"}
    for name, value in vars(original).items():
        copied = getattr(moved, name)
        if name in settings:
            assert copied == value, name
        elif name == "agents":
            assert copied == value and copied is not value
        elif not isinstance(value, _IMMUTABLE):
            assert copied is not value, f"{name} is shared with the copy"
    assert moved.owner != original.owner and not moved._opened
    assert not moved._cache and moved._counts.drives == 0 and original._counts.drives == 1
    r = moved.generate_sync("a", prompt="y")  # on its own loop, while the original's is open
    assert r.text == "HI" and [s.id for s in moved.sessions_sync()] == [r.session_id]
    assert (moved._counts.drives, original._counts.drives) == (1, 1)
    assert len(await original.sessions()) == 1
    worker = original._replaced(lease_ttl=2.0, inline=False)
    assert type(worker) is Shouting and (worker.lease_ttl, worker.inline) == (2.0, False)
    assert (original.lease_ttl, original.inline) == (9.0, True)
    with pytest.raises(so.UsageError, match="lease_ttl"):
        original._replaced(lease_ttl=0)  # refused as the constructor refuses it
    with pytest.raises(so.UsageError, match="inline"):
        original._replaced(inline="no")  # type: ignore[arg-type]
    moved.close_sync()
    await original.close()


def test_help_names_the_parameters_the_default_store_and_how_to_close() -> None:
    """`help(signoff.Runtime)` is where a newcomer looks first: it shows the real signature,
    what every parameter is, which store is used without one, and both ways to close it."""
    import inspect
    import pydoc

    params = list(inspect.signature(so.Runtime).parameters)
    assert params == [
        "agents",
        "store",
        "clock",
        "lease_ttl",
        "lease_wait",
        "cache_size",
        "poll_interval",
        "inline",
        "tracer_provider",
        "trace_content",
    ]
    text = pydoc.plain(pydoc.render_doc(so.Runtime))
    assert "Runtime(agents: 'Sequence[Agent]', store: 'str | Store | None' = None, *" in text
    doc = " ".join((inspect.getdoc(so.Runtime) or "").split())
    told = doc + " ".join((inspect.getdoc(so.Runtime.__init__) or "").split())
    assert [p for p in params if f"`{p}`" not in told] == []
    assert f"`{so.stores.DEFAULT_URL}`" in doc
    for way in ("`async with Runtime(...) as rt:`", "`await rt.close()`"):
        assert way in doc
    for way in ("`with Runtime(...) as rt:`", "`rt.close_sync()`"):
        assert way in doc

"""`SyncBridge`: runs the async API from plain code (scripts, notebooks) on a private loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, TypeVar

from ._any_loop import AnyLoopEvent, blocking, waited_by
from ._error_text import readable
from ._exceptions import UsageError

__all__ = [
    "SyncBridge",
    "TimeBound",
    "blocking_doc",
    "called_off_loop",
    "checked_clock",
    "checked_sleep",
    "entered",
    "exited",
    "failure",
    "in_thread",
    "is_async",
    "outwaited",
    "thread_note",
    "thread_to_end",
    "thread_unwound",
    "to_end",
    "twin",
]

P = ParamSpec("P")
T = TypeVar("T")
UNWIND = 5.0  # seconds an interrupted call is given to unwind (release its lease) on the loop
FORKED = (
    "this runtime or client was in use when the process forked, and the thread that runs its "
    "*_sync calls did not come along to this child: close it before forking, or make a new one "
    'in the child (not on a SQLite file the parent had open: start the child with "spawn")'
)


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The bridge thread: runs the loop until stopped, then cancels the calls still on it (their
    callers would wait for ever) and closes it."""
    try:
        while True:
            try:
                loop.run_forever()
                break
            except (KeyboardInterrupt, SystemExit):
                # Raised in a task by code the loop runs (a tool, a hook, a model): the task
                # holds it for whatever awaits it, as it would on a loop of one's own. A real
                # Ctrl-C reaches the main thread, never this one. Ended here, the loop left every
                # caller of the bridge waiting for ever.
                continue
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    finally:
        loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    """A loop that holds its tasks strongly until they end. asyncio holds them weakly: a task
    waiting on a future only its own objects reach (a PostgreSQL pool's worker, on the pool's
    queue) became garbage with an unclosed runtime and was destroyed pending, its coroutine
    closed on a closed loop, instead of being cancelled when the loop stops (`_serve`)."""
    loop = asyncio.new_event_loop()
    held: set[asyncio.Future[Any]] = set()

    def task(
        loop: asyncio.AbstractEventLoop,
        coro: Generator[Any, None, T] | Coroutine[Any, Any, T],
        /,
        **kwargs: Any,
    ) -> asyncio.Future[T]:
        made = asyncio.Task(coro, loop=loop, **kwargs)
        held.add(made)
        made.add_done_callback(held.discard)
        return made

    loop.set_task_factory(task)
    return loop


def _stop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, pid: int) -> None:
    """Stop the bridge's loop and wait for its thread, unless we are that thread (or a forked
    child of its process, whose copy of the loop nothing runs and whose wake-up would reach the
    parent's loop)."""
    if loop.is_closed() or os.getpid() != pid:
        return
    loop.call_soon_threadsafe(loop.stop)
    if threading.current_thread() is not thread:
        thread.join(timeout=5)


class SyncBridge:
    """One event loop in a daemon thread, started on first use; works inside a running loop.

    A bridge that is garbage collected unclosed stops its loop and thread.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopper: weakref.finalize[Any, SyncBridge] | None = None
        self._lock = threading.Lock()
        self._calls: set[asyncio.Task[Any]] = set()  # the calls on the loop (touched there only)
        self._stopping: asyncio.AbstractEventLoop | None = None  # see `stop_calls`
        self._pid = os.getpid()  # the process whose thread runs `_loop`

    def _forked(self) -> bool:
        """Whether this is a forked child of the process that started the loop: the child has
        a copy of the loop but not the thread that runs it (nor, maybe, a free `_lock`)."""
        return self._loop is not None and self._pid != os.getpid()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._thread is not None and threading.current_thread() is self._thread:
            coro.close()
            # Blocking this loop on a call that needs this loop would wait for ever.
            raise UsageError(
                "a *_sync call made from code the sync API is running (a tool, a model or a "
                "policy): await the async method instead"
            )
        if self._forked():  # handed to the loop copied from the parent, it would wait for ever
            coro.close()
            raise UsageError(FORKED)
        started, finished = threading.Event(), threading.Event()

        async def call() -> T:
            task = asyncio.current_task()
            assert task is not None
            self._calls.add(task)
            started.set()
            try:
                with waited_by(caller):
                    return await coro
            finally:
                self._calls.discard(task)
                finished.set()

        # The caller's loop, if any, is marked blocked before the call can run: see `blocked`.
        with blocking() as caller:
            with self._lock:
                if self._stopper is not None and not self._stopper.alive:
                    # Stopped by its finalizer, which signoff's `atexit` hook runs at exit
                    # before the handlers registered earlier (`atexit.register(rt.close_sync)`):
                    # as closed.
                    self._loop = self._thread = self._stopper = self._stopping = None
                if self._loop is None:
                    loop = _new_loop()
                    thread = threading.Thread(
                        target=_serve, args=(loop,), name="signoff-sync", daemon=True
                    )
                    thread.start()
                    self._loop, self._thread, self._pid = loop, thread, os.getpid()
                    self._stopper = weakref.finalize(self, _stop, loop, thread, self._pid)
                loop, stopper = self._loop, self._stopper
                assert stopper is not None  # set with the loop
                # Handed over under the lock: a `close` in another thread, which takes it
                # first, stops the loop only after, so the loop runs the call (or cancels it).
                future = asyncio.run_coroutine_threadsafe(call(), loop)
            try:
                return future.result()
            except concurrent.futures.CancelledError:
                # Not by close(), nor by the finalizer, which stops the loop at the
                # interpreter's exit.
                if self._loop is loop and self._stopping is not loop and stopper.alive:
                    raise
                raise UsageError("the runtime or client was closed while this call ran") from None
            except BaseException:
                # Interrupted (Ctrl-C): cancel the call rather than leave it running unseen.
                if future.cancel() and started.is_set():
                    finished.wait(UNWIND)
                raise

    def stop_calls(self) -> None:
        """Cancel the calls running on the loop and wait (up to `UNWIND`) for them to unwind,
        giving their leases back, while the store they use is still open: the first step of
        closing, before the store is closed on this loop. Their callers get a `UsageError`."""
        self._await_calls(cancel=True)

    def settle_calls(self) -> None:
        """Wait (up to `UNWIND`) for the calls running on the loop to end of themselves, as
        they do once what they use is closed under them (a client's connections): each caller
        gets its call's own error (with a message's idempotency key), not the `UsageError` of
        a call the stopping loop cancelled."""
        self._await_calls(cancel=False)

    def _await_calls(self, *, cancel: bool) -> None:
        if self._forked():  # the calls are the parent's, running there
            return
        with self._lock:
            loop = self._loop
            if cancel:
                self._stopping = loop
        if loop is None or threading.current_thread() is self._thread:
            return

        async def wait() -> None:
            calls = set(self._calls)
            if cancel:
                for task in calls:
                    task.cancel()
            if calls:
                await asyncio.wait(calls, timeout=UNWIND)

        job = wait()
        try:
            done = asyncio.run_coroutine_threadsafe(job, loop)
        except RuntimeError:  # the loop closed meanwhile: nothing runs on it
            job.close()
            return
        with contextlib.suppress(concurrent.futures.TimeoutError):  # a loop stopped meanwhile
            done.result(UNWIND + 1)

    def close(self) -> None:
        """Stop the loop and its thread; a later call starts them again. In a forked child it
        does nothing: the loop is the parent's, and its runtime or client too."""
        if self._forked():
            return
        with self._lock:
            stopper, loop, thread, pid = self._stopper, self._loop, self._thread, self._pid
            self._loop = self._thread = self._stopper = self._stopping = None
        # Detached and run here, not called: once the interpreter's exit has run the finalizers,
        # calling one does nothing, and a loop started since would go on. (Detaching one that
        # ran, or is running, gives None: its loop is stopped already.)
        if stopper is not None and stopper.detach() is not None:
            assert loop is not None and thread is not None
            _stop(loop, thread, pid)


def entered(
    bridge: SyncBridge, opening: Coroutine[Any, Any, object], close: Callable[[], None]
) -> None:
    """Run `opening` on `bridge` for a `with` block; if it fails, `close()` first (its own
    error dropped for the opening's): no `__exit__` follows to stop what it began, the
    bridge's thread among it, as `async with` closes after a failed open."""
    try:
        bridge.run(opening)
    except BaseException:
        with contextlib.suppress(Exception):
            close()
        raise


def twin(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[Any, P], T]:
    """The blocking twin of an async method, for a class whose `_sync` is a `SyncBridge`: same
    parameters and docstring, and the method is looked up by name, so an override is the one run."""
    name = method.__name__

    @functools.wraps(method)
    def blocking(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> T:
        bridge: SyncBridge = self._sync
        call: Coroutine[Any, Any, T] = getattr(self, name)(*args, **kwargs)
        return bridge.run(call)

    blocking.__name__ = f"{name}_sync"
    blocking.__qualname__ = f"{method.__qualname__}_sync"
    blocking.__doc__ = blocking_doc(method)
    return blocking


def blocking_doc(method: Callable[..., Any]) -> str:
    """The docstring of the blocking twin of `method`."""
    return f"`{method.__name__}`, blocking until it returns.\n\n{inspect.getdoc(method) or ''}"


async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` run in a thread. A `StopIteration` it raises is a `RuntimeError`,
    as a coroutine makes it: asyncio cannot hand one to the task awaiting the thread, which
    then waited for ever. So is a `concurrent.futures.CancelledError` (`_pooled_cancel`), and
    any `BaseException` that is no `Exception` but asyncio's cancel (`failure`)."""

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        except StopIteration as exc:
            raise RuntimeError("the function raised StopIteration") from exc
        except concurrent.futures.CancelledError as exc:
            if type(exc) is not concurrent.futures.CancelledError:
                raise  # a subclass asyncio hands on as it is
            raise _pooled_cancel(exc) from exc
        except BaseException as exc:
            # Its `SystemExit`, and its `KeyboardInterrupt` too (a Ctrl-C reaches the main
            # thread, not this one): its failure, not an interrupt of the loop awaiting it.
            failed = failure(exc, in_thread=True)
            if failed is None:
                raise
            raise failed from exc

    return await asyncio.to_thread(call)


async def thread_to_end(
    fn: Callable[..., Any], give_up: Callable[[], bool], /, *args: Any, **kwargs: Any
) -> tuple[asyncio.Future[Any], bool]:
    """`fn(*args, **kwargs)` run in a thread (`in_thread`) to its end, its result or exception
    in the future returned, and whether the caller was cancelled meanwhile. A thread cannot be
    stopped: its effect happens whatever cancels the caller (`Runtime.close`), so the caller
    waits for it and records it rather than throwing it away and running it again; unless
    `give_up()` says, when it is cancelled, that nothing could be recorded (a lost lease)."""
    work = asyncio.ensure_future(in_thread(fn, *args, **kwargs))
    cancelled = False
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            if give_up():
                raise
            cancelled = True
    return work, cancelled


async def outwaited(task: asyncio.Future[Any], parked: AnyLoopEvent | None = None) -> bool:
    """Wait for `task` to end, or `parked` (if given) to be set, whatever cancels the waiter
    meanwhile (a lost lease may cancel `task` itself): whether the waiter was cancelled, which
    its caller is to raise. A plain body that parked on a loop of its own ends only once told."""
    cancelled = False
    while not task.done() and not (parked is not None and parked.is_set()):
        waits = {task} if parked is None else {task, asyncio.ensure_future(parked.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancelled = True
        finally:
            for waiting in waits - {task}:
                waiting.cancel()
    return cancelled


async def thread_unwound(task: asyncio.Future[Any]) -> bool:
    """Wait up to `UNWIND` seconds for `task`, a plain function's thread awaited, to end of
    itself, whatever cancels the waiter meanwhile: a thread no cancel stops, told to stop by
    other means, is given the time to, so it does not run on past its caller. Whether the
    waiter was cancelled, which its caller is to raise."""
    loop = asyncio.get_running_loop()
    until = loop.time() + UNWIND
    cancelled = False
    while not task.done() and (left := until - loop.time()) > 0:
        try:
            await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


async def to_end(work: Coroutine[Any, Any, T], give_up: Callable[[], bool]) -> T:
    """`work` (a record of what already happened) awaited to its end whatever cancels the caller
    meanwhile (`Runtime.close`), and then the cancel raised, so it is not thrown away half done;
    unless `give_up()` says, when the caller is cancelled, that it cannot succeed (a lost lease):
    it is cancelled with the caller then."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            if give_up():
                task.cancel()
                raise
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the cancel goes on whatever it raised
        raise asyncio.CancelledError
    return task.result()


async def called_off_loop(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, awaited if it gives an awaitable: a coroutine function on the
    loop, any other function (a sync tool, a hook) in a thread (`in_thread`), so one that blocks
    stops no lease renewal of the process's sessions. A `BaseException` it raises that is no
    `Exception` is a `RuntimeError` (`failure`), but a cancel, `KeyboardInterrupt` or
    `GeneratorExit` on the loop."""
    try:
        if is_async(fn):
            result = await fn(*args, **kwargs)
        else:
            result = await in_thread(fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as exc:
        failed = failure(exc)
        if failed is None:
            raise
        raise failed from exc
    return result


class TimeBound:
    """`asyncio.timeout(seconds)`, telling also whether the work it bounds ran past it: asyncio
    cuts work short only at an await, so a coroutine that blocks (sync work, never awaiting)
    runs on past its bound, and what it gives then came too late all the same."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._bound = asyncio.timeout(seconds)
        self._started = time.monotonic()

    async def __aenter__(self) -> TimeBound:
        self._started = time.monotonic()
        await self._bound.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._bound.__aexit__(*exc_info)  # suppresses nothing: raises a TimeoutError

    def expired(self) -> bool:
        """Whether the bound cut the work short: a `TimeoutError` raised then is its own."""
        return self._bound.expired()

    def overran(self) -> bool:
        """Whether the work ran past the bound, cut short or not."""
        return self._bound.expired() or time.monotonic() - self._started > self.seconds


def exited(exc: SystemExit) -> RuntimeError:
    """The error of a function that raised `SystemExit` (an `argparse` parser given bad
    arguments, a stray `sys.exit()`): its failure, not the process's end, which the event loop
    would let it be (out of `asyncio.run`, ending every session the process runs)."""
    return RuntimeError(f"the function raised SystemExit({exc.code!r})")


def failure(exc: BaseException, *, in_thread: bool = False) -> RuntimeError | None:
    """The error of a function that raised `exc`, a `BaseException` that is no `Exception`
    (`SystemExit`, a library's own kind): its failure, recorded as any other, not one that left
    its session running and ran it again at each resume. None for what goes on as raised: an
    `Exception`, a cancel (`own_cancel` tells the function's own), and, on the loop, a
    `KeyboardInterrupt` (a real Ctrl-C in a main thread's loop) or a `GeneratorExit` (the
    coroutine closed)."""
    if isinstance(exc, Exception | asyncio.CancelledError):
        return None
    if isinstance(exc, SystemExit):
        return exited(exc)
    if not in_thread and isinstance(exc, KeyboardInterrupt | GeneratorExit):
        return None
    message = readable(exc, "message")
    said = f": {message}" if message else ""
    return RuntimeError(f"the function raised {type(exc).__name__}{said}")


def _pooled_cancel(exc: concurrent.futures.CancelledError) -> RuntimeError:
    """The error of a function run in a thread that raised `concurrent.futures.CancelledError`
    (`.result()` of a pool's cancelled future), an ordinary failure: asyncio hands that class
    to the awaiting task as `asyncio.CancelledError`, its own cancel, which a step's journal
    and a tool's error then missed (the class and message lost)."""
    message = str(exc)
    said = f": {message}" if message else ""
    return RuntimeError(f"the function raised concurrent.futures.CancelledError{said}")


def is_async(fn: object) -> bool:
    """Whether calling `fn` gives a coroutine: an `async def`, or an object whose `__call__` is
    one (a `functools.partial` of either too). A predicate of that kind that is asked without
    awaiting (a rule, a filter) would be answered by its coroutine's truth: True."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


def checked_clock(clock: object, what: str = "clock") -> None:
    """Refuse what cannot be a clock (`Runtime`, the channels and their hub read one without
    awaiting it): no function, a class (its instances were taken for the time), an async
    function (its coroutine was), or one that needs arguments. `UsageError` naming `what`."""
    if not callable(clock):
        raise UsageError(f"{what} must be a function returning the time, not {clock!r}")
    if isinstance(clock, type):
        raise UsageError(
            f"{what} is the class {clock.__name__}: pass a clock, such as {clock.__name__}()"
        )
    if is_async(clock):
        raise UsageError(
            f"{what} must be a plain function returning the time, not {clock!r}, an async one"
        )
    try:
        signature = inspect.signature(clock)
    except (TypeError, ValueError):  # no signature to read (some builtins): left to the call
        return
    try:
        signature.bind()
    except TypeError:  # it needs arguments: every reading was a bare TypeError
        raise UsageError(
            f"{what} must be a function of no arguments returning the time, not {clock!r}, "
            f"which takes {signature}"
        ) from None


def checked_sleep(sleep: object, what: str = "sleep") -> None:
    """Refuse a `sleep` that is not an async function of the seconds (such as `asyncio.sleep`):
    a plain one (`time.sleep`) would block the event loop, and every channel and request with
    it, for each wait. `UsageError` naming `what`."""
    if not callable(sleep) or isinstance(sleep, type):
        raise UsageError(
            f"{what} must be an async function of the seconds to wait, such as asyncio.sleep, "
            f"not {sleep!r}"
        )
    if not is_async(sleep):
        raise UsageError(
            f"{what} must be an async function of the seconds to wait, such as asyncio.sleep, "
            f"not {sleep!r}, a plain one: it would block the event loop (make it an async def)"
        )


def thread_note(fn: Callable[..., Any], exc: BaseException) -> str:
    """A note for the error of a plain function that used the event loop, which its thread does
    not have (`called_off_loop`): what to do instead. Empty for any other error."""
    if inspect.iscoroutinefunction(fn) or not isinstance(exc, RuntimeError):
        return ""
    if "event loop" not in str(exc):
        return ""
    return " (a plain function runs in a thread, without the event loop: make it async to use it)"

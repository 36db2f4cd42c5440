"""The `*_sync` twins across the life of a process: in a child forked from a process whose
runtime's loop was running, from `atexit` handlers at interpreter exit, and in a daemon thread
still in a call when the interpreter exits."""

from __future__ import annotations

import json

from ._forks import Scripts

# Each script runs in a fresh child (tests/_forks.py) and prints one JSON line of what it saw.
_FORKED = """
import json, os, signal, sys, threading
import signoff as so
from signoff.testing import reply, scripted_agent

rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=sys.argv[1])
rt.generate_sync("a", prompt="x")  # the runtime's loop runs in a thread the child lacks
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    signal.alarm(10)  # a hang is ended, and told by the exit status
    seen = {}
    for name, call in (("call", rt.sessions_sync), ("close", rt.close_sync)):
        try:
            seen[name] = repr(call())
        except so.UsageError as exc:
            seen[name] = "UsageError: " + str(exc)
    os.write(write, json.dumps(seen).encode())
    os._exit(0)
os.close(write)
_, status = os.waitpid(pid, 0)
child = json.loads(os.read(read, 65536) or b"{}")
after = len(rt.sessions_sync())  # the parent's loop is untouched
rt.close_sync()
print(json.dumps({"status": os.waitstatus_to_exitcode(status), "child": child, "after": after}))
"""


def test_a_sync_call_in_a_forked_child_is_refused_instead_of_hanging(
    scripts: Scripts, store_url: str
) -> None:
    """A child forked while the runtime's loop ran inherits that loop but not the thread that
    runs it: a `*_sync` call handed its work to that loop and waited for ever."""
    done = scripts.run(_FORKED, store_url, timeout=30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["status"] == 0, "the forked child's *_sync call hung"
    for name in ("call", "close"):
        assert seen["child"][name].startswith("UsageError: "), seen["child"]
        assert "fork" in seen["child"][name] and "new" in seen["child"][name]
    assert seen["after"] == 1


_AT_EXIT = """
import atexit, json, sys, threading
import signoff as so
from signoff.testing import reply, scripted_agent

rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=sys.argv[1])
seen = {}


def bye():
    try:
        seen["sessions"] = len(rt.sessions_sync())
        rt.close_sync()
        seen["closed"] = getattr(rt.store, "_conn", None) is None
        seen["closed"] &= getattr(rt.store, "_pool", None) is None
    except BaseException as exc:
        seen["error"] = f"{type(exc).__name__}: {exc}"
    seen["threads"] = [t.name for t in threading.enumerate() if t.name == "signoff-sync"]
    print(json.dumps(seen))


atexit.register(bye)  # before the runtime's first call, so it runs after signoff's own
rt.generate_sync("a", prompt="x")
atexit._run_exitfuncs()  # what the interpreter does as it exits
"""


def test_a_sync_call_from_an_atexit_handler_still_works(scripts: Scripts, store_url: str) -> None:
    """`atexit.register(rt.close_sync)`: at exit signoff's own handler, registered later and so
    run first, stopped the runtime's loop, and a `*_sync` call from a handler run after it
    raised a bare `RuntimeError('Event loop is closed')`, leaving the store unclosed."""
    done = scripts.run(_AT_EXIT, store_url, timeout=30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"sessions": 1, "closed": True, "threads": []}, seen
    assert "never awaited" not in done.stderr, done.stderr


_CUT_AT_EXIT = """
import asyncio, atexit, json, sys, threading
import signoff as so
from signoff.testing import reply, scripted_agent

started = threading.Event()


async def hangs(conversation):
    started.set()
    await asyncio.sleep(3600)


rt = so.Runtime([scripted_agent("a", [hangs])], store=sys.argv[1])
outcome = []


def call():
    try:
        outcome.append(rt.generate_sync("a", prompt="x"))
    except BaseException as exc:
        outcome.append(exc)


caller = threading.Thread(target=call, daemon=True)  # a daemon thread still in a call at exit
caller.start()
assert started.wait(10)
atexit._run_exitfuncs()  # what the interpreter does as it exits
caller.join(10)
(error,) = outcome
print(json.dumps({"alive": caller.is_alive(), "error": f"{type(error).__name__}: {error}"}))
"""


def test_a_call_cut_short_at_exit_raises_usage_error(scripts: Scripts, store_url: str) -> None:
    """A call still running in a daemon thread when the interpreter exits is stopped with its
    loop, as by `close_sync`: its caller got a bare `CancelledError` instead of the
    `UsageError` saying the runtime closed."""
    done = scripts.run(_CUT_AT_EXIT, store_url, timeout=30)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert not seen["alive"], "the call never returned"
    assert seen["error"].startswith("UsageError: ") and "closed" in seen["error"], seen

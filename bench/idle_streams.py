"""Benchmark: what an event stream whose client stopped reading costs the server (a script).

    .venv/bin/python -m bench.idle_streams [--streams 10] [--case big|many|small]

Serves a SQLite runtime with uvicorn on loopback in a child process, writes one session's log
there (`big`: one message of 4 MiB of control characters, each `\\u0001` once escaped, a 25 MB
frame; `many`: 300 messages of 40 KB, a 12 MB log; `small`: one short message), then opens
`--streams` raw sockets to `GET /v1/sessions/{id}/events` (followed, a 4 KiB receive buffer)
that never read. Reports the server's RSS (`/proc/PID/status`, VmRSS) before the streams open
and once it has settled after, and what that adds per stream. Each case runs in a fresh server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import signoff as so

TOKEN = "bench-token"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _runtime(path: str) -> so.Runtime:
    reply = so.ModelResponse(text="noted")
    agent = so.Agent(name="desk", model=so.models.Scripted([reply], repeat_last=True))
    return so.Runtime([agent], store=f"sqlite:///{path}")


async def _write(path: str, case: str) -> str:
    """Write the case's session, and return its id."""
    rt = _runtime(path)
    try:
        if case == "big":
            result = await rt.schedule("desk", "x" + "\x01" * ((4 << 20) - 64))
        elif case == "many":
            result = await rt.schedule("desk", "a" * 40_000)
            for i in range(299):
                await rt.schedule("desk", f"{i} " + "a" * 40_000, session_id=result.session_id)
        else:
            result = await rt.schedule("desk", "hello")
        return result.session_id
    finally:
        await rt.close()


def _serve(path: str, port: int) -> None:
    import ctypes
    import signal

    import uvicorn

    libc = ctypes.CDLL("libc.so.6")
    signal.signal(signal.SIGUSR1, lambda *_: libc.malloc_trim(0))  # memory freed, given back

    from signoff.server import TokenAuth, create_app

    admin = so.Principal(authenticator="token", principal_id="root", attributes={"admin": True})
    app = create_app(_runtime(path), auth=TokenAuth({TOKEN: admin}), sweep_every=None)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open_stream(port: int, sid: str) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(
        f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    return s


def _settled(pid: int, seconds: float = 20.0) -> int:
    """The RSS once it has not grown for 2 s (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    last, still = _rss_kib(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _rss_kib(pid)
        if now > last:
            last, still = now, time.monotonic()
        elif time.monotonic() - still >= 2.0:
            break
    return last


def run(case: str, streams: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.db")
        sid = asyncio.run(_write(path, case))
        port = _port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        code = f"from bench.idle_streams import _serve; _serve({path!r}, {port})"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env)
        socks: list[socket.socket] = []
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            warm = _open_stream(port, sid)  # one read whole: the app's first-use costs
            warm.settimeout(30)
            warm.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            _drain_until_quiet(warm)
            warm.close()
            time.sleep(1)
            proc.send_signal(signal.SIGUSR1)
            before = _settled(proc.pid)
            socks = [_open_stream(port, sid) for _ in range(streams)]
            after = _settled(proc.pid)
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            trimmed = _rss_kib(proc.pid)
            added, kept = (after - before) / 1024, (trimmed - before) / 1024
            print(
                f"{case}: {streams} streams not reading: RSS {before / 1024:.1f} -> "
                f"{after / 1024:.1f} MiB, +{added:.1f} MiB, {added / streams:.2f} MiB a stream; "
                f"after malloc_trim +{kept:.1f} MiB, {kept / streams:.2f} MiB a stream"
            )
        finally:
            for s in socks:
                s.close()
            proc.terminate()
            proc.wait(timeout=10)


def _drain_until_quiet(s: socket.socket) -> None:
    """Read until 1 s passes with nothing new (the log sent; only keep-alives would follow)."""
    s.settimeout(1.0)
    while True:
        try:
            if not s.recv(1 << 20):
                return
        except TimeoutError:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--case", choices=["big", "many", "small"], action="append")
    args = parser.parse_args()
    for case in args.case or ["small", "many", "big"]:
        run(case, args.streams)


if __name__ == "__main__":
    main()

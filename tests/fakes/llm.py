"""Scripted loopback servers speaking the OpenAI chat-completions and Anthropic messages formats.

Each test queues replies and afterwards inspects the requests the server received. The servers
check the API key like the real ones and answer 500 with a clear message once the script runs out.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "API_KEY",
    "FakeLLM",
    "Received",
    "Reply",
    "anthropic_message",
    "openai_completion",
    "openai_tool_call",
    "wire_problem",
]

API_KEY = "sk-fake-test-key"


@dataclass
class Received:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    """A scripted HTTP answer: `body` is sent as JSON (or with the Content-Type in `headers`),
    or as is when it is bytes; `cut_at`
    sends only that many bytes of it (announcing them all) and drops the connection; `trickle`
    sends it one byte every that many seconds, each in time for a read timeout."""

    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    cut_at: int | None = None
    trickle: float | None = None


Step = Reply | Callable[[Received], Reply]


class FakeLLM:
    """A tiny HTTP server on 127.0.0.1 that plays scripted replies to POSTs on `path`."""

    def __init__(self, flavor: str, *, strict: bool = False) -> None:
        if flavor not in ("openai", "anthropic"):
            raise ValueError(flavor)
        self.flavor = flavor
        # strict: refuse a conversation the real API would refuse, with a 400 as it does
        self.strict = strict
        self.path = "/v1/chat/completions" if flavor == "openai" else "/v1/messages"
        self.received: list[Received] = []
        self.script: deque[Step] = deque()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real APIs do

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                got = Received(
                    "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                reply = fake._answer(got)
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body)
                data = data if isinstance(data, bytes) else data.encode()
                self.send_response(reply.status)
                if "content-type" not in {k.lower() for k in reply.headers}:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if reply.cut_at is not None:
                    self.wfile.write(data[: reply.cut_at])
                    self.close_connection = True
                    return
                if reply.trickle is not None:
                    for i in range(len(data)):
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        time.sleep(reply.trickle)
                    return
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The base URL each SDK expects: with `/v1` for OpenAI, without for Anthropic."""
        root = f"http://127.0.0.1:{self.port}"
        return root + "/v1" if self.flavor == "openai" else root

    def queue(self, *steps: Step | dict[str, Any]) -> None:
        """Queue replies: a body (answered with 200), a `Reply`, or a function of the request."""
        with self._lock:
            for s in steps:
                self.script.append(Reply(s) if isinstance(s, dict) else s)

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [r.body for r in self.received]

    def _authorized(self, got: Received) -> bool:
        bearer = got.headers.get("authorization") == f"Bearer {API_KEY}"
        if self.flavor == "openai":
            return bearer
        return bearer or got.headers.get("x-api-key") == API_KEY

    def _answer(self, got: Received) -> Reply:
        with self._lock:
            self.received.append(got)
            if got.path != self.path:
                return Reply({"error": {"message": f"no route {got.path}"}}, 404)
            if not self._authorized(got):
                kind = "authentication_error"
                return Reply({"error": {"type": kind, "message": "invalid x-api-key"}}, 401)
            problem = wire_problem(self.flavor, got.body) if self.strict else None
            if problem is not None:
                return Reply({"error": {"type": "invalid_request_error", "message": problem}}, 400)
            if not self.script:
                return Reply({"error": {"message": "fake server: script exhausted"}}, 500)
            step = self.script.popleft()
        return step(got) if callable(step) else step

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (a timeout test) leaves a broken pipe: expected, not news.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


# -- what the real APIs refuse -------------------------------------------------------------------

_TOOL_USE_ID = re.compile(r"[a-zA-Z0-9_-]+")
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def wire_problem(flavor: str, body: Any) -> str | None:
    """Why the real API would refuse this request's conversation with a 400, or None: each
    tool call answered by exactly one result right after it, roles in order, no blank text, and
    (Anthropic) tools defined when the conversation holds tool blocks."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    if flavor == "openai":
        return _openai_problem(messages)
    return (
        _tools_problem(body, messages)
        or _thinking_problem(body.get("thinking"), messages)
        or _anthropic_problem(messages)
    )


def _tools_problem(body: dict[str, Any], messages: list[Any]) -> str | None:
    """The messages API wants `tools` defined (each named as it allows) whenever the
    conversation holds `tool_use` or `tool_result` blocks, even with `tool_choice` none."""
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            return f"tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
    blocks = [b for m in messages if isinstance(m.get("content"), list) for b in m["content"]]
    if not tools and any(b.get("type") in ("tool_use", "tool_result") for b in blocks):
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    return None


_THINKING = ("thinking", "redacted_thinking")


def _thinking_problem(thinking: Any, messages: list[Any]) -> str | None:
    """The API keeps one thinking mode per assistant turn, and a tool-use loop is part of the
    turn (it ends at the next user message that is not only tool results): with thinking on, a
    last turn that uses tools must start with a thinking block; with it off, none may hold one."""
    start = 0
    for i, m in enumerate(messages):
        blocks = m.get("content")
        if m.get("role") == "user" and not (
            isinstance(blocks, list) and all(b.get("type") == "tool_result" for b in blocks)
        ):
            start = i + 1
    turn = [
        (i, m["content"])
        for i, m in enumerate(messages[start:], start)
        if m.get("role") == "assistant" and isinstance(m.get("content"), list)
    ]
    on = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    if on:
        uses = any(b.get("type") == "tool_use" for _, blocks in turn for b in blocks)
        i, blocks = turn[0] if turn else (0, [])
        first = blocks[0].get("type") if blocks else None
        if uses and first not in _THINKING:
            return (
                f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                f"found `{first}`. When `thinking` is enabled, a final "
                "`assistant` message must start with a thinking block (preceeding the lastmost "
                "set of `tool_use` and `tool_result` blocks)"
            )
        return None
    for i, blocks in turn:
        for j, b in enumerate(blocks):
            if b.get("type") in _THINKING:
                return (
                    f"messages.{i}.content.{j}: When thinking is disabled, an `assistant` message "
                    "in the final position cannot contain `thinking`. To use thinking blocks, "
                    "enable `thinking` in your request."
                )
    return None


def _openai_problem(messages: list[Any]) -> str | None:
    i = 0
    while i < len(messages):
        m = messages[i]
        role = m.get("role")
        if role == "tool":
            return f"messages.[{i}]: a 'tool' message must answer a preceding 'tool_calls'"
        i += 1
        if role != "assistant" or not m.get("tool_calls"):
            continue
        ids = [c.get("id") for c in m["tool_calls"]]
        if not all(isinstance(c, str) and c for c in ids) or len(set(ids)) != len(ids):
            return f"messages.[{i - 1}].tool_calls: ids must be distinct non-empty strings"
        for j, call in enumerate(m["tool_calls"]):
            name = (call.get("function") or {}).get("name")
            if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
                return (
                    f"Invalid 'messages[{i - 1}].tool_calls[{j}].function.name': string does not "
                    "match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
                )
        for j, call_id in enumerate(ids):
            if len(call_id) > 40:
                return (
                    f"Invalid 'messages[{i - 1}].tool_calls[{j}].id': string too long. Expected "
                    f"a string with maximum length 40, but got a string with length {len(call_id)}"
                )
        answered: list[Any] = []
        while i < len(messages) and messages[i].get("role") == "tool":
            answered.append(messages[i].get("tool_call_id"))
            i += 1
        if sorted(answered) != sorted(ids):
            return (
                f"An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id': expected {ids}, got {answered}"
            )
    return None


def _anthropic_problem(messages: list[Any]) -> str | None:
    seen: set[str] = set()
    for i, m in enumerate(messages):
        role = m.get("role")
        if role != ("user" if i % 2 == 0 else "assistant"):
            return f"messages.{i}: roles must alternate, starting with 'user'"
        blocks = m.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        if not isinstance(blocks, list) or not blocks:
            return f"messages.{i}: all messages must have non-empty content"
        for j, b in enumerate(blocks):
            if b.get("type") == "text" and not str(b.get("text", "")).strip():
                blank = "text content blocks must contain non-whitespace text"
                return f"messages.{i}.content.{j}: {blank}"
            if b.get("type") == "tool_use":
                if not isinstance(b.get("id"), str) or not _TOOL_USE_ID.fullmatch(b["id"]):
                    return f"messages.{i}.content.{j}.id: String should match pattern"
                if b["id"] in seen:
                    return f"messages.{i}.content.{j}: `tool_use` ids must be unique"
                seen.add(b["id"])
                if not isinstance(b.get("input"), dict):
                    return f"messages.{i}.content.{j}.input: Input should be a valid dictionary"
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if results:
            before = messages[i - 1]["content"] if i else []
            asked = [
                b.get("id") for b in before if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
            if blocks[: len(results)] != results or any(
                r.get("tool_use_id") not in asked for r in results
            ):
                return (
                    f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` "
                    "blocks: each must answer a `tool_use` of the previous message, first"
                )
        if uses:
            following = messages[i + 1]["content"] if i + 1 < len(messages) else []
            if isinstance(following, str):
                following = []
            answered = [b.get("tool_use_id") for b in following if b.get("type") == "tool_result"]
            if sorted(answered) != sorted(uses):
                return (
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: expected {uses}, got {answered}"
                )
    return None


# -- response builders --------------------------------------------------------------------------


def openai_tool_call(call_id: str, name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """One tool call of an assistant message; `arguments` is sent as given when a string."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def openai_completion(
    text: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    usage: tuple[int, int] = (10, 5),
    model: str = "fake-model",
) -> dict[str, Any]:
    """A chat-completion body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        },
    }


def anthropic_message(
    *blocks: dict[str, Any] | str,
    usage: dict[str, Any] | None = None,
    model: str = "fake-claude",
) -> dict[str, Any]:
    """A messages-API body; a plain string is a text block, dicts are taken as blocks."""
    content = [{"type": "text", "text": b} if isinstance(b, str) else b for b in blocks]
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 10, "output_tokens": 5},
    }

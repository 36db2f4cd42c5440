"""Child for the crash tests of a turn Anthropic paused (`stop_reason: "pause_turn"`): this
process drives an agent on the real `anthropic` client against the parent's loopback fake, and
the parent SIGKILLs it while the fake holds a continuation.

Run as `python -m tests._pause_child STORE_URL BASE_URL MAX_TOKENS [SESSION_ID]` (0 for no
budget); it prints `{"event": "ready"}` once its runtime is open, then drives one turn (with a
session id, the retry of that session's failed turn), which the parent kills.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import signoff as so

from .fakes.llm import API_KEY, Received, Reply, anthropic_message

__all__ = ["PARTS", "FINAL", "PausingLLM", "pause_agent"]

PROMPT = "What is the refund policy?"
SEARCH = {
    "type": "server_tool_use",
    "id": "srvtoolu_01",
    "name": "web_search",
    "input": {"query": "refund policy"},
}
RESULTS = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01",
    "content": [{"type": "web_search_result", "url": "https://example.com", "title": "Policy"}],
}
PARTS: list[tuple[str, dict[str, Any], tuple[int, int]]] = [
    ("Searching. ", SEARCH, (100, 20)),
    ("Reading. ", RESULTS, (101, 21)),
]
"""The turn's paused parts, in order: text, a server tool's block, (input, output) tokens."""
FINAL = ("Refunds take 5 days.", (150, 30))
PRICE = (3.0, 15.0)  # USD per million input, output tokens


def cost(tokens: tuple[int, int]) -> float:
    return (tokens[0] * PRICE[0] + tokens[1] * PRICE[1]) / 1_000_000


def pause_agent(base_url: str, *, max_tokens: int | None = None) -> so.Agent:
    """The support agent on Claude through `base_url`, with no tools of its own."""
    claude = so.models.Anthropic(
        "claude-haiku-4-5",
        base_url=base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=PRICE,
    )
    limits = so.Limits(max_tokens=max_tokens) if max_tokens else so.Limits()
    return so.Agent(name="support", model=claude, tools=[], limits=limits)


class PausingLLM:
    """A reply function for `FakeLLM`: it answers by what the request sends back, as the API
    continues a paused turn from it: no paused part yet gets the first, one gets the second,
    both get the final answer. With `hold`, the first request sending back that many parts
    (2: the one for the final answer) waits until `release` and is then dropped unanswered (its
    client was killed meanwhile)."""

    def __init__(self, *, hold: int | None = None) -> None:
        self.hold = hold
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.billed: list[tuple[int, int]] = []  # the usage of each reply sent, in order
        self.parts_sent_back: list[int] = []  # for each request, how many parts it sent back

    def __call__(self, got: Received) -> Reply:
        messages = got.body["messages"]
        last = messages[-1]
        k = 0
        if last["role"] == "assistant":
            k = sum(1 for b in last["content"] if b.get("type") == "text")
        with self.lock:
            self.parts_sent_back.append(k)
            holding = k == self.hold and not self.held.is_set()
        if holding:
            self.held.set()
            self.release.wait(60)
            return Reply(b"", cut_at=0)
        if k < len(PARTS):
            text, block, usage = PARTS[k]
            body = anthropic_message(
                text, block, usage={"input_tokens": usage[0], "output_tokens": usage[1]}
            )
            body["stop_reason"] = "pause_turn"
        else:
            text, usage = FINAL
            body = anthropic_message(
                text, usage={"input_tokens": usage[0], "output_tokens": usage[1]}
            )
        with self.lock:
            self.billed.append(usage)
        return Reply(body)

    @property
    def billed_usage(self) -> tuple[int, int, float]:
        """What the replies sent billed: input and output tokens and cost."""
        return (
            sum(u[0] for u in self.billed),
            sum(u[1] for u in self.billed),
            sum(cost(u) for u in self.billed),
        )


async def run(store: str, base_url: str, max_tokens: int, session_id: str | None) -> None:
    agent = pause_agent(base_url, max_tokens=max_tokens or None)
    async with so.Runtime([agent], store=store, lease_ttl=2.0) as rt:
        print(json.dumps({"event": "ready"}), flush=True)
        if session_id:
            r = await rt.generate(session_id=session_id)
        else:
            r = await rt.generate("support", prompt=PROMPT)
        print(json.dumps({"event": "result", "status": r.status, "text": r.text}), flush=True)


def main(argv: list[str]) -> Any:
    store, base_url, max_tokens, *session_id = argv
    asyncio.run(run(store, base_url, int(max_tokens), session_id[0] if session_id else None))


if __name__ == "__main__":
    main(sys.argv[1:])

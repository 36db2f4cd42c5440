"""Child for the crash test of a model reply that arrived but was not journaled: this process
drives an agent on the real `openai` client against the parent's loopback fake, says when the
reply came, and then waits for the parent's SIGKILL before the engine records it.

Run as `python -m tests._reply_crash_child STORE_URL BASE_URL`.
"""

from __future__ import annotations

import asyncio
import json
import sys

import signoff as so
from signoff.models import ModelRequest

from .fakes.llm import API_KEY

__all__ = ["PROMPT", "crash_agent"]

PROMPT = "What is the refund policy?"


def crash_agent(
    base_url: str, model: type[so.models.OpenAIChat] = so.models.OpenAIChat
) -> so.Agent:
    """The support agent on gpt-4.1-mini through `base_url`, with no tools."""
    llm = model("gpt-4.1-mini", base_url=base_url, api_key=API_KEY, max_retries=0)
    return so.Agent(name="support", model=llm, tools=[])


class _HeldAfterReply(so.models.OpenAIChat):
    """The reply is received (and billed) whole, then held: the process dies before the engine
    journals it."""

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        response = await super().complete(request)
        print(json.dumps({"event": "replied", "text": response.text}), flush=True)
        await asyncio.Event().wait()
        return response


async def run(store: str, base_url: str) -> None:
    async with so.Runtime([crash_agent(base_url, _HeldAfterReply)], store=store) as rt:
        print(json.dumps({"event": "ready"}), flush=True)
        await rt.generate("support", prompt=PROMPT)


if __name__ == "__main__":
    asyncio.run(run(*sys.argv[1:]))

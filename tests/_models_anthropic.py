"""The `Anthropic` tests' scripted server: a strict fake messages-API server on loopback, a model
that talks to it, and the tool_use and thinking blocks the tests script.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import signoff as so

from .fakes.llm import (
    API_KEY,
    FakeLLM,
)

__all__ = [
    "fake",
    "model",
    "THOUGHT",
    "tool_use",
]


def tool_use(call_id: str, name: str, input: object) -> dict[str, object]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": input}


THOUGHT = {"type": "thinking", "thinking": "Look the order up.", "signature": "sig=="}


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM("anthropic", strict=True) as server:
        yield server


@pytest.fixture
async def model(fake: FakeLLM) -> AsyncIterator[so.models.Anthropic]:
    m = so.models.Anthropic(
        "claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY, max_retries=0
    )
    yield m
    await m.aclose()

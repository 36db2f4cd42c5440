"""The `OpenAIChat` tests' scripted server: a strict fake OpenAI-compatible server on loopback
and a model that talks to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

import signoff as so

from .fakes.llm import API_KEY, FakeLLM

__all__ = [
    "fake",
    "model",
]


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM("openai", strict=True) as server:
        yield server


@pytest.fixture
async def model(fake: FakeLLM) -> AsyncIterator[so.models.OpenAIChat]:
    m = so.models.OpenAIChat("gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY, max_retries=0)
    yield m
    await m.aclose()

"""A model's base URL as its repr and its errors show it: a password in it (a gateway's basic
auth) is left out, since a model's error is recorded in the session's log, which anyone who may
read the session reads."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import signoff as so
from signoff.models._provider import shown_url

from ._models import request
from .fakes.llm import API_KEY


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MODELS: dict[str, tuple[Any, str]] = {
    "openai": (so.models.OpenAIChat, "/v1"),
    "anthropic": (so.models.Anthropic, ""),
}


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_a_password_in_the_base_url_is_not_shown_nor_recorded(name: str) -> None:
    make, path = MODELS[name]
    base = f"http://bob:hunter2@127.0.0.1:{_closed_port()}{path}"
    async with make("m", base_url=base, api_key=API_KEY, max_retries=0) as m:
        assert "hunter2" not in repr(m) and "bob:***@127.0.0.1" in repr(m)
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert "hunter2" not in str(info.value) and "bob:***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://localhost:11434/v1", "http://localhost:11434/v1"),
        ("https://gw.example/v1?api-version=1", "https://gw.example/v1?api-version=1"),
        ("https://bob:s3cret@gw.example:8443/v1", "https://bob:***@gw.example:8443/v1"),
        ("https://:s3cret@gw.example/v1", "https://:***@gw.example/v1"),
        ("https://bob@gw.example/v1", "https://bob@gw.example/v1"),
    ],
)
def test_shown_url_leaves_out_only_the_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown

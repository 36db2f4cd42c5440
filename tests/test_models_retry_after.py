"""A failed reply asking to wait longer than a call waits (`Retry-After` past `MAX_RETRY_WAIT`,
120 s, the openai SDK's own limit): not retried, on both SDKs, and the turn's failure says how
long the server asked to wait. Before, the anthropic SDK slept as long as it was told and the
call gave up only at its bound ((3 * max_retries + 2) * timeout: 960 s by default), holding the
turn and its session meanwhile; and neither message said why no retry was made."""

from __future__ import annotations

import re
import time
from email.utils import formatdate
from pathlib import Path

import pytest

import signoff as so
from signoff.models._retry_after import asked_wait

from ._models import request
from .fakes.llm import API_KEY, FakeLLM, Reply, anthropic_message, openai_completion

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
RATE_LIMITED = {"error": {"type": "rate_limit_error", "message": "slow down"}}


def _model(flavor: str, fake: FakeLLM) -> so.models.OpenAIChat | so.models.Anthropic:
    if flavor == "openai":
        return so.models.OpenAIChat("gpt-4.1-mini", base_url=fake.base_url, api_key=API_KEY)
    return so.models.Anthropic("claude-haiku-4-5", base_url=fake.base_url, api_key=API_KEY)


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("headers", "shown"),
    [
        ({"retry-after": "86400"}, "86,400 s"),
        ({"retry-after-ms": "3600000"}, "3,600 s"),
        ({"retry-after": "1e400"}, "for ever"),
    ],
    ids=["a day", "an hour in ms", "for ever"],
)
async def test_a_wait_past_the_limit_fails_the_call_at_once_saying_so(
    flavor: str, headers: dict[str, str], shown: str
) -> None:
    """Default settings (max_retries=2, timeout=120): one request and a failure within seconds.
    Before, on Anthropic, the call slept until its 960 s bound."""
    body = RATE_LIMITED if flavor == "openai" else OVERLOADED
    status = 429 if flavor == "openai" else 529
    with FakeLLM(flavor) as fake:
        fake.queue(Reply(body, status, headers), Reply(body, status, headers))
        async with _model(flavor, fake) as m:
            started = time.monotonic()
            with pytest.raises(so.ModelError, match=f"HTTP {status}") as caught:
                await m.complete(request())
            took = time.monotonic() - started
        assert len(fake.received) == 1
    assert took < 5
    assert f"the server asks to wait {shown} before a retry, over the 120 s" in str(caught.value)


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
async def test_a_short_wait_is_waited_for_and_the_call_retried(flavor: str) -> None:
    body = RATE_LIMITED if flavor == "openai" else OVERLOADED
    status = 429 if flavor == "openai" else 529
    ok = openai_completion("there") if flavor == "openai" else anthropic_message("there")
    with FakeLLM(flavor) as fake:
        fake.queue(Reply(body, status, {"retry-after": "0.2"}), ok)
        async with _model(flavor, fake) as m:
            assert (await m.complete(request())).text == "there"
        assert len(fake.received) == 2


async def test_the_turn_fails_retryably_saying_how_long_to_wait(tmp_path: Path) -> None:
    with FakeLLM("anthropic") as fake:
        fake.queue(Reply(OVERLOADED, 529, {"retry-after": formatdate(time.time() + 86400)}))
        model = _model("anthropic", fake)
        async with so.Runtime(
            [so.Agent(name="a", model=model)], store=f"sqlite:///{tmp_path}/s.db"
        ) as rt:
            r = await rt.generate("a", prompt="hi")
            state = await rt.state(r.session_id)
        await model.aclose()
    assert (r.status, r.retryable) == ("failed", True)
    assert r.error is not None and r.error["code"] == "model_error"
    # A date a day away, to the second, read a moment later.
    assert re.search(r"asks to wait 86,(39\d|400) s before a retry", r.error["message"])
    assert state.usage == so.Usage()


def test_the_wait_is_read_as_the_sdks_read_it() -> None:
    assert asked_wait({}) is None
    assert asked_wait({"retry-after": "soon"}) is None
    assert asked_wait({"retry-after": "nan"}) is None
    assert asked_wait({"retry-after": "5", "retry-after-ms": "250"}) == 0.25
    assert asked_wait({"retry-after": "5", "retry-after-ms": "x"}) == 5.0
    past = asked_wait({"retry-after": formatdate(time.time() - 60)})
    assert past is not None and past < 0

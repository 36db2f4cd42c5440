"""What a dashboard answer form posts beyond its card's fields is held to the API's rules: the
hash of the call seen and an edit, sent to a question or a session limit, are refused as
`POST /v1/sessions/{id}/responses` refuses them, and nothing is recorded."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

import signoff as so
from signoff.testing import reply, scripted_agent, store_contents

from .test_server_common import ALICE, auth, in_process

JSON = {"Accept": "application/json"}


def _limited() -> so.Agent:
    """An agent whose second turn stops at its session's token limit and asks whether to go on."""
    spent = so.Usage(input_tokens=600, output_tokens=600)
    steps = [reply("one", usage=spent), reply("two")]
    return scripted_agent("limited", steps, limits=so.Limits(max_tokens=1000), repeat_last=True)


async def _csrf(c: httpx.AsyncClient, path: str) -> str:
    found = re.search(r'name="csrf-token" content="([^"]+)"', (await c.get(path)).text)
    assert found is not None, path
    return found.group(1)


async def test_a_hash_or_an_edit_posted_to_a_question_or_a_limit_is_refused_as_the_api_does(
    store_url: str,
) -> None:
    """The form read a question's (or a session limit's) option and text only: a stale
    `input_hash` (409 `stale_answer` from the API) or an `edited_input` (422 `invalid_answer`)
    posted with the option was dropped unchecked, and the answer recorded. Now the runtime
    judges them as it judges the API's; the form that posts neither is answered as before."""
    async with in_process(store_url, agents=[_limited()]) as (rt, c):
        asked = await rt.generate("helper", prompt="replace it", auth=ALICE)
        (question,) = asked.pending
        limit = await rt.generate("limited", prompt="go", auth=ALICE)
        limit = await rt.send(limit.session_id, "more", principal=ALICE)
        (prompt,) = limit.pending
        assert (question.kind, prompt.kind) == ("question", "session-limit")
        assert question.action is not None and prompt.action is None
        small = question.options[0].id
        proposed = json.dumps(question.input)  # the call as proposed is an edit here too
        sent: list[tuple[so.InputRequest, dict[str, str], int, str]] = [
            (question, {"option": small, "input_hash": "sha256:0000"}, 409, "stale_answer"),
            (question, {"option": small, "edited_input": '{"a": 1}'}, 422, "invalid_answer"),
            (question, {"option": small, "edited_input": proposed}, 422, "invalid_answer"),
            (question, {"option": small, "edited_input": "{not json"}, 422, "invalid_answer"),
            (prompt, {"option": "continue", "input_hash": "sha256:0000"}, 422, "invalid_answer"),
            (prompt, {"option": "continue", "edited_input": '{"a": 1}'}, 422, "invalid_answer"),
        ]
        login = {"token": "alice-token", "csrf": await _csrf(c, "/_signoff/login")}
        assert (await c.post("/_signoff/login", data=login)).status_code == 303
        csrf = await _csrf(c, "/_signoff/")
        for request, fields, status, code in sent:
            before = await store_contents(rt.store, request.session_id)
            form = {"csrf": csrf, **fields}
            r = await c.post(f"/_signoff/requests/{request.id}/respond", data=form, headers=JSON)
            assert r.status_code == status, (fields, r.text)
            assert r.json()["error"]["code"] == code, (fields, r.text)
            if fields.get("edited_input") == "{not json":  # no API answer can be sent of it
                assert "not JSON" in r.json()["error"]["message"]
            else:  # the API's refusal, in its words
                api = await c.post(
                    f"/v1/sessions/{request.session_id}/responses",
                    json={"inputResponses": [_api_answer(request.id, fields)]},
                    headers=auth("alice-token"),
                )
                assert api.status_code == status, api.text
                assert api.json()["error"]["message"] == r.json()["error"]["message"]
            assert await store_contents(rt.store, request.session_id) == before, fields
        for request, option in ((question, small), (prompt, "continue")):
            form = {"csrf": csrf, "option": option}
            r = await c.post(f"/_signoff/requests/{request.id}/respond", data=form, headers=JSON)
            assert r.status_code == 200 and r.json()["outcome"] == "answered", r.text


def _api_answer(request_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """The API's answer of a form's fields."""
    answer: dict[str, Any] = {"requestId": request_id, "optionId": fields.get("option")}
    if "input_hash" in fields:
        answer["inputHash"] = fields["input_hash"]
    if "edited_input" in fields:
        answer["editedInput"] = json.loads(fields["edited_input"])
    return answer

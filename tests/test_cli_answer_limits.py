"""`signoff answer` without a runtime (record only) bounds a free-text answer as the asking tool
does, by the bound the question recorded: the command has no tool to ask."""

from __future__ import annotations

import json

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._cli import invoke


@so.tool(max_result_bytes=500)
async def asker(ctx: so.ToolContext) -> str:
    """Ask a name."""
    return str((await ctx.ask("Your name?", allow_text=True)).value)


def test_answer_without_runtime_refuses_an_answer_the_asking_tool_could_not_return(
    store_url: str,
) -> None:
    """`signoff answer --text` without MODULE:RUNTIME (as Scale-out advises) took an answer
    over the asking tool's `max_result_bytes`: the resumed call ended in an error, the answer
    lost, the question never asked again. Refused now as a runtime with the tool refuses it,
    and the question stays open; one that fits is recorded."""
    named = scripted_agent("named", [call_tools(call("asker")), reply("ok")], tools=[asker])
    rt = so.Runtime([named], store=store_url)
    try:
        (question,) = rt.generate_sync("named", "hi").pending
    finally:
        rt.close_sync()
    refused = invoke("answer", question.id, "--store", store_url, "--text", "x" * 2000)
    assert refused.exit_code == 1, refused.output
    assert refused.stderr.startswith(
        f"error: InvalidAnswer: request {question.id}: the answer is 2002 bytes, over the limit "
        "of 500 bytes (max_result_bytes of asker)"
    )
    pending = json.loads(invoke("pending", "--store", store_url, "--json").stdout)
    assert [r["id"] for r in pending] == [question.id]
    taken = invoke("answer", question.id, "--store", store_url, "--text", "x" * 498)
    assert taken.exit_code == 0, taken.output
    assert json.loads(invoke("pending", "--store", store_url, "--json").stdout) == []

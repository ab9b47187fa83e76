"""Tool registry and calls, the time_now tool, the demo provider, retries and OpenAI error classification."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest
from aiohttp import web

from bot.providers.demo import HELP, DemoProvider
from bot.providers.openai_compat import classify
from bot.tools.time_now import time_now_tool
from core.errors import CoreError, ProviderError, SchemaCheckError, ToolError
from core.providers import ChatMessage, CompletionRequest, RetryPolicy, complete_with_retries
from core.tool_schema import ArgumentSchema
from core.tools import Risk, Tool, ToolContext, ToolRegistry, offered_in, precheck_call, run_tool
from tests.fakes.core import FlakyProvider

CTX = ToolContext(session_id="s", turn_id=1, agent="default", sender="U1")
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
          "additionalProperties": False}


def make_tool(name: str = "echo", parameters: dict[str, Any] | None = None, timeout_s: float = 5.0,
              result: str = "ok", wait: asyncio.Event | None = None) -> Tool:
    async def function(_ctx: ToolContext, _args: dict[str, Any]) -> str:
        if wait is not None:
            await wait.wait()
        return result

    return Tool(name=name, description="d", parameters=parameters or SCHEMA, risk=Risk.SAFE,
                function=function, timeout_s=timeout_s)



def test_register_rejects_duplicates() -> None:
    registry = ToolRegistry()
    registry.register(make_tool("a"))
    with pytest.raises(CoreError, match="registered twice"):
        registry.register(make_tool("a"))


def test_register_rejects_invalid_schema() -> None:
    with pytest.raises(jsonschema.SchemaError):
        ToolRegistry().register(make_tool("bad", parameters={"type": "no-such-type"}))


@pytest.mark.parametrize("ref", [
    {"$ref": "REMOTE"}, {"$dynamicRef": "REMOTE#meta"}, {"anyOf": [{"type": "integer"}, {"$ref": "REMOTE"}]},
    {"$ref": "file:///etc/passwd"}, {"$ref": "other.json#/q"},
])
async def test_a_schema_never_makes_the_bot_fetch_anything(ref: dict[str, Any], aiohttp_server: Any) -> None:
    # The review's finding: jsonschema resolved a remote $ref itself (urlopen, on the loop, no timeout).
    hits: list[str] = []

    async def schema(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"type": "string"})

    app = web.Application()
    app.router.add_get("/{tail:.*}", schema)
    server = await aiohttp_server(app)
    remote = str(server.make_url("/schema.json"))
    parameters = json.loads(json.dumps({"type": "object", "properties": {"q": ref}}).replace("REMOTE", remote))
    with pytest.raises(CoreError, match="refers outside itself"):
        make_tool("fetcher", parameters=parameters)
    # Even a schema that slipped past that check resolves nothing: the empty registry answers.
    with pytest.raises(SchemaCheckError, match="not resolved"):
        ArgumentSchema(parameters).first_error({"q": "x"})
    assert hits == []


def test_references_inside_the_schema_still_work() -> None:
    tool = make_tool("local", parameters={"type": "object", "$defs": {"q": {"type": "string", "maxLength": 3}},
                                          "properties": {"q": {"$ref": "#/$defs/q"}}})
    assert tool.parse_arguments({"q": "abc"}) == {"q": "abc"}
    with pytest.raises(ToolError, match=r"\(q\): 'abcd' is too long"):
        tool.parse_arguments({"q": "abcd"})


@pytest.mark.parametrize("where", ["pattern", "patternProperties"])
def test_a_backtracking_pattern_is_cut_off_not_run_for_minutes(where: str) -> None:
    # With re, "^(a|aa)+$" against 40 a's and a b takes about 20 s of the event loop (1.6x per character).
    bad = "^(a|aa)+$"
    subject = "a" * 40 + "b"
    if where == "pattern":
        tool = make_tool("redos", parameters={"type": "object",
                                              "properties": {"q": {"type": "string", "pattern": bad}}})
        args: dict[str, Any] = {"q": subject}
    else:
        tool = make_tool("redos", parameters={"type": "object", "patternProperties": {bad: {"type": "string"}}})
        args = {subject: "x"}
    with pytest.raises(ToolError, match="could not be checked: checking the arguments took too long"):
        tool.parse_arguments(args)
    # Ordinary patterns still decide as before.
    good = make_tool("ok", parameters={"type": "object", "properties": {"q": {"type": "string", "pattern": "^a+$"}}})
    assert good.parse_arguments({"q": "aaa"}) == {"q": "aaa"}
    with pytest.raises(ToolError, match="does not match"):
        good.parse_arguments({"q": "b"})


def test_allowed_globs_and_get() -> None:
    registry = ToolRegistry()
    for name in ("time_now", "time_zone", "shell_run", "schedule_list"):
        registry.register(make_tool(name))
    assert [t.name for t in registry.allowed(["time_*"])] == ["time_now", "time_zone"]
    assert [t.name for t in registry.allowed(["shell_run", "sched*"])] == ["schedule_list", "shell_run"]
    assert len(registry.allowed(["*"])) == 4
    assert registry.allowed([]) == []
    assert registry.get("nope") is None
    assert registry.names() == ["schedule_list", "shell_run", "time_now", "time_zone"]
    assert registry.allowed(["shell_run"])[0].spec() == {
        "type": "function", "function": {"name": "shell_run", "description": "d", "parameters": SCHEMA}}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ('{"n": "five"}', r"invalid arguments for echo \(n\)"),
        ("{}", "'n' is a required property"),
        ('{"n": 1, "x": 2}', "Additional properties"),
    ],
)
def test_parse_arguments_errors(raw: str, match: str) -> None:
    with pytest.raises(ToolError, match=match):
        make_tool().parse_arguments(raw)


def test_parse_arguments_accepts_json_dict_and_empty() -> None:
    tool = make_tool(parameters={"type": "object"})
    assert tool.parse_arguments('{"n": 3}') == {"n": 3}
    assert tool.parse_arguments({"n": 3}) == {"n": 3}
    assert tool.parse_arguments("") == {}
    assert tool.parse_arguments(None) == {}


async def test_run_tool_result_and_timeout() -> None:
    assert await run_tool(make_tool(result="fine"), CTX, {}) == "fine"
    never = asyncio.Event()
    with pytest.raises(ToolError, match=r"echo timed out after 0\.01 s"):
        await run_tool(make_tool(timeout_s=0.01, wait=never), CTX, {})


async def test_run_tool_wraps_exceptions() -> None:
    async def broken(_ctx: ToolContext, _args: dict[str, Any]) -> str:
        raise KeyError("gone")

    tool = Tool(name="broken", description="d", parameters={"type": "object"}, risk=Risk.SAFE, function=broken)
    with pytest.raises(ToolError, match="broken failed: KeyError"):
        await run_tool(tool, CTX, {})


async def test_a_tools_own_checks_are_tool_errors_and_a_failing_offer_check_hides_it() -> None:
    async def refuse(_ctx: ToolContext, args: dict[str, Any]) -> None:
        if args.get("n") == 1:
            raise ToolError("not that one")
        raise KeyError("gone")

    async def offered(ctx: ToolContext) -> bool:
        if ctx.place is None:
            raise RuntimeError("no place")
        return ctx.place.startswith("here:")

    tool = Tool(name="picky", description="d", parameters=SCHEMA, risk=Risk.SAFE, function=make_tool().function,
                check=lambda args: "n must be odd" if args["n"] % 2 == 0 else None, precheck=refuse, offered=offered)
    with pytest.raises(ToolError, match="invalid arguments for picky: n must be odd"):
        tool.parse_arguments({"n": 2})
    with pytest.raises(ToolError, match=r"^not that one$"):
        await precheck_call(tool, CTX, {"n": 1})
    with pytest.raises(ToolError, match="picky could not be checked: KeyError"):
        await precheck_call(tool, CTX, {"n": 3})
    assert await offered_in(tool, ToolContext(session_id="s", turn_id=1, agent="a", sender=None, place="here:1"))
    assert not await offered_in(tool, CTX)  # its check failed: not offered
    assert await offered_in(make_tool(), CTX)


class FixedClock:
    def now(self) -> datetime:
        return datetime(2024, 7, 1, 10, 30, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, "2024-07-01T10:30:00+00:00 (UTC, Monday)"),
        ({"timezone": "utc"}, "2024-07-01T10:30:00+00:00 (utc, Monday)"),
        ({"timezone": "Europe/Paris"}, "2024-07-01T12:30:00+02:00 (Europe/Paris, Monday)"),
        ({"timezone": "Pacific/Kiritimati"}, "2024-07-02T00:30:00+14:00 (Pacific/Kiritimati, Tuesday)"),
    ],
)
async def test_time_now(args: dict[str, Any], expected: str) -> None:
    tool = time_now_tool(FixedClock())
    assert tool.risk is Risk.SAFE
    assert await run_tool(tool, CTX, tool.parse_arguments(args)) == expected


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../etc/passwd", "Europe/"])
async def test_time_now_unknown_zone(zone: str) -> None:
    with pytest.raises(ToolError, match="unknown time zone"):
        await run_tool(time_now_tool(FixedClock()), CTX, {"timezone": zone})



def request(text: str, *tools: str, role: str = "user") -> CompletionRequest:
    specs = [make_tool(name).spec() for name in tools]
    return CompletionRequest(instructions="i", messages=[ChatMessage(role, text)], tools=specs)


async def test_demo_time_question_calls_time_now() -> None:
    reply = await DemoProvider().complete(request("hey, what time is it?", "time_now", "shell_run"))
    assert reply.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("time_now", {})]


async def test_demo_without_tool_says_unavailable() -> None:
    reply = await DemoProvider().complete(request("what time is it", "shell_run"))
    assert reply.tool_calls == ()
    assert "time_now" in reply.content and "isn't available" in reply.content


async def test_demo_run_command() -> None:
    demo = DemoProvider()
    reply = await demo.complete(request("please run `uptime` now", "shell_run"))
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("shell_run", {"command": "uptime"})]
    again = await demo.complete(request("run `df -h`", "shell_run"))
    assert again.tool_calls[0].id != reply.tool_calls[0].id


async def test_demo_plain_text_gets_help() -> None:
    reply = await DemoProvider().complete(request("hello bot", "time_now"))
    assert reply.tool_calls == ()
    assert "LLM_BASE_URL" in reply.content and "hello bot" in reply.content
    assert (await DemoProvider().complete(request("  "))).content == HELP


async def test_demo_after_tool_result_answers() -> None:
    reply = await DemoProvider().complete(request("12:00 UTC", "time_now", role="tool"))
    assert reply.tool_calls == ()
    assert "12:00 UTC" in reply.content



FAST = RetryPolicy(attempts=3, base_delay_s=0.0)


def err(kind: str = "network", retryable: bool = True, retry_after: float | None = None) -> ProviderError:
    return ProviderError(kind, f"{kind} trouble", retryable=retryable, retry_after=retry_after)


async def test_retries_retryable_then_succeeds() -> None:
    provider = FlakyProvider([err(), err("rate_limit", retry_after=0)])
    assert (await complete_with_retries(provider, request("x"), FAST)).content == "answer"
    assert provider.calls == 3


async def test_non_retryable_not_retried() -> None:
    provider = FlakyProvider([err("auth", retryable=False)])
    with pytest.raises(ProviderError) as info:
        await complete_with_retries(provider, request("x"), FAST)
    assert (info.value.kind, provider.calls) == ("auth", 1)
    assert "LLM_API_KEY" in info.value.user_message


async def test_gives_up_after_attempts() -> None:
    provider = FlakyProvider([err() for _ in range(5)])
    with pytest.raises(ProviderError):
        await complete_with_retries(provider, request("x"), FAST)
    assert provider.calls == 3


def test_delay_honours_retry_after_and_caps() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=20.0, retry_after_max_s=60.0)
    assert policy.delay(1, err(retry_after=7.5)) == 7.5
    assert policy.delay(1, err(retry_after=45)) == 45.0  # the endpoint's own: up to LLM_TIMEOUT_S
    assert policy.delay(1, err(retry_after=600)) == 60.0
    assert policy.delay(1, err(retry_after=-3)) == 0.0
    assert 0.5 <= policy.delay(1, err()) <= 1.0
    assert 4.0 <= policy.delay(4, err()) <= 8.0
    assert policy.delay(30, err()) <= 20.0


def test_unknown_kind_refused() -> None:
    with pytest.raises(ValueError):
        ProviderError("weird", "x", retryable=False)


def error_body(message: str) -> str:
    """An error answer as OpenAI (and most compatible servers) write it."""
    return json.dumps({"error": {"message": message, "type": "error"}})


@pytest.mark.parametrize(
    ("status", "message", "kind", "retryable"),
    [
        (401, "Incorrect API key", "auth", False),
        (403, "forbidden", "auth", False),
        (400, "This model's maximum context length is 8192 tokens", "context_overflow", False),
        (400, "unknown parameter", "model", False),
        (404, "model not found", "model", False),
        (500, "boom", "model", True),
        (503, "overloaded", "model", True),
        (418, "teapot", "unknown", False),
    ],
)
def test_classify(status: int, message: str, kind: str, retryable: bool) -> None:
    error = classify(status, error_body(message), {})
    assert (error.kind, error.retryable) == (kind, retryable)


def test_classify_keeps_status_and_detail() -> None:
    error = classify(401, error_body("Incorrect API key provided"), {})
    assert error.status == 401
    assert "Incorrect API key provided" in str(error)


def test_classify_takes_a_body_that_is_not_json_as_its_detail() -> None:
    error = classify(502, "<html>Bad Gateway</html>", {})
    assert (error.kind, error.retryable, error.status) == ("model", True, 502)
    assert "Bad Gateway" in str(error)


@pytest.mark.parametrize(("header", "expected"), [("12", 12.0), ("0.5", 0.5), ("soon", None), (None, None)])
def test_classify_rate_limit_retry_after(header: str | None, expected: float | None) -> None:
    headers = {"retry-after": header} if header is not None else {}
    error = classify(429, error_body("slow down"), headers)
    assert (error.kind, error.retryable, error.retry_after) == ("rate_limit", True, expected)

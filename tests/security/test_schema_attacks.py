"""A hostile MCP server's tool schema that refers only inside itself (so it is listed) must not freeze the
bot's event loop, or break the thread, when the model calls the tool (found by the attack review of issue 32.1,
after the first fix bounded ``pattern`` only).

Validation runs on the loop, before any approval. A schema of 17 definitions, each checking the next one
twice (``allOf`` of two local ``$ref``), costs 2**17 checks of the last one (each level doubles it: at 30 the
loop never came back); ``{"allOf": [{"$ref": "#"}]}`` recursed until RecursionError, which escaped the turn.
Now every keyword is checked against one 0.25 s budget per call (core/tool_schema.py). Real gateway, real MCP
server over stdio (tests/fakes/mcp_server.py ``blowup``). The loop gaps are measured with a wide margin: the
budget is 0.25 s, the unbounded check took 7 s here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.settings import Settings
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention

FAKE = Path(__file__).resolve().parent.parent / "fakes" / "mcp_server.py"


def _blowup_entry() -> str:
    command = json.dumps([sys.executable, str(FAKE), "stdio", "blowup"])
    return f'[[mcp_servers]]\nname = "fake"\ncommand = {command}\nsandbox = false\ntimeout_s = 10\nrisk = "safe"\n'


async def _start(make_settings: Callable[..., Settings], start_gateway: Any, tmp_path: Path) -> GatewayClient:
    config = tmp_path / "bot.toml"
    config.write_text(_blowup_entry(), encoding="utf-8")
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=config))
    assert gateway.app.mcp is not None and "fake__lookup" in gateway.app.dispatcher.runner.tools.names()
    return gateway


async def test_a_listed_schema_cannot_freeze_the_loop_with_local_references(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    fake_llm.then(Reply(tool_calls=[("fake__lookup", {"q": "x"})]), Reply("looked up"))
    gaps: list[float] = []

    async def ticker() -> None:  # what /healthz, Slack's retries and every other turn would feel
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    try:
        await gateway.send_event(mention("look it up"))
        await fake_slack.wait_for("chat.postMessage", timeout=120)
        await gateway.idle(120)
    finally:
        ticking.cancel()
    worst = max(gaps)
    # The check's budget is 0.25 s per call; unbounded, this schema held the loop for seconds (doubling per
    # definition), before anyone is asked anything.
    assert worst < 3.0, f"validating one call's arguments held the event loop for {worst:.1f} s"
    assert "took too long" in str(fake_llm.requests[1]["messages"][-1]["content"])


async def test_a_self_referring_schema_is_refused_not_a_crash_of_the_turn(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    gateway = await _start(make_settings, start_gateway, tmp_path)
    fake_llm.then(Reply(tool_calls=[("fake__loop", {"q": "x"})]), Reply("looked up again"))
    await gateway.send_event(mention("look it up again", ts="1700000000.000100"))
    await fake_slack.wait_for("chat.postMessage", timeout=60)
    await gateway.idle(60)
    # Then anyone's next message in that thread: the call left without a result is re-parsed on recovery.
    fake_llm.then(Reply("hello"))
    await gateway.send_event(mention("are you there?", thread_ts="1700000000.000100"))
    await fake_slack.wait_for("chat.postMessage", 2, timeout=60)
    await gateway.idle(60)
    posts = [str(p.params.get("text", "")) for p in fake_slack.posts()]
    # Either the tool is left out when listed, or the call is refused with a message the model can use; the
    # RecursionError must not escape parse_arguments (the turn fails, and every later turn of the thread too).
    assert not any("RecursionError" in text for text in posts), posts
    assert posts[-1] == "hello", posts


def test_unique_items_on_a_model_written_array_is_not_quadratic_on_the_loop() -> None:
    """uniqueItems falls back to comparing every pair when the items do not sort (ints and strings mixed):
    6,000 items (about 40 KB of arguments a model can write) hold the loop for seconds, 4x per doubling."""
    from core.errors import ToolError

    tool = _tool({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})
    tags: list[Any] = [x for i in range(3000) for x in (i, str(i))]
    started = time.monotonic()
    tool.parse_arguments({"tags": tags})
    took = time.monotonic() - started
    assert took < 2.0, f"checking uniqueItems took {took:.1f} s of the event loop"  # pairwise: 5 s here
    with pytest.raises(ToolError, match="non-unique"):
        tool.parse_arguments({"tags": [*tags, {"a": 1, "b": [1.0]}, {"b": [1], "a": 1.0}]})
    assert tool.parse_arguments({"tags": [1, True, "1", [1], {"a": 1}]})  # JSON Schema's equality: True != 1


# -- attack review 3: what the per-keyword budget did not reach (each test failed before its fix) --------------

def _tool(parameters: dict[str, Any]) -> Any:
    from core.tools import Risk, Tool

    async def nothing(_ctx: Any, _args: dict[str, Any]) -> str:
        return ""

    return Tool(name="t", description="", risk=Risk.SAFE, function=nothing, parameters=parameters)


def _timed(tool: Any, raw: str) -> float:
    """Seconds parse_arguments held the caller; any outcome but a result or a ToolError fails the test."""
    from core.errors import ToolError

    started = time.monotonic()
    with contextlib.suppress(ToolError):
        tool.parse_arguments(raw)
    return time.monotonic() - started


async def test_a_huge_integer_in_the_arguments_is_refused_not_a_crash_of_the_turn(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path,
) -> None:
    """json.loads refuses an integer of more than 4,300 digits with a plain ValueError (Python's int/str
    conversion limit), not a JSONDecodeError: it escapes parse_arguments for every tool, whatever its schema,
    the turn fails, and the call left without a result is re-parsed (and fails again) on every later turn."""
    gateway = await _start(make_settings, start_gateway, tmp_path)
    fake_llm.then(Reply(tool_calls=[("fake__lookup", '{"q": ' + "9" * 5000 + "}")]), Reply("looked up"))
    await gateway.send_event(mention("look it up", ts="1700000000.000200"))
    await fake_slack.wait_for("chat.postMessage", timeout=60)
    await gateway.idle(60)
    fake_llm.then(Reply("hello"))
    await gateway.send_event(mention("are you there?", thread_ts="1700000000.000200"))
    await fake_slack.wait_for("chat.postMessage", 2, timeout=60)
    await gateway.idle(60)
    posts = [str(p.params.get("text", "")) for p in fake_slack.posts()]
    assert not any("ValueError" in text or "4300" in text for text in posts), posts
    assert posts[-1] == "hello", posts


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400])
def test_multiple_of_a_fraction_against_nan_infinity_or_a_big_integer_is_refused_not_a_crash(number: str) -> None:
    """json.loads accepts NaN and Infinity; jsonschema's multipleOf with a float divisor then calls int(nan)
    (ValueError) or Fraction(inf) (OverflowError), and a 401-digit integer divided by a float overflows
    before its try. A listed tool with ``"multipleOf": 0.5`` (a step) and one model-written number crash the
    turn (and its recovery) like the RecursionError did."""
    tool = _tool({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.5}}})
    _timed(tool, '{"n": ' + number + "}")  # only ToolError (or a result) may come out


def test_pattern_properties_seen_through_additional_properties_are_bounded() -> None:
    """The budget bounds ``pattern`` and ``patternProperties`` (regex with a timeout), but jsonschema's
    additionalProperties matched patternProperties' patterns itself, with the stdlib ``re`` and no timeout.
    Listed first, it ran before the bounded keyword: one 38-character property name held the loop for many
    seconds (x1.6 per character: 44 is minutes). unevaluatedProperties did the same: it is refused (below)."""
    tool = _tool({"type": "object", "additionalProperties": False, "patternProperties": {"^(a|aa)+$": {}}})
    took = _timed(tool, json.dumps({"a" * 38 + "!": 1}))
    assert took < 2.0, f"checking one property name held the event loop for {took:.1f} s"
    assert tool.parse_arguments({"aa": 1}) == {"aa": 1}  # a name a pattern covers is no additional property
    from core.errors import ToolError

    with pytest.raises(ToolError, match="Additional properties are not allowed"):
        tool.parse_arguments({"b": 1})


def test_unevaluated_properties_cannot_walk_a_fanned_out_schema_unbounded() -> None:
    """unevaluatedProperties collects what the rest of the schema evaluated (find_evaluated_property_keys_by_schema)
    by walking $ref and dependentSchemas itself, outside every keyword's budget check: 18 definitions, each whose
    dependentSchemas name the next twice (1.7 KB, far under the 8 KB an MCP schema may have), walk 2**18 times
    for a 13-byte call. 21 definitions held the loop for 104 s here."""
    depth = 18
    defs: dict[str, Any] = {f"d{i}": {"dependentSchemas": {"a": {"$ref": f"#/$defs/d{i + 1}"},
                                                           "b": {"$ref": f"#/$defs/d{i + 1}"}}}
                            for i in range(depth)}
    defs[f"d{depth}"] = {}
    schema = {"type": "object", "unevaluatedProperties": False, "$ref": "#/$defs/d0", "$defs": defs}
    assert len(json.dumps(schema)) < 8192
    from core.errors import CoreError

    with pytest.raises(CoreError, match="unevaluatedProperties, which the bot does not check"):
        _tool(schema)  # refused when the tool is read (an MCP listing leaves it out)
    fine = {"type": "object", "properties": {"unevaluatedProperties": {"type": "string"}}}  # a property's name
    assert _tool(fine).parse_arguments({"unevaluatedProperties": "x"}) == {"unevaluatedProperties": "x"}


def test_unevaluated_items_is_not_quadratic_on_the_loop() -> None:
    """unevaluatedItems looks each index up in a list of the evaluated ones (``index not in [...]``): quadratic
    in one keyword call, past the budget. 25,000 items (50 KB, the size of the uniqueItems case above)."""
    from core.errors import CoreError

    with pytest.raises(CoreError, match="unevaluatedItems"):
        _tool({"type": "object", "properties": {"a": {"items": True, "unevaluatedItems": False}}})

"""THREAD_TOKEN_BUDGET: a thread's model calls are counted (the provider's usage figures); used up, the turn
parks on Continue / Stop (the durable park approvals use); Continue adds one budget exactly once; Stop ends
the turn and says why; `/bot status` in the thread shows what was used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from core.store import Database
from core.store.budgets import BudgetStore
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import TEAM_ID, block_action, mention


async def _park(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> tuple[dict[str, Any], str]:
    """A turn whose first model call uses more than the budget (1,000), then wants another call."""
    fake_llm.then(Reply(tool_calls=[("time_now", {})]))
    root = mention("look at this " + "x" * 6_000)
    await gateway.send_event(root)
    [card] = await fake_slack.wait_for("chat.postMessage")
    buttons = card.params["blocks"][-1]["elements"]
    assert [b["text"]["text"] for b in buttons] == ["Continue", "Stop"]
    assert "This thread has used" in json.dumps(card.params["blocks"]) and "1,000-token budget" in json.dumps(
        card.params["blocks"])
    return root, buttons[0]["value"]


async def test_a_used_up_budget_parks_the_turn_until_continue(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(thread_token_budget=1_000))
    root, request_id = await _park(gateway, fake_slack, fake_llm)
    assert len(fake_llm.requests) == 1  # the second call waits
    fake_llm.then(Reply("done within the new budget"))
    await gateway.interact(block_action("approval:approve", request_id, user="U1", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert posts[1].params["text"] == "done within the new budget" and len(fake_llm.requests) == 2
    assert "Continued by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])
    # /bot status typed in that thread says what the thread used of what it may now use.
    body = urlencode({"command": "/bot", "text": "status", "user_id": "U1", "channel_id": "C1", "team_id": TEAM_ID,
                      "thread_ts": root["ts"], "response_url": "http://127.0.0.1:9/r", "trigger_id": "t", "token": "x"})
    reply = await (await gateway.interact(body)).text()
    assert "tokens of its budget used" in reply and "of 2,000 tokens" in reply


async def test_stop_ends_the_turn_and_says_why(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(thread_token_budget=1_000))
    root, request_id = await _park(gateway, fake_slack, fake_llm)
    await gateway.interact(block_action("approval:stop", request_id, user="U1", thread_ts=root["ts"]))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert "token budget" in posts[1].params["text"] and "chose Stop" in posts[1].params["text"]
    assert len(fake_llm.requests) == 1  # no model call after Stop
    assert "Stopped by <@U1>" in json.dumps(fake_slack.of("chat.update")[-1].params["blocks"])


async def test_someone_who_may_not_decide_cannot_continue(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway: GatewayClient = await start_gateway(make_settings(thread_token_budget=1_000))
    root, request_id = await _park(gateway, fake_slack, fake_llm)
    await gateway.interact(block_action("approval:approve", request_id, user="U9", thread_ts=root["ts"]))
    told = await fake_slack.wait_for("chat.postEphemeral")
    assert "can't approve" in told[0].params["text"] and len(fake_llm.requests) == 1


async def test_continue_adds_one_budget_exactly_once(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/x.db")
    await db.migrate()
    try:
        from datetime import UTC, datetime

        from core.store.tables import SessionRow

        now = datetime.now(UTC)
        async with db.write() as s:
            s.add(SessionRow(id="s:1", channel="slack", agent="default", status="idle", reply_ref="{}",
                             created_at=now, updated_at=now))
        budgets = BudgetStore(db)
        await budgets.spend("s:1", 1_500)
        assert await budgets.usage("s:1") == (1_500, None)
        assert await budgets.extend("s:1", was=1_000, now=2_000, base=1_000)
        assert not await budgets.extend("s:1", was=1_000, now=2_000, base=1_000)  # replayed after a restart
        assert await budgets.usage("s:1") == (1_500, 2_000)
    finally:
        await db.close()

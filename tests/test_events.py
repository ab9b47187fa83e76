"""Events in (SPEC §17 ``[[event_sources]]``): a stored delivery becomes a turn answered in its destination, in
the thread its key names, at the source's trust; a crash after the 202 still answers once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bot.settings import Settings
from core.store.webhook_events import WebhookEventStore
from core.webhooks.processor import event_session
from tests.bot_process import BotProcess, run_cli, slack_env
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action

SECRET = "github-webhook-secret-0123456789"
DEST = "COPS"  # the fake Slack's #ops


def _toml(tmp_path: Path, **extra: str) -> Path:
    lines = ["[[event_sources]]", 'name = "ci"', 'kind = "github"', 'secret_env = "CI_WEBHOOK_SECRET"',
             'destination = "#ops"', 'prompt = "A CI event: say what failed."']
    lines += [f"{key} = {value}" for key, value in extra.items()]
    path = tmp_path / "bot.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _workflow_run(run: int, branch: str = "main", conclusion: str = "failure") -> dict[str, Any]:
    return {"action": "completed",
            "workflow_run": {"name": "tests", "run_number": run, "head_branch": branch, "conclusion": conclusion,
                             "html_url": f"https://github.com/acme/api/actions/runs/{run}"},
            "repository": {"full_name": "acme/api"}, "sender": {"login": "octocat"}}


async def deliver(base: str, payload: dict[str, Any], delivery: str, event: str = "workflow_run",
                  secret: str = SECRET) -> int:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
               "X-Hub-Signature-256": "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}
    async with aiohttp.ClientSession() as http, http.post(f"{base}/events/ci", data=body, headers=headers) as resp:
        await resp.read()
        return resp.status


async def settled(gateway: GatewayClient, count: int, timeout: float = 10.0) -> list[Any]:
    """The events, once ``count`` of them are answered or failed (oldest first)."""
    store = WebhookEventStore(gateway.app.db)
    async with asyncio.timeout(timeout):
        while True:
            rows = await store.list(source="ci", limit=100)
            if sum(r.status in ("answered", "failed") for r in rows) >= count:
                await gateway.idle()  # and their answers posted (an event is answered once its turn is)
                return sorted(rows, key=lambda r: r.id)
            await asyncio.sleep(0.02)


def _dest_posts(fake_slack: FakeSlack) -> list[Any]:
    return [c for c in fake_slack.of("chat.postMessage") if c.params.get("channel") == DEST]


def _first_ts(fake_slack: FakeSlack) -> str:
    """The ts of the first message posted in the destination (what opened the thread)."""
    return str(next(m["ts"] for m in fake_slack.messages if m["channel"] == DEST))


async def test_two_events_with_the_same_thread_key_answer_in_one_slack_thread(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path, monkeypatch: Any,
) -> None:
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    toml = _toml(tmp_path, thread='"{repository.full_name}@{workflow_run.head_branch}"')
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=toml))
    fake_llm.then(Reply("run 1 failed in tests"))
    assert await deliver(gateway.base, _workflow_run(1), "d-1") == 202
    await settled(gateway, 1)
    fake_llm.then(Reply("run 2 failed again"), Reply("another branch"))
    assert await deliver(gateway.base, _workflow_run(2), "d-2") == 202
    await settled(gateway, 2)
    assert await deliver(gateway.base, _workflow_run(3, branch="dev"), "d-3") == 202
    rows = await settled(gateway, 3)

    first, second, other = _dest_posts(fake_slack)
    assert first.params["text"] == "run 1 failed in tests" and first.params.get("thread_ts") is None  # opens it
    assert second.params["text"] == "run 2 failed again" and second.params["thread_ts"] == _first_ts(fake_slack)
    assert other.params["text"] == "another branch" and other.params.get("thread_ts") is None  # another key
    assert [r.status for r in rows] == ["answered"] * 3
    assert rows[0].session_id == rows[1].session_id == event_session("ci", "acme/api@main") != rows[2].session_id

    # The model saw the operator's prompt first, then the event as data, never the raw payload.
    seen = fake_llm.last_user_text(0)
    assert seen.index("A CI event: say what failed.") < seen.index("acme/api")
    assert "workflow_run" in seen and "https://github.com/acme/api/actions/runs/1" in seen


async def test_an_external_events_gated_call_is_refused_and_the_answer_says_so(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path, monkeypatch: Any,
) -> None:
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    gateway: GatewayClient = await start_gateway(make_settings(bot_config=_toml(tmp_path)))  # trust: external
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo rerun"})]), Reply("could not rerun it"))
    assert await deliver(gateway.base, _workflow_run(7), "d-7") == 202
    [row] = await settled(gateway, 1)
    assert row.status == "answered"
    tool_result = fake_llm.requests[1]["messages"][-1]
    assert tool_result["role"] == "tool" and "not allowed" in tool_result["content"]
    posts = _dest_posts(fake_slack)
    assert [p.params["text"] for p in posts] == ["could not rerun it"]  # no card was posted
    assert "blocks" not in posts[0].params or "Approve" not in json.dumps(posts[0].params["blocks"])


async def test_a_member_events_gated_call_shows_a_card_in_the_destination_thread_for_the_approvers_only(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path, monkeypatch: Any,
) -> None:
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    settings = make_settings(bot_config=_toml(tmp_path, trust='"member"'), bot_approvers="U0ONCALL,requester")
    gateway: GatewayClient = await start_gateway(settings)
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo rerun-tests"})]))
    assert await deliver(gateway.base, _workflow_run(8), "d-8") == 202
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert card.params["channel"] == DEST and card.params.get("thread_ts") is None  # the first post opens the thread
    assert "echo rerun-tests" in json.dumps(card.params["blocks"])
    request_id = card.params["blocks"][-1]["elements"][0]["value"]

    # Nobody is the requester of an event: someone else in the channel cannot approve it.
    await gateway.interact(block_action("approval:approve", request_id, user="U0PASSER", channel=DEST))
    await fake_slack.wait_for("chat.postEphemeral")
    assert "can't approve" in fake_slack.ephemerals("U0PASSER")[0]
    assert len(fake_llm.requests) == 1

    fake_llm.then(Reply("re-ran the tests"))
    await gateway.interact(block_action("approval:approve", request_id, user="U0ONCALL", channel=DEST))
    [row] = await settled(gateway, 1)
    assert row.status == "answered"
    answer = _dest_posts(fake_slack)[-1]
    assert answer.params["text"] == "re-ran the tests" and answer.params["thread_ts"] == _first_ts(fake_slack)
    assert "exit code 0" in fake_llm.requests[1]["messages"][-1]["content"]


async def test_a_delivery_killed_after_its_202_is_answered_once_after_the_restart(
    tmp_path: Path, unused_port: int, fake_slack: FakeSlack, fake_llm: FakeLLM,
) -> None:
    env = slack_env(fake_slack, fake_llm, unused_port) | {"CI_WEBHOOK_SECRET": SECRET,
                                                          "BOT_CONFIG": str(_toml(tmp_path))}
    gate = Gate(Reply("never seen"))
    fake_llm.then(gate, Reply("answered after the restart"))
    bot = await BotProcess(tmp_path, env).start()
    assert await deliver(bot.base, _workflow_run(9), "d-9") == 202
    await asyncio.wait_for(gate.reached.wait(), 10)  # the turn is in its model call
    await bot.kill()
    gate.opened.set()

    bot = await BotProcess(tmp_path, env).start()
    try:
        assert await deliver(bot.base, _workflow_run(9), "d-9") == 200  # GitHub's redelivery: nothing new
        posts = await fake_slack.wait_for("chat.postMessage")
        assert [p.params["text"] for p in posts] == ["answered after the restart"]
        code, out = await run_cli(tmp_path, env, "events", "list")
        assert code == 0
        lines = out.strip().splitlines()
        assert len(lines) == 2 and "\tanswered\t" in lines[1] and "\tduplicate\t" in lines[0], out
    finally:
        await bot.terminate()
    assert len(_dest_posts(fake_slack)) == 1


async def test_replay_runs_an_event_again_in_its_thread_and_metrics_count_events_and_refusals(
    make_settings: Callable[..., Settings], start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM,
    tmp_path: Path, monkeypatch: Any,
) -> None:
    monkeypatch.setenv("CI_WEBHOOK_SECRET", SECRET)
    toml = _toml(tmp_path, thread='"{repository.full_name}"')
    settings = make_settings(bot_config=toml, approval_poll_s=0.05)
    gateway: GatewayClient = await start_gateway(settings)
    fake_llm.then(Reply("first look"), Reply("second look"))
    assert await deliver(gateway.base, _workflow_run(11), "d-11") == 202
    assert await deliver(gateway.base, _workflow_run(11), "d-forged", secret="not-the-secret-at-all") == 401
    [row] = await settled(gateway, 1)

    env = {"DATABASE_URL": settings.resolved_database_url, "BOT_HOME": str(settings.bot_home),
           "BOT_CONFIG": str(toml), "CI_WEBHOOK_SECRET": SECRET}
    code, out = await run_cli(tmp_path, env, "events", "replay", str(row.id))
    assert code == 0 and f"event {row.id} queued again as event {row.id + 1}" in out, out
    code, out = await run_cli(tmp_path, env, "events", "replay", "999")
    assert code == 3 and "bot events list" in out, out
    rows = await settled(gateway, 2)
    assert rows[1].replay_of == row.id and rows[1].status == "answered"
    _first, second = _dest_posts(fake_slack)
    assert second.params["text"] == "second look" and second.params["thread_ts"] == _first_ts(fake_slack)

    async with aiohttp.ClientSession() as http, http.get(f"{gateway.base}/metrics") as resp:
        text = await resp.text()
    assert 'chatops_events{source="ci",status="answered"} 2.0' in text
    assert 'chatops_event_refusals_total{reason="signature",source="ci"}' in text

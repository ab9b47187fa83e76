"""A credential asked for in a Slack thread, typed into a modal, sealed, used, and never seen again."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from core.stored_secrets import open_secret
from tests.conftest import GatewayClient
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, mention, view_submission

SECRET = "s3cr3t-acc-value-42"
FLAT_PEM = "-----BEGIN PRIVATE KEY----- MIIEvQIBADANBgkqhkiG9w0BAQEFAASC -----END PRIVATE KEY-----"


def _values(text: str) -> dict[str, Any]:
    return {"value": {"value": {"type": "plain_text_input", "value": text}}}


async def _submit(gateway: GatewayClient, request_id: str, text: str, user: str = "U1") -> dict[str, Any]:
    resp = await gateway.interact(view_submission("credential_provide", request_id, _values(text), user=user))
    body = await resp.text()
    return json.loads(body) if body else {}


async def _requested(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, name: str = "acc.token"
                     ) -> str:
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": name, "reason": "to call the ACC API"})]))
    await gateway.send_event(mention("check the ACC account"))
    message = (await fake_slack.wait_for("chat.postMessage"))[0]
    button = message.params["blocks"][-1]["elements"][0]
    assert button["text"]["text"] == "Provide" and button["action_id"] == "credential:provide"
    return str(button["value"])


async def test_provide_store_use_and_never_see_it(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    request_id = await _requested(gateway, fake_slack, fake_llm)
    text = json.dumps(fake_slack.posts()[0].params["blocks"])
    assert "acc.token" in text and "to call the ACC API" in text and "agent scope" in text

    await gateway.interact(block_action("credential:provide", request_id, user="U1"))
    modal = (await fake_slack.wait_for("views.open"))[0].params["view"]
    modal = json.loads(modal) if isinstance(modal, str) else modal
    assert modal["private_metadata"] == request_id and "visible while you type" in json.dumps(modal)

    assert await _submit(gateway, request_id, "   ") == {"response_action": "errors",
                                                          "errors": {"value": "Enter the value."}}
    assert "line breaks were lost" in (await _submit(gateway, request_id, FLAT_PEM))["errors"]["value"]
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo token=$ACC_TOKEN", "credentials": ["acc.token"]})]))
    assert await _submit(gateway, request_id, SECRET) == {}  # stored: the modal closes

    approval = (await fake_slack.wait_for("chat.postMessage", 2))[1]
    told = fake_llm.requests[1]["messages"][-1]["content"]
    assert "acc.token is now stored" in told and "$ACC_TOKEN" in told
    updated = await fake_slack.wait_for("chat.update")
    assert "acc.token stored by <@U1>" in json.dumps(updated[0].params["blocks"])

    fake_llm.then(Reply("All set."))
    await gateway.interact(block_action("approval:approve", approval.params["blocks"][-1]["elements"][0]["value"]))
    await fake_slack.wait_for("chat.postMessage", 3)
    await gateway.idle()
    assert "token=[redacted:acc.token]" in fake_llm.requests[2]["messages"][-1]["content"]

    # The plaintext is nowhere but in the tool's subprocess: not in the database files, not in any
    # call to Slack, not in any model request, not in any log line.
    await gateway.app.db.close()
    for path in (tmp_path / "home").glob("bot.db*"):
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in json.dumps([c.params for c in fake_slack.calls], default=str)
    assert SECRET not in json.dumps(fake_llm.requests)
    assert all(SECRET not in record.getMessage() for record in caplog.records)


async def test_a_stored_and_granted_credential_is_not_asked_again(
    gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    await gateway.app.credentials.set_secret("acc.token", SECRET, scope="agent", agent="default", by="U1")
    fake_llm.then(Reply(tool_calls=[("credential_request", {"name": "acc.token", "reason": "again"})]),
                  Reply("I have it."))
    await gateway.send_event(mention("use the token"))
    posts = await fake_slack.wait_for("chat.postMessage")
    assert posts[0].params["text"] == "I have it."
    assert "already stored and granted" in fake_llm.requests[1]["messages"][-1]["content"]


async def test_only_approvers_provide_and_the_second_submission_is_told(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_admins="UADMIN"))
    request_id = await _requested(gateway, fake_slack, fake_llm)
    await gateway.interact(block_action("credential:provide", request_id, user="U9"))
    await fake_slack.wait_for("chat.postEphemeral")
    assert "can't provide" in fake_slack.ephemerals("U9")[0] and not fake_slack.of("views.open")
    refused = await _submit(gateway, request_id, SECRET, user="U9")
    assert "can't provide" in refused["errors"]["value"]

    fake_llm.then(Reply("thanks"))
    assert await _submit(gateway, request_id, SECRET, user="UADMIN") == {}
    second = await _submit(gateway, request_id, "another-value", user="U1")
    assert "Already settled: acc.token stored by UADMIN" in second["errors"]["value"]
    await fake_slack.wait_for("chat.postMessage", 2)
    rows = await gateway.app.credentials.store.all_secrets()
    assert len(rows) == 1 and open_secret(gateway.app.credentials.keys, rows[0]) == SECRET


async def test_an_unanswered_request_expires_and_the_turn_goes_on(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(credential_timeout_s=0.3, approval_poll_s=0.05))
    request_id = await _requested(gateway, fake_slack, fake_llm)
    fake_llm.then(Reply("I'll do without it."))
    posts = await fake_slack.wait_for("chat.postMessage", 2)
    assert posts[1].params["text"] == "I'll do without it."
    assert "nobody provided acc.token in time" in fake_llm.requests[1]["messages"][-1]["content"]
    await gateway.idle()
    assert "expired" in json.dumps(fake_slack.of("chat.update")[0].params["blocks"])
    late = await _submit(gateway, request_id, SECRET)
    assert "Already settled" in late["errors"]["value"]
    assert await gateway.app.credentials.store.all_secrets() == []

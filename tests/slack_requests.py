"""Build Slack requests the way Slack signs them (v0 HMAC-SHA256 over timestamp and body)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

from tests.fakes.slack_api import BOT_USER_ID, TEAM_ID

SIGNING_SECRET = "test-signing-secret"
_counter = itertools.count(1)


def signed_headers(body: str, *, secret: str = SIGNING_SECRET, timestamp: int | None = None,
                   content_type: str = "application/json") -> dict[str, str]:
    ts = str(timestamp if timestamp is not None else int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature, "Content-Type": content_type}


def next_ts() -> str:
    return f"{int(time.time())}.{next(_counter):06d}"


def event_body(event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
    return {
        "token": "legacy", "team_id": TEAM_ID, "api_app_id": "A1", "type": "event_callback",
        "event_id": event_id or f"Ev{next(_counter):08d}", "event_time": int(time.time()),
        "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
        "event": event,
    }


def mention(text: str, *, channel: str = "C1", ts: str | None = None, thread_ts: str | None = None,
            user: str = "U1") -> dict[str, Any]:
    event = {"type": "app_mention", "user": user, "text": f"<@{BOT_USER_ID}> {text}", "channel": channel,
             "ts": ts or next_ts(), "team": TEAM_ID}
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def message(text: str, *, channel: str = "C1", ts: str | None = None, thread_ts: str | None = None,
            user: str = "U1", channel_type: str = "channel", **extra: Any) -> dict[str, Any]:
    event = {"type": "message", "user": user, "text": text, "channel": channel, "ts": ts or next_ts(),
             "channel_type": channel_type, "team": TEAM_ID, **extra}
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def command_body(text: str, *, command: str = "/bot", user: str = "U1", channel: str = "C1") -> str:
    return urlencode({"command": command, "text": text, "user_id": user, "channel_id": channel,
                      "team_id": TEAM_ID, "response_url": "http://127.0.0.1:9/resp", "trigger_id": "t1",
                      "token": "legacy"})


def dumps(body: dict[str, Any]) -> str:
    return json.dumps(body)


def block_action(action_id: str, value: str, *, user: str = "U1", channel: str = "C1",
                 message_ts: str = "1.0", thread_ts: str | None = None) -> str:
    """A signed-ready interactivity body: a button click (on a message in thread ``thread_ts``)."""
    container: dict[str, Any] = {"type": "message", "message_ts": message_ts, "channel_id": channel}
    message: dict[str, Any] = {"ts": message_ts, "text": ""}
    if thread_ts:
        container["thread_ts"] = message["thread_ts"] = thread_ts
    payload = {
        "type": "block_actions", "team": {"id": TEAM_ID}, "user": {"id": user}, "api_app_id": "A1",
        "token": "legacy", "trigger_id": f"trigger-{next(_counter)}",
        "channel": {"id": channel}, "container": container,
        "message": message,
        "actions": [{"action_id": action_id, "block_id": "b", "value": value, "type": "button",
                     "action_ts": "1.1"}],
    }
    return urlencode({"payload": json.dumps(payload)})


def message_shortcut(callback_id: str, *, message_ts: str, thread_ts: str | None = None, user: str = "U1",
                     channel: str = "C1") -> str:
    """A signed-ready interactivity body: a message shortcut used on a message."""
    message: dict[str, Any] = {"type": "message", "ts": message_ts, "text": "", "user": "U1"}
    if thread_ts:
        message["thread_ts"] = thread_ts
    payload = {
        "type": "message_action", "callback_id": callback_id, "team": {"id": TEAM_ID}, "user": {"id": user},
        "channel": {"id": channel}, "message": message, "message_ts": message_ts, "api_app_id": "A1",
        "token": "legacy", "trigger_id": f"trigger-{next(_counter)}", "response_url": "http://127.0.0.1:9/r",
    }
    return urlencode({"payload": json.dumps(payload)})


def view_submission(callback_id: str, private_metadata: str, values: dict[str, Any], *, user: str = "U1") -> str:
    payload = {
        "type": "view_submission", "team": {"id": TEAM_ID}, "user": {"id": user}, "api_app_id": "A1",
        "token": "legacy", "trigger_id": f"trigger-{next(_counter)}",
        "view": {"id": "V1", "type": "modal", "callback_id": callback_id, "private_metadata": private_metadata,
                 "state": {"values": values}},
    }
    return urlencode({"payload": json.dumps(payload)})

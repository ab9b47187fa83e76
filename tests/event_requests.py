"""Deliveries to ``POST /events/<name>`` as GitHub, a Standard Webhooks sender and Alertmanager make them, and a
bot.toml with one source of each kind (tests/test_event_intake.py, tests/security/test_event_intake_fuzz.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

GITHUB_SECRET = "a-github-webhook-secret-of-some-length"
STANDARD_KEY_BYTES = b"standard webhooks signing key!!!"
STANDARD_KEY = "whsec_" + base64.b64encode(STANDARD_KEY_BYTES).decode()
BEARER_TOKEN = "alertmanager-token-0123456789"
MAX_BODY = 4096  # EVENT_MAX_BODY_BYTES in these tests: small, so "too large" is cheap to send

EVENTS_TOML = """
[[event_sources]]
name = "gh"
kind = "github"
secret_env = "TEST_GH_SECRET"
destination = "#ops"
events = ["push", "pull_request.*", "workflow_run.completed"]
thread = "{repository.full_name}"

[[event_sources]]
name = "sw"
kind = "standard"
secret_env = "TEST_SW_KEY"
destination = "#ops"
events = ["invoice.*"]

[[event_sources]]
name = "am"
kind = "bearer"
secret_env = "TEST_AM_TOKEN"
destination = "C0123ABC"
events = ["firing"]
thread = "{groupKey}"

[[event_sources]]
name = "flood"
kind = "bearer"
secret_env = "TEST_AM_TOKEN"
destination = "#ops"
rate_per_minute = 3

[[event_sources]]
name = "flood-gh"
kind = "github"
secret_env = "TEST_GH_SECRET"
destination = "#ops"
rate_per_minute = 3

[[event_sources]]
name = "flood-sw"
kind = "standard"
secret_env = "TEST_SW_KEY"
destination = "#ops"
rate_per_minute = 3

[[event_sources]]
name = "nosecret"
kind = "github"
secret_env = "TEST_UNSET_SECRET"
destination = "#ops"
"""


def events_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """bot.toml with the sources above, and their secrets in the environment (all but nosecret's)."""
    monkeypatch.setenv("TEST_GH_SECRET", GITHUB_SECRET)
    monkeypatch.setenv("TEST_SW_KEY", STANDARD_KEY)
    monkeypatch.setenv("TEST_AM_TOKEN", BEARER_TOKEN)
    monkeypatch.delenv("TEST_UNSET_SECRET", raising=False)
    config = tmp_path / "bot.toml"
    config.write_text(EVENTS_TOML, encoding="utf-8")
    return config


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def github(event: str, payload: Any, *, delivery: str | None = None, secret: str = GITHUB_SECRET,
           body: bytes | None = None) -> tuple[bytes, dict[str, str]]:
    data = body if body is not None else dumps(payload)
    signature = "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()
    return data, {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
                  "X-Hub-Signature-256": signature, "Content-Type": "application/json"}


def standard(payload: Any, now: datetime, *, msg_id: str | None = None, key: bytes = STANDARD_KEY_BYTES,
             body: bytes | None = None) -> tuple[bytes, dict[str, str]]:
    data = body if body is not None else dumps(payload)
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    stamp = str(int(now.timestamp()))
    digest = hmac.new(key, f"{msg_id}.{stamp}.".encode() + data, hashlib.sha256).digest()
    return data, {"webhook-id": msg_id, "webhook-timestamp": stamp,
                  "webhook-signature": "v1," + base64.b64encode(digest).decode(), "Content-Type": "application/json"}


def bearer(payload: Any, *, token: str = BEARER_TOKEN, body: bytes | None = None) -> tuple[bytes, dict[str, str]]:
    return (body if body is not None else dumps(payload)), {"Authorization": f"Bearer {token}",
                                                             "Content-Type": "application/json"}


def alert(status: str = "firing", group: str = "{}:{alertname=\"DiskFull\"}") -> dict[str, Any]:
    """An Alertmanager webhook payload (version 4), trimmed."""
    return {"version": "4", "status": status, "groupKey": group, "receiver": "bot",
            "alerts": [{"status": status, "labels": {"alertname": "DiskFull", "instance": "db-1"},
                        "annotations": {"summary": "disk 95% full"}}]}


PUSH = {"ref": "refs/heads/main", "repository": {"full_name": "acme/api"}, "pusher": {"name": "ada"}}


def signed(kind: str, now: datetime, *, body: bytes) -> tuple[bytes, dict[str, str]]:
    """``body`` delivered as a source of ``kind`` signs it: a GitHub push, a Standard Webhooks message, a bearer
    post."""
    if kind == "github":
        return github("push", None, body=body)
    if kind == "standard":
        return standard(None, now, body=body)
    return bearer(None, body=body)


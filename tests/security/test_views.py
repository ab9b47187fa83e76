"""What crosses from core to channels and the bot: frozen views that carry only what their listings show."""

from __future__ import annotations

import base64
import dataclasses
import os
from pathlib import Path

import pytest

from core.agents import Agent, AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.clock import SystemClock
from core.credentials import CredentialService
from core.events import EventBus
from core.store import CredentialStore, Database
from core.stored_secrets import credential_views
from core.vault import KeyRing
from core.views import CredentialView, GrantView, ScheduleView


def _fields(view: type) -> set[str]:
    return {f.name for f in dataclasses.fields(view)}


def test_views_carry_only_what_their_listings_show() -> None:
    # A grant: who may run which exact call where (the place, or one thread of it), until when, under which rule,
    # and who allowed it; never a revoked grant's old pattern. Who revoked it is only ever filled in for the
    # operator's listing of every grant (`bot approvals grants`): a channel's listing shows active grants only.
    assert _fields(GrantView) == {"id", "agent", "tool", "place", "created_by", "created_at", "call_text", "thread",
                                  "expires_at", "revoked_by", "revoked_at", "rule"}
    # A schedule: no destination id, origin session or approval id (core's bookkeeping).
    assert _fields(ScheduleView) == {"id", "prompt", "trigger", "destination", "creator", "status", "firings",
                                     "failures", "last_outcome"}
    # A credential: never its value, sealed or not, nor how it is sealed.
    assert _fields(CredentialView) == {"name", "scope", "agent", "granted_to", "hosts", "key_id", "created_by",
                                       "updated_at", "last_used_at"}


def test_views_are_frozen() -> None:
    from datetime import UTC, datetime

    grant = GrantView(1, "default", "shell_run", None, "U1", datetime.now(UTC), '{"command":"ls"}')
    with pytest.raises(dataclasses.FrozenInstanceError):
        grant.call_text = '{"command":"rm -rf /"}'  # type: ignore[misc]
    assert grant.describe() == "ls"


async def test_a_listed_credential_carries_neither_its_value_nor_its_ciphertext(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'bot.db'}")
    await db.migrate()
    keys = KeyRing.parse(f"k1:{base64.b64encode(os.urandom(32)).decode()}")
    service = CredentialService(CredentialStore(db), keys, EventBus(), SystemClock(),
                                ApprovalPolicy(("requester",), ()), AgentDirectory([Agent()]))
    await service.set_secret("github.token", "ghp_the-value-itself", scope="shared", agent="default", by="U1",
                             hosts="api.github.com")
    try:
        [view] = await credential_views(service.store)
        [row] = await service.store.all_secrets()
        shown = repr(view)
        assert "ghp_the-value-itself" not in shown and row.ciphertext not in shown
        assert (view.name, view.describe(), view.hosts) == ("github.token", "shared (granted to default)",
                                                            ("api.github.com",))
    finally:
        await db.close()

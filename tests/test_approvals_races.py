"""Settled exactly once: concurrent deciders, and a click racing the timeout (SPEC §7)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from core.model import ApprovalStatus
from tests.audit import audit_log
from tests.conftest import GatewayClient
from tests.fakes.core import ShiftedClock
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import mention


async def _parked(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM) -> int:
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": "echo once"})]), Reply("finished"))
    await gateway.send_event(mention("run it"))
    await fake_slack.wait_for("chat.postMessage")
    pending = await gateway.app.approvals.pending()
    return pending[0].id


async def test_two_approvers_at_once_run_the_call_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = await start_gateway(make_settings(bot_admins="UADMIN,UOTHER"))
    request_id = await _parked(gateway, fake_slack, fake_llm)
    broker = gateway.app.approvals
    results = await asyncio.gather(*(broker.decide(request_id, v, by=u) for v, u in
                                     [("approve", "UADMIN"), ("deny", "UOTHER"), ("always", "U1"),
                                      ("approve", "UADMIN")]))
    assert sum(r.won for r in results) == 1
    winner = next(r for r in results if r.won)
    assert all(r.request and r.request.status == winner.request.status for r in results)  # type: ignore[union-attr]
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    assert len(fake_llm.requests) == 2  # the model was asked once more, whatever the outcome
    assert len(fake_slack.of("chat.update")) == 1
    audit = await audit_log(broker.store.db)
    assert [a.action for a in audit if a.subject == f"approval:{request_id}"] == [
        f"approval.{winner.request.status}"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("click_at", "outcome"), [(-5, ApprovalStatus.APPROVED), (0, ApprovalStatus.EXPIRED)])
async def test_a_click_racing_the_timeout_settles_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, click_at: int, outcome: str
) -> None:
    """A click lands together with the timeout's sweep, seconds before the deadline or at it (when the
    parked call's own wait runs out too): one of them settles it, once, and the call runs only if approved."""
    clock = ShiftedClock()
    gateway = await start_gateway(make_settings(approval_timeout_s=30), clock=clock)
    request_id = await _parked(gateway, fake_slack, fake_llm)
    broker = gateway.app.approvals
    parked = await broker.get(request_id)
    assert parked is not None
    clock.jump_to(parked.expires_at + timedelta(seconds=click_at))
    _overdue, click = await asyncio.gather(broker.expire_overdue(), broker.decide(request_id, "approve", by="U1"))
    final = await broker.get(request_id)
    assert final is not None and final.status == outcome
    assert click.won == (outcome == ApprovalStatus.APPROVED) and click.expired == (outcome == ApprovalStatus.EXPIRED)
    await fake_slack.wait_for("chat.postMessage", 2)
    await gateway.idle()
    audit = await audit_log(broker.store.db)
    assert [a.action for a in audit if a.subject == f"approval:{request_id}"] == [f"approval.{outcome}"]  # once
    assert len(fake_slack.of("chat.update")) == 1
    ran = "exit code 0" in fake_llm.requests[1]["messages"][-1]["content"]
    assert ran == (final.status == ApprovalStatus.APPROVED)

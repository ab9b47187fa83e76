"""MAX_CONCURRENT_TURNS counts turns at work, not turns parked on a person (SPEC §5, §7): a parked turn
gives its slot back, and takes one again before it runs on. Abuse: anyone who can mention the bot asks
for MAX_CONCURRENT_TURNS gated calls and never decides; nobody else must be kept from an answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlmodel import select

from core.store.tables import TurnRow
from core.turns import TurnDrivers
from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Gate, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention

SLOTS = 2


def _turns(gateway: GatewayClient) -> TurnDrivers:
    return gateway.app.dispatcher.turns


def _free(gateway: GatewayClient) -> int:
    return _turns(gateway)._slots._value  # the semaphore itself: a leaked slot shows here


async def _count_turns(gateway: GatewayClient, status: str) -> int:
    async with gateway.app.db.read() as s:
        return int((await s.exec(select(func.count()).select_from(TurnRow).where(TurnRow.status == status))).one())


def _waiting_for_a_slot(gateway: GatewayClient) -> int:
    return len(_turns(gateway)._slots._waiters or ())


async def _park(gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM, channel: str, command: str,
                cards: int, tool: str = "shell_run") -> int:
    """A call asked for in ``channel``, parked on its card (the ``cards``-th post); a shell_run's request id."""
    args = {"command": command} if tool == "shell_run" else {"name": command, "reason": "to look"}
    fake_llm.then(Reply(tool_calls=[(tool, args)]))
    await gateway.send_event(mention(f"run `{command}`", channel=channel, user="UATTACKER"))
    await fake_slack.wait_for("chat.postMessage", cards)
    if tool != "shell_run":
        return 0
    return max(r.id for r in await gateway.app.approvals.pending())  # the newest: parked one at a time


async def _fill_slots(gateway: GatewayClient, fake_llm: FakeLLM) -> list[Gate]:
    """SLOTS turns whose model calls are held: every slot is busy with work."""
    gates = [Gate(Reply(f"busy {i} done")) for i in range(SLOTS)]
    for i, gate in enumerate(gates):
        fake_llm.then(gate)
        await gateway.send_event(mention(f"busy {i}", channel=f"CBUSY{i}", user="UBUSY"))
        async with asyncio.timeout(5):  # fails while a parked turn keeps a slot
            await gate.reached.wait()
    return gates


async def _approved_behind_busy_turns(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path,
    then: Reply | None = None,
) -> tuple[GatewayClient, Path, int, list[Gate]]:
    """A shell_run parked in CA, every slot then busy, and the call approved: its turn waits for a slot,
    the call not yet run. ``then`` answers the approved turn once it runs. (gateway, its marker file, the
    request id, the busy turns' gates)"""
    ran = tmp_path / "home" / "work" / "default" / "ran"
    gateway = await start_gateway(make_settings(max_concurrent_turns=SLOTS))
    request_id = await _park(gateway, fake_slack, fake_llm, "CA", "echo once >> ran", cards=1)
    gates = await _fill_slots(gateway, fake_llm)
    if then is not None:
        fake_llm.then(then)
    await gateway.interact(block_action("approval:approve", str(request_id), user="UATTACKER", channel="CA"))
    await until(lambda: _waiting_for_a_slot(gateway) == 1, what="the approved turn waits for a slot")
    return gateway, ran, request_id, gates


@pytest.mark.parametrize("tool", ["shell_run", "credential_request"])
async def test_parked_turns_leave_the_slots_to_others(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tool: str
) -> None:
    gateway = await start_gateway(make_settings(max_concurrent_turns=SLOTS))
    for i in range(SLOTS):  # the attacker asks for SLOTS calls and walks away
        await _park(gateway, fake_slack, fake_llm, f"CATT{i}", f"echo{i}", cards=i + 1, tool=tool)
    await gateway.send_event(mention("hello?", channel="CVICTIM", user="UVICTIM"))
    posts = await fake_slack.wait_for("chat.postMessage", SLOTS + 1, timeout=5)
    assert "hello?" in posts[SLOTS].params["text"] and posts[SLOTS].params["channel"] == "CVICTIM"
    assert _free(gateway) == SLOTS  # the attacker's turns are still parked, holding none
    for i in range(SLOTS):
        await gateway.interact(command_body("stop", channel=f"CATT{i}", user="UATTACKER"))
    await fake_slack.wait_for("chat.update", SLOTS)
    await gateway.idle()
    assert await gateway.app.approvals.pending() == []
    assert _free(gateway) == SLOTS


async def test_an_approved_turn_waits_for_a_slot_then_runs_its_call_once(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway, ran, _, gates = await _approved_behind_busy_turns(make_settings, start_gateway, fake_slack, fake_llm,
                                                               tmp_path, then=Reply("the parked one is done"))
    await fake_slack.wait_for("chat.update")  # approved...
    assert not ran.exists() and len(fake_llm.requests) == 1 + SLOTS

    gates[0].opened.set()  # one busy turn ends: its slot goes to the approved turn
    await until(lambda: any(p.params["text"] == "the parked one is done" for p in fake_slack.posts()),
                what="the approved call ran and the turn answered")
    assert ran.read_text() == "once\n"
    assert "exit code 0" in fake_llm.requests[-1]["messages"][-1]["content"]
    gates[1].opened.set()
    await gateway.idle()
    assert ran.read_text() == "once\n" and len(fake_llm.requests) == 2 + SLOTS
    assert _free(gateway) == SLOTS


async def test_stop_while_waiting_for_a_slot(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    gateway, ran, request_id, gates = await _approved_behind_busy_turns(make_settings, start_gateway, fake_slack,
                                                                        fake_llm, tmp_path)

    stopped = await gateway.interact(command_body("stop", channel="CA", user="UATTACKER"))
    assert stopped.status == 200
    await until(lambda: _waiting_for_a_slot(gateway) == 0, what="the stop ends the wait for a slot")
    assert _free(gateway) == 0  # the busy turns still hold theirs; the stopped one took none
    for gate in gates:
        gate.opened.set()
    await gateway.idle()
    assert not ran.exists() and len(fake_llm.requests) == 1 + SLOTS  # the stopped turn never ran on
    assert await _count_turns(gateway, "cancelled") == 1
    approval = await gateway.app.approvals.get(request_id)
    assert approval is not None and approval.status == "approved" and not approval.started
    assert _free(gateway) == SLOTS


async def test_shutdown_sets_aside_a_turn_waiting_for_a_slot(
    make_settings: Any, start_gateway: Any, fake_slack: FakeSlack, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    """Approved but not yet run: nothing has started, so it is set aside like a parked turn (no drain
    window spent on it, no restart attempt used) and the next start runs the approved call."""
    gateway, ran, request_id, gates = await _approved_behind_busy_turns(make_settings, start_gateway, fake_slack,
                                                                        fake_llm, tmp_path)

    report = await _turns(gateway).shut_down(0.3)
    for gate in gates:  # the interrupted model calls' requests end too
        gate.opened.set()
    assert (report.set_aside, report.interrupted, report.drained) == (1, SLOTS, 0)
    assert not ran.exists() and _free(gateway) == SLOTS
    assert await _count_turns(gateway, "queued") == 1  # continued at the next start
    approval = await gateway.app.approvals.get(request_id)
    assert approval is not None and approval.status == "approved" and not approval.started

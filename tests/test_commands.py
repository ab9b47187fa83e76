"""The ``/bot`` command's grammar and replies, word for word (core writes them, Slack only marks them up)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import GatewayClient
from tests.fakes.core import until
from tests.fakes.llm import FakeLLM, Reply
from tests.fakes.slack_api import FakeSlack
from tests.slack_requests import block_action, command_body, mention

HELP = (
    "Mention me in a thread (or DM me) and I'll answer there; every reply in that thread is "
    "context for the next one. Messages sent while I work are taken into what I'm doing.\n"
    "In a thread: `@bot stop` stops my work there; `@bot queue steer|collect|followup` sets how "
    "messages sent while I work are handled. Stopping and the queue mode are for whoever asked, "
    "approvers and admins.\n"
    "`/bot status` — am I up and how busy\n`/bot stop` — stop my work here (the one busy thread; with "
    "several, the Stop button or the message shortcut \"Stop this turn\" in that thread)\n"
    "`/bot queue steer|collect|followup` — the queue mode for this channel\n"
    "`/bot schedule every 1h #ops <prompt>` — run a prompt on a schedule (also `cron \"0 9 * * 1-5\"`, "
    "`at 2026-12-01T09:00`); `/bot schedules` — this channel's schedules (all of them for admins): "
    "list, pause, resume, cancel\n"
    "`/bot approvals` — pending approvals and \"Always allow\" grants; "
    "`/bot approvals revoke <id>` (admins)\n"
    "`/bot freeze <until> <reason>` — a change freeze: calls that need approval are refused until then; "
    "`/bot unfreeze` (admins)\n"
    "`/bot connections` — your connected accounts; `/bot connections disconnect <name>`\n"
    "`/bot memory` — the agent's pinned memories (only you see this)\n`/bot help` — this text"
)


@pytest.fixture
async def admin_gateway(make_settings: Any, start_gateway: Any) -> GatewayClient:
    client: GatewayClient = await start_gateway(make_settings(bot_admins="UADMIN"))
    return client


async def _say(gateway: GatewayClient, text: str, *, user: str = "U1", channel: str = "C1") -> str:
    resp = await gateway.interact(command_body(text, user=user, channel=channel))
    assert resp.status == 200
    return await resp.text()


async def test_help_status_stop_and_queue_replies(admin_gateway: GatewayClient) -> None:
    gateway = admin_gateway
    assert await _say(gateway, "") == HELP
    assert await _say(gateway, "help") == HELP
    assert await _say(gateway, "frobnicate <!channel> now") == (
        "I don't know `/bot frobnicate &lt;!channel&gt; now`.\n" + HELP)  # what was typed, never markup
    assert await _say(gateway, "queue") == "I don't know `/bot queue`.\n" + HELP
    assert await _say(gateway, "fo`o *bold* `x") == "I don't know `/bot fo'o *bold* 'x`.\n" + HELP  # stays one span
    assert await _say(gateway, "status") == (
        "I'm up and taking messages; 0 conversation(s) working now. Default queue mode: steer.")
    await gateway.app.dispatcher.control.set_intake_paused(True, gateway.app.dispatcher.clock.now())
    assert await _say(gateway, "STATUS") == (
        "I'm up and paused by an operator; 0 conversation(s) working now. Default queue mode: steer.")
    await gateway.app.dispatcher.control.set_intake_paused(False, gateway.app.dispatcher.clock.now())
    assert await _say(gateway, "stop") == "Nothing to stop in this channel."
    assert await _say(gateway, "queue bogus") == "unknown queue mode 'bogus': use steer, collect or followup"
    assert await _say(gateway, "queue collect", user="UADMIN") == (
        "Queue mode in this channel is now collect (a thread can still override it: mention me with "
        "`queue collect`).")


async def test_approvals_and_schedules_replies(
    admin_gateway: GatewayClient, fake_slack: FakeSlack, fake_llm: FakeLLM
) -> None:
    gateway = admin_gateway
    empty = ("*Pending approvals in this channel:* 0\n"
             "*Always-allow grants in this channel:* 0 (each covers one exact call)")
    assert await _say(gateway, "approvals", user="U2") == empty
    assert await _say(gateway, "approvals anything else", user="U2") == empty
    assert await _say(gateway, "approvals revoke a`<b>", user="U2") == (
        "`a'&lt;b&gt;` is not a grant id (a number such as 12: see `/bot approvals`).")
    assert await _say(gateway, "approvals revoke 5", user="U2") == "Only admins (BOT_ADMINS) can revoke grants."
    assert await _say(gateway, "approvals revoke 5", user="UADMIN") == "There is no active grant 5."
    assert await _say(gateway, "schedules", user="U2") == (
        "No schedules in this channel. Create one: `/bot schedule every 1h #ops summarize open incidents`")
    assert await _say(gateway, "schedules", user="UADMIN") == (
        "No schedules. Create one: `/bot schedule every 1h #ops summarize open incidents`")
    assert await _say(gateway, "schedules pause zz") == (
        "`zz` is not a schedule id (a number such as 12: see `/bot schedules`).")
    assert await _say(gateway, "schedules pause 7") == "there is no schedule 7"
    assert await _say(gateway, "schedule every 1h #acc-dest") == (
        "Not scheduled: usage: /bot schedule every 5m #channel <prompt>")
    assert await _say(gateway, "schedule sometime #acc-dest hi") == (
        "Not scheduled: say when: every 5m, cron \"0 9 * * 1-5\" or at 2026-12-01T09:00")

    # A schedule made by the command: its destination is asked for in this channel, top level.
    assert await _say(gateway, "schedule every 2h #acc-dest post the time") == (
        "Schedule 1 created (every 7200 s → #acc-dest); it starts once posting to #acc-dest is approved.")
    card = (await fake_slack.wait_for("chat.postMessage"))[0]
    assert card.params["channel"] == "C1" and not card.params.get("thread_ts")
    schedule = await gateway.app.schedules.store.get(1)
    assert schedule is not None
    origin = await gateway.app.gateway.session(schedule.origin_session or "")
    assert origin is not None and origin.id == "slack:T1:C1:command-t1"
    assert (origin.channel, origin.agent, origin.place, origin.reply_ref) == (
        "slack", "default", "slack:T1:C1", {"channel": "C1"})
    listed = ("• 1: every 7200 s → #acc-dest *pending_destination* (by <@U1>) · firings 0 · last: none yet\n"
              "`/bot schedules pause|resume|cancel <id>` (creator or admin)")
    assert await _say(gateway, "schedules") == listed
    assert await _say(gateway, "schedules", user="U2", channel="C2") == (
        "No schedules in this channel. Create one: `/bot schedule every 1h #ops summarize open incidents`")
    assert await _say(gateway, "schedules cancel 1", user="U2") == "only its creator or an admin can cancel schedule 1"
    pending = (await gateway.app.approvals.pending())[0]
    assert await _say(gateway, "approvals", user="UADMIN") == (
        f"*Pending approvals:* 1\n• #{pending.id} `schedule_destination` — Asked by <@U1>, expires "
        f"{pending.expires_at:%H:%M} UTC\n*Always-allow grants:* 0 (each covers one exact call)")

    # "Always allow" on the destination: a grant, listed whole with where it applies.
    await gateway.interact(block_action("approval:always", str(pending.id), user="UADMIN"))
    await fake_slack.wait_for("chat.update")

    async def active() -> bool:  # the card is updated at the decision; the schedule starts once its call ran
        row = await gateway.app.schedules.store.get(1)
        return row is not None and row.status == "active"

    await until(active, what="schedule 1 active")
    assert await _say(gateway, "approvals", user="UADMIN") == (
        "*Pending approvals:* 0\n*Always-allow grants:* 1 (each covers one exact call)\n"
        "• 1: agent `default` may run `schedule_destination` in <#CACC> (by <@UADMIN>), exactly:\n"
        "```\nschedules by U1 posting to CACC\n```\n"
        "Revoke one with `/bot approvals revoke <id>` (admins).")
    # A non-admin learns nothing about which grants exist: the refusal comes before any look-up.
    assert await _say(gateway, "approvals revoke 1", user="U2") == "Only admins (BOT_ADMINS) can revoke grants."
    assert await _say(gateway, "schedules pause 1") == "Schedule 1 paused."
    assert await _say(gateway, "schedules pause 1") == "schedule 1 is paused, not active"

    # A long call is cut in the listing (and says so); one typed in a thread names no place mark-up.
    command = "echo " + "<&>" * 200
    fake_llm.then(Reply(tool_calls=[("shell_run", {"command": command})]), Reply("done"))
    before = len(fake_slack.posts())
    await gateway.send_event(mention("run it", channel="C1"))
    ask = (await fake_slack.wait_for("chat.postMessage", before + 1))[before]
    await gateway.interact(block_action("approval:always", ask.params["blocks"][-1]["elements"][0]["value"]))
    await fake_slack.wait_for("chat.postMessage", before + 2)
    await gateway.idle()
    shown = ("echo " + "<&>" * 200)[:500].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert await _say(gateway, "approvals") == (
        "*Pending approvals in this channel:* 0\n*Always-allow grants in this channel:* 1 (each covers one exact "
        "call)\n• 2: agent `default` may run `shell_run` in <#C1> (by <@U1>), exactly:\n"
        f"```\n{shown}\n```\n_(the first 500 of 605 characters: `bot approvals grants` prints it whole)_\n"
        "Revoke one with `/bot approvals revoke <id>` (admins).")
    assert await _say(gateway, "approvals revoke 2", user="UADMIN") == (
        "Grant 2 revoked: that call needs approval again.")


async def test_another_channels_schedule_ids_do_not_show_through_refusals(admin_gateway: GatewayClient) -> None:
    """A person in another channel is told "there is no schedule N" for a schedule they cannot list,
    exactly as for an id that does not exist; where they can list it, the refusal says why."""
    created = await _say(admin_gateway, "schedule every 1h #acc-dest say hi", user="U1", channel="C1")
    assert created.startswith("Schedule 1 created")
    for verb in ("cancel", "pause", "resume"):
        assert await _say(admin_gateway, f"schedules {verb} 1", user="U2", channel="C2") == "there is no schedule 1"
        assert await _say(admin_gateway, f"schedules {verb} 99", user="U2", channel="C2") == "there is no schedule 99"
    assert await _say(admin_gateway, "schedules cancel 1", user="U2", channel="C1") == (
        "only its creator or an admin can cancel schedule 1")
    assert await _say(admin_gateway, "schedules cancel 1", user="UADMIN", channel="C2") == "Schedule 1 cancelled."

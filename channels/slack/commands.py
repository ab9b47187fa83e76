"""The ``/bot`` slash command in Slack: status, stop, queue, approvals, schedules and help.

It only parses what was typed and words the answer; every rule (who may stop, revoke, see or change
a schedule) is core's."""

from __future__ import annotations

import uuid
from typing import Any

from slack_bolt.async_app import AsyncApp

from channels.errors import MalformedPayload
from channels.slack.approvals import asked_by
from channels.slack.payloads import is_id
from core.approvals import ApprovalBroker, describe_grant
from core.dispatcher import Dispatcher
from core.display import visible
from core.errors import InvalidInput
from core.model import SessionInfo
from core.schedules import ScheduleService
from core.text import parse_id
from core.triggers import TriggerSpec, parse_when


class SlackCommands:
    def __init__(self, app: AsyncApp, command: str, channel: str, dispatcher: Dispatcher,
                 approvals: ApprovalBroker) -> None:
        self.command = command
        self.channel = channel  # the channel's name, for the sessions a command starts
        self.dispatcher = dispatcher
        self.approvals = approvals
        self.schedules: ScheduleService | None = None  # set by the wiring once the scheduler exists
        app.command(command)(self._on_command)

    async def _on_command(self, ack: Any, command: dict[str, Any]) -> None:
        team, channel, user = command.get("team_id"), command.get("channel_id"), command.get("user_id")
        text = command.get("text") or ""
        if not is_id(team) or not is_id(channel) or not is_id(user) or not isinstance(text, str):
            raise MalformedPayload("team_id, channel_id or user_id is not a Slack id")  # before any ack
        words = text.split()
        sub = words[0].lower() if words else "help"
        place = f"slack:{team}:{channel}"
        if sub == "status":
            state = "paused by an operator" if await self.dispatcher.paused() else (
                "taking messages" if self.dispatcher.accepting else "not taking messages")
            mode = self.dispatcher.config.queue_mode
            await ack(text=f"I'm up and {state}; {self.dispatcher.running_sessions} conversation(s) working now. "
                           f"Default queue mode: {mode}.")
        elif sub == "stop":
            # Slash commands do not say which thread they came from: stop this channel's latest busy one
            # (core decides who may: its requester, approvers and admins).
            try:
                report = await self.dispatcher.stop_latest(place, by=user)
            except InvalidInput as exc:
                await ack(text=str(exc))
                return
            if report is None:
                await ack(text="Nothing to stop in this channel.")
                return
            await ack(text=f"{report.describe(None)} (the most recent busy thread here; to stop another, "
                           "reply `stop` to me in that thread)")
        elif sub == "queue" and len(words) == 2:
            try:
                await self.dispatcher.set_place_queue_mode(place, words[1].lower(), by=user)
            except InvalidInput as exc:
                await ack(text=str(exc))
                return
            await ack(text=f"Queue mode in this channel is now {words[1].lower()} "
                           "(a thread can still override it: mention me with `queue collect`).")
        elif sub == "approvals":
            await ack(text=await self._approvals_command(words[1:], user, place))
        elif sub == "schedules":
            await ack(text=await self._schedules_command(words[1:], user, place))
        elif sub == "schedule":
            await ack(text=await self._schedule_command(text.strip()[len("schedule"):].strip(), user, command))
        elif sub == "help":
            await ack(text=self._help())
        else:
            await ack(text=f"I don't know `{self.command} {' '.join(words)}`.\n{self._help()}")

    def _help(self) -> str:
        c = self.command
        return (
            "Mention me in a thread (or DM me) and I'll answer there; every reply in that thread is "
            "context for the next one. Messages sent while I work are taken into what I'm doing.\n"
            "In a thread: `@bot stop` stops my work there; `@bot queue steer|collect|followup` sets how "
            "messages sent while I work are handled. Stopping and the queue mode are for whoever asked, "
            "approvers and admins.\n"
            f"`{c} status` — am I up and how busy\n`{c} stop` — stop the latest busy thread in this channel\n"
            f"`{c} queue steer|collect|followup` — the queue mode for this channel\n"
            f"`{c} schedule every 1h #ops <prompt>` — run a prompt on a schedule (also `cron \"0 9 * * 1-5\"`, "
            f"`at 2026-12-01T09:00`); `{c} schedules` — this channel's schedules (all of them for admins): "
            "list, pause, resume, cancel\n"
            f"`{c} approvals` — pending approvals and \"Always allow\" grants; "
            f"`{c} approvals revoke <id>` (admins)\n`{c} help` — this text"
        )

    async def _schedules_command(self, words: list[str], user: str, place: str) -> str:
        if self.schedules is None:
            return "Schedules are not available here."
        if words and words[0] in ("pause", "resume", "cancel") and len(words) == 2:
            schedule_id = parse_id(words[1])
            if schedule_id is None:
                return (f"`{_code(words[1])}` is not a schedule id (a number such as 12: "
                        f"see `{self.command} schedules`).")
            try:
                return await self.schedules.change(schedule_id, words[0], by=user)
            except InvalidInput as exc:
                return str(exc)
        # Core decides what this user may see: this channel's schedules, or every one for an admin.
        rows = await self.schedules.list(place=place, viewer=user)
        if not rows:
            where = "" if self.schedules.policy.is_admin(user) else " in this channel"
            return (f"No schedules{where}. Create one: "
                    f"`{self.command} schedule every 1h #ops summarize open incidents`")
        return "\n".join(
            f"• {r.id}: {TriggerSpec.from_json(r.trigger).describe()} → {r.destination} *{r.status}* "
            f"(by <@{r.creator}>) · firings {r.firings} · last: {r.last_outcome or 'none yet'}" for r in rows[:30]
        ) + f"\n`{self.command} schedules pause|resume|cancel <id>` (creator or admin)"

    async def _schedule_command(self, text: str, user: str, command: dict[str, Any]) -> str:
        if self.schedules is None:
            return "Schedules are not available here."
        try:
            trigger, rest = parse_when(text)
            destination, _, prompt = rest.partition(" ")
            if not destination or not prompt.strip():
                raise InvalidInput(f"usage: {self.command} schedule every 5m #channel <prompt>")
            team, channel = command["team_id"], command["channel_id"]  # shape-checked by _on_command
            trigger_id = command.get("trigger_id") or uuid.uuid4().hex  # shape-checked: [A-Za-z0-9._-]
            # The destination approval is asked where the command was typed, as a top-level message.
            origin = SessionInfo(id=f"slack:{team}:{channel}:command-{trigger_id}", channel=self.channel,
                                 agent=self.dispatcher.agents.default.name, status="idle",
                                 reply_ref={"channel": channel}, place=f"slack:{team}:{channel}")
            schedule = await self.schedules.create(prompt=prompt, trigger=trigger, destination=destination,
                                                   agent=origin.agent, creator=user, origin=origin)
        except InvalidInput as exc:
            return f"Not scheduled: {exc}"
        return (f"Schedule {schedule.id} created ({trigger.describe()} → {destination}); it starts once posting "
                f"to {destination} is approved.")

    async def _approvals_command(self, args: list[str], user: str, place: str) -> str:
        if len(args) == 2 and args[0] == "revoke":
            grant_id = parse_id(args[1])
            if grant_id is None:
                return (f"`{_code(args[1])}` is not a grant id (a number such as 12: "
                        f"see `{self.command} approvals`).")
            return await self.approvals.revoke_grant(grant_id, by=user)
        # Core decides what this user may see: this channel's items, or everything for an admin.
        pending = await self.approvals.pending(place=place, viewer=user)
        grants = await self.approvals.grants(place=place, viewer=user)
        where = "" if self.approvals.policy.is_admin(user) else " in this channel"
        lines = [f"*Pending approvals{where}:* {len(pending)}"]
        lines += [f"• #{p.id} `{p.tool}` — {asked_by(p)}, expires {p.expires_at:%H:%M} UTC" for p in pending[:20]]
        lines.append(f"*Always-allow grants{where}:* {len(grants)} (each covers one exact call)")
        lines += [f"• {g.id}: agent `{g.agent}` may run `{g.tool}`"
                  + (f" in {_place_text(g.place)}" if g.place else "") + f" (by <@{g.created_by}>), exactly:"
                  + _listed_call(describe_grant(g)) for g in grants[:30]]
        if grants:
            lines.append(f"Revoke one with `{self.command} approvals revoke <id>` (admins).")
        return "\n".join(lines)


def _listed_call(call: str, limit: int = 500) -> str:
    """A grant's call in a listing, made visible (no ``` run survives ``visible``). A long one is
    said to be cut, and how long it is: `bot approvals grants` prints it whole."""
    shown = visible(call)
    text = shown[:limit].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    more = f"\n_(the first {limit} of {len(shown):,} characters: `bot approvals grants` prints it whole)_" \
        if len(shown) > limit else ""
    return f"\n```\n{text}\n```{more}"


def _code(text: str) -> str:
    """Something a person typed, quoted back inside `…` (short, no backtick, no mention markup)."""
    shown = visible(text[:40]).replace("`", "'")
    return shown.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _place_text(place: str) -> str:
    parts = place.split(":")
    return f"<#{parts[-1]}>" if place.startswith("slack:") and len(parts) == 3 else place

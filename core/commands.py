"""The ``/bot`` command: its grammar and every reply, for any channel that offers one.

A channel hands over what was typed and where (``Command``) and renders the reply with its own
``Marks``; who may stop, revoke, see or change what is decided by the services called here.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from core.approvals import ApprovalBroker
from core.connections.service import ConnectionService
from core.dispatcher import Dispatcher
from core.display import visible
from core.errors import InvalidInput
from core.freeze_commands import freeze_command, freeze_status, unfreeze_command
from core.freezes import Freezes
from core.memory import MemoryService
from core.model import RESERVED_SESSION_PREFIXES, SessionInfo, SessionStatus
from core.people import Person
from core.replies import PLAIN, Marks, asked_by, listed_call, typed
from core.schedules import ScheduleService
from core.store.subagents import INTERRUPTED as SUBAGENT_INTERRUPTED
from core.store.subagents import SubAgentStore
from core.text import parse_id
from core.triggers import parse_when

_TRIGGER = re.compile(r"[A-Za-z0-9._-]{1,128}")
_RUN_STATES = {"running": "running", "finished": "finished", "failed": "failed", "cancelled": "stopped"}


@dataclass(frozen=True)
class Command:
    """One use of the command, as the platform said it."""

    text: str  # what followed the command's name
    user: str
    channel: str  # the channel's name ("slack")
    place: str  # where it was typed, e.g. "slack:T1:C1": what it lists and acts on
    reply_ref: dict[str, Any] = field(default_factory=dict)  # a top-level message in that place
    trigger: str | None = None  # the platform's id for this use (a fresh one when None)
    name: str = "/bot"  # how people type it, for the texts that quote it
    session: str | None = None  # the conversation it was typed in, when the platform says so (a thread)


@dataclass(frozen=True)
class Status:
    paused: bool
    accepting: bool
    running: int
    queue_mode: str


class Commands:
    def __init__(self, dispatcher: Dispatcher, approvals: ApprovalBroker, schedules: ScheduleService, *,
                 connections: ConnectionService | None = None, memory: MemoryService | None = None,
                 freezes: Freezes | None = None) -> None:
        self.dispatcher = dispatcher
        self.memory = memory
        self.connections = connections
        self.approvals = approvals
        self.schedules = schedules
        self.freezes = freezes

    async def status(self) -> Status:
        return Status(paused=await self.dispatcher.paused(), accepting=self.dispatcher.accepting,
                      running=self.dispatcher.running_sessions, queue_mode=self.dispatcher.config.queue_mode)

    async def run(self, command: Command, marks: Marks = PLAIN) -> str:
        """The reply to ``command`` (refusals included: they are replies too)."""
        words = command.text.split()
        sub = words[0].lower() if words else "help"
        if sub == "status":
            return (await self._status(command.session) + await self._spending(command)
                    + await freeze_status(self.freezes, marks))
        if sub == "stop":
            return await self._stop(command, marks)
        if sub == "queue" and len(words) == 2:
            return await self._queue(command, words[1].lower(), marks)
        if sub == "approvals":
            return await self._approvals(command, words[1:], marks)
        if sub == "schedules":
            return await self._schedules(command, words[1:], marks)
        if sub == "schedule":
            return await self._schedule(command, command.text.strip()[len("schedule"):].strip(), marks)
        if sub == "connections":
            return await self._connections(command, words[1:], marks)
        if sub == "memory" and len(words) == 1:
            return await self._memory(command, marks)
        if sub in ("freeze", "unfreeze") and self.freezes is not None:
            return await self._freeze(command, sub, words[1:], marks)
        if sub == "help":
            return help_text(command.name)
        typed_words = f"{command.name} {typed(' '.join(words))}"  # quoted back: no backtick can end the code span
        return f"I don't know {marks.code(typed_words)}.\n{help_text(command.name)}"

    async def _status(self, session: str | None) -> str:
        status = await self.status()
        state = "paused by an operator" if status.paused else (
            "taking messages" if status.accepting else "not taking messages")
        budget = self.dispatcher.runner.budget
        used = await budget.status(session) if budget is not None and session is not None else None
        helpers = await self._subagents(session) if session is not None else ""
        return (f"I'm up and {state}; {status.running} conversation(s) working now. "
                f"Default queue mode: {status.queue_mode}." + (f" This thread: {used}." if used else "") + helpers)

    async def _freeze(self, command: Command, sub: str, words: list[str], marks: Marks) -> str:
        assert self.freezes is not None
        policy, user, channel = self.approvals.policy, command.user, command.channel
        if sub == "unfreeze":
            return await unfreeze_command(self.freezes, policy, user=user, channel=channel, marks=marks)
        return await freeze_command(self.freezes, policy, user=user, channel=channel, words=words, name=command.name,
                                    marks=marks)

    async def _spending(self, command: Command) -> str:
        """The agent's usage today and this month against its caps, and the person's today (core.spending)."""
        spending = self.dispatcher.runner.spending
        if spending is None:
            return ""
        session = await self.dispatcher.conversations.get_session(command.session) if command.session else None
        agent = session.agent if session is not None else self.dispatcher.agents.default.name
        shown = await spending.status(agent, command.user)
        return f" Spending: {shown}." if shown else ""

    async def _subagents(self, session: str) -> str:
        """Which sub-agents ran in this conversation (core.subagents), the latest ten."""
        runs = await SubAgentStore(self.dispatcher.conversations.db).runs(session)
        if not runs:
            return ""
        shown = "; ".join(f"{r.agent} ({r.session_id}) {_RUN_STATES.get(r.status, r.status)}"
                          + (" (interrupted)" if r.error == SUBAGENT_INTERRUPTED else "") for r in runs[-10:])
        return f" Sub-agents: {shown}" + (f" (and {len(runs) - 10} earlier)" if len(runs) > 10 else "") + "."

    async def _stop(self, command: Command, marks: Marks) -> str:
        # Exact: the thread it was typed in, else the place's one busy thread (never a guess among several).
        try:
            if command.session is not None:
                return (await self.dispatcher.stop_session(command.session, by=command.user)).describe(None)
            report = await self.dispatcher.stop_place(command.place, by=command.user)
        except InvalidInput as exc:
            return marks.text(str(exc))
        if report is None:
            return "Nothing to stop in this channel."
        return f"{report.describe(None)} (the one busy thread here)"

    async def _queue(self, command: Command, mode: str, marks: Marks) -> str:
        try:
            await self.dispatcher.set_place_queue_mode(command.place, mode, by=command.user, channel=command.channel)
        except InvalidInput as exc:
            return marks.text(str(exc))
        return (f"Queue mode in this channel is now {mode} "
                "(a thread can still override it: mention me with `queue collect`).")

    async def _approvals(self, command: Command, args: list[str], marks: Marks) -> str:
        if len(args) == 2 and args[0] == "revoke":
            grant_id = parse_id(args[1])
            if grant_id is None:
                return (f"{marks.code(typed(args[1]))} is not a grant id (a number such as 12: "
                        f"see `{command.name} approvals`).")
            try:
                return await self.approvals.revoke_grant(grant_id, by=command.user, channel=command.channel)
            except InvalidInput as exc:
                return marks.text(str(exc))
        # What this user may see: this place's items, or everything for an admin (the broker decides).
        viewer = Person(command.channel, command.user)
        pending = await self.approvals.pending(place=command.place, viewer=viewer)
        grants = await self.approvals.grants(place=command.place, viewer=viewer)
        where = "" if self.approvals.policy.is_admin(command.user, channel=command.channel) else " in this channel"
        lines = [f"{marks.bold(f'Pending approvals{where}:')} {len(pending)}"]
        lines += [f"• #{p.id} {marks.code(p.tool)} — {asked_by(p, marks)}, expires {p.expires_at:%H:%M} UTC"
                  for p in pending[:20]]
        lines.append(f"{marks.bold(f'Always-allow grants{where}:')} {len(grants)} (each covers one exact call)")
        now = self.approvals.clock.now()
        lines += [f"• {g.id}: agent {marks.code(g.agent)} may run {marks.code(g.tool)}"
                  + (" in one thread" if g.thread is not None else "")
                  + (f"{' of' if g.thread is not None else ' in'} {marks.place(g.place)}" if g.place else "")
                  + f" (by {marks.user(g.created_by)})"
                  + (f", until {g.expiry(now)}" if g.expires_at is not None else "") + ", exactly:"
                  + listed_call(g.describe(), marks) for g in grants[:30]]
        if grants:
            lines.append(f"Revoke one with `{command.name} approvals revoke <id>` (admins).")
        return "\n".join(lines)

    async def _schedules(self, command: Command, words: list[str], marks: Marks) -> str:
        if words and words[0] in ("pause", "resume", "cancel") and len(words) == 2:
            schedule_id = parse_id(words[1])
            if schedule_id is None:
                return (f"{marks.code(typed(words[1]))} is not a schedule id (a number such as 12: "
                        f"see `{command.name} schedules`).")
            try:
                return await self.schedules.change(schedule_id, words[0], by=command.user, channel=command.channel,
                                                   place=command.place)
            except InvalidInput as exc:
                return marks.text(str(exc))
        # What this user may see: this place's schedules, or every one for an admin (the service decides).
        rows = await self.schedules.list(place=command.place, viewer=Person(command.channel, command.user))
        if not rows:
            where = "" if self.schedules.policy.is_admin(command.user, channel=command.channel) else " in this channel"
            return f"No schedules{where}. Create one: `{command.name} schedule every 1h #ops summarize open incidents`"
        return "\n".join(
            f"• {r.id}: {marks.text(r.describe())} → {marks.text(r.destination)} {marks.bold(marks.text(r.status))} "
            f"(by {marks.user(r.creator)}) · firings {r.firings} · last: {marks.text(r.last_outcome or 'none yet')}"
            for r in rows[:30]
        ) + f"\n`{command.name} schedules pause|resume|cancel <id>` (creator or admin)"

    async def _schedule(self, command: Command, text: str, marks: Marks) -> str:
        try:
            trigger, rest = parse_when(text)
            destination, _, prompt = rest.partition(" ")
            if not destination or not prompt.strip():
                return f"Not scheduled: usage: {command.name} schedule every 5m #channel <prompt>"
            # The destination approval is asked where the command was typed, as a top-level message, in a
            # session of its own; the schedule runs the default agent.
            origin = SessionInfo(id=f"{command.place}:command-{_trigger(command)}", channel=command.channel,
                                 agent=self.dispatcher.agents.default.name, status=SessionStatus.IDLE,
                                 reply_ref=dict(command.reply_ref), place=command.place)
            if origin.id.startswith(RESERVED_SESSION_PREFIXES):
                raise InvalidInput(f"session id {origin.id!r} is reserved")
            schedule = await self.schedules.create(prompt=prompt, trigger=trigger, destination=destination,
                                                   agent=origin.agent, creator=command.user, origin=origin,
                                                   channel=command.channel)
        except InvalidInput as exc:
            return f"Not scheduled: {marks.text(str(exc))}"
        return (f"Schedule {schedule.id} created ({marks.text(trigger.describe())} → "
                f"{marks.text(destination)}); it starts once posting to {marks.text(destination)} is approved.")


    async def _connections(self, command: Command, words: list[str], marks: Marks) -> str:
        """Yours and the shared ones (never a token); ``disconnect NAME`` revokes yours at the provider first."""
        service = self.connections
        if service is None or not service.specs:
            return "No connections are configured (bot.toml [[connections]])."
        if len(words) == 2 and words[0].lower() == "disconnect":
            name = words[1]
            spec = service.specs.get(name)
            if spec is None:
                return f"No connection named {marks.code(typed(name))} is configured."
            if spec.owner == "shared" and not service.policy.is_admin(command.user, channel=command.channel):
                return f"{name} is shared: only an admin disconnects it."
            if spec.owner == "user" and not service.holds_accounts(command.user, command.channel):
                return f"There is no {name} connection of {command.user}."  # another channel's person's
            try:
                return await service.disconnect(name, command.user, by=command.user)
            except InvalidInput as exc:
                return str(exc)
        if words:
            return f"Use {marks.code(f'{command.name} connections')} or " \
                   f"{marks.code(f'{command.name} connections disconnect NAME')}."
        # Another channel's person's accounts are not this person's: the shared ones only.
        mine = command.user if service.holds_accounts(command.user, command.channel) else ""
        views = await service.views(mine, with_shared=True)
        lines = [f"• {view.describe()}" for view in views]
        absent = [name for name in sorted(service.specs) if not any(v.name == name for v in views)]
        if absent:
            lines.append("Not connected: " + ", ".join(absent) + " (you are asked when the agent needs one)")
        return "Your connections:\n" + "\n".join(lines) if views else "\n".join(["You have no connections.", *lines])


    async def _memory(self, command: Command, marks: Marks) -> str:
        """The pinned memories of the agent that answers here (the thread's, else the default): what goes into every
        one of its conversations. Shown to whoever asks, as the agent could repeat them to them anyway."""
        if self.memory is None:
            return "Memory is not available here."
        session = await self.dispatcher.conversations.get_session(command.session) if command.session else None
        agent = session.agent if session is not None else self.dispatcher.agents.default.name
        pinned = await self.memory.pinned(agent, limit=MEMORY_SHOWN + 1)
        held = await self.memory.store.count(agent)
        head = f"{marks.bold(f'Pinned memories of agent {marks.text(agent)}:')} {min(len(pinned), MEMORY_SHOWN)}"
        if len(pinned) > MEMORY_SHOWN:
            head += f" newest shown (of more: `bot memory list --agent {agent}` lists all)"
        lines = [head]
        for m in pinned[:MEMORY_SHOWN]:  # masked: a memory kept before its words became a stored secret
            lines.append(f"• #{m.id} {marks.text(_short(await self.memory.mask(m.text)))} "
                         f"(by {marks.user(m.written_by or 'unknown')}, {m.created_at:%Y-%m-%d})")
        lines.append(f"{held} memor{'y' if held == 1 else 'ies'} in all (the agent finds the rest with recall). "
                     "Ask me to remember or forget something, or an operator: `bot memory forget <id>`.")
        return "\n".join(lines)


MEMORY_SHOWN = 20  # pinned memories listed by `/bot memory`
_SHOWN_CHARS = 200


def _short(text: str) -> str:
    """A memory on one line, every character accounted for, at most ``_SHOWN_CHARS`` (a reply has a size limit)."""
    line = visible(text).replace("\n", " ⏎ ")
    return line if len(line) <= _SHOWN_CHARS else line[:_SHOWN_CHARS - 1] + "…"


def _trigger(command: Command) -> str:
    """The command's own id in its origin session's id: the platform's, when it has a safe shape."""
    if command.trigger is not None and _TRIGGER.fullmatch(command.trigger):
        return command.trigger
    return uuid.uuid4().hex


def help_text(name: str) -> str:
    c = name
    return (
        "Mention me in a thread (or DM me) and I'll answer there; every reply in that thread is "
        "context for the next one. Messages sent while I work are taken into what I'm doing.\n"
        "In a thread: `@bot stop` stops my work there; `@bot queue steer|collect|followup` sets how "
        "messages sent while I work are handled. Stopping and the queue mode are for whoever asked, "
        "approvers and admins.\n"
        f"`{c} status` — am I up and how busy\n`{c} stop` — stop my work here (the one busy thread; with "
        "several, the Stop button or the message shortcut \"Stop this turn\" in that thread)\n"
        f"`{c} queue steer|collect|followup` — the queue mode for this channel\n"
        f"`{c} schedule every 1h #ops <prompt>` — run a prompt on a schedule (also `cron \"0 9 * * 1-5\"`, "
        f"`at 2026-12-01T09:00`); `{c} schedules` — this channel's schedules (all of them for admins): "
        "list, pause, resume, cancel\n"
        f"`{c} approvals` — pending approvals and \"Always allow\" grants; "
        f"`{c} approvals revoke <id>` (admins)\n"
        f"`{c} freeze <until> <reason>` — a change freeze: calls that need approval are refused until then; "
        f"`{c} unfreeze` (admins)\n"
        f"`{c} connections` — your connected accounts; `{c} connections disconnect <name>`\n"
        f"`{c} memory` — the agent's pinned memories (only you see this)\n`{c} help` — this text"
    )

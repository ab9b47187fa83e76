"""Slack rendering of core events: progress signs, notices, failures, approval and credential cards, DMs.

Answers are not posted here: core delivers them through the port (``channels.slack.port``).

The progress sign shows once a turn has run for ``progress_delay_s``: a turn answered sooner needs no
sign (its answer is one), and it saves the two calls (Slack's Tier 3, ~50 a minute) that busy
workspaces would otherwise spend on every quick answer. The sign is the thread's status line
(``channels.slack.status``: "is thinking…", then what the turn is doing), or, where Slack refuses
that, an :eyes: reaction on each message the turn took.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import Later, best_effort, error_code
from channels.slack.approvals import SlackApprovals
from channels.slack.blocks import stop_block
from channels.slack.connections import SlackConnections
from channels.slack.credentials import SlackCredentials
from channels.slack.formatting import escape
from channels.slack.payloads import slack_person
from channels.slack.port import SlackPort
from channels.slack.status import THINKING, ThreadStatus
from channels.slack.streams import SlackStreams
from channels.slack.workspaces import in_workspace, session_team
from core.display import activity
from core.events import (
    AnswerDelta,
    ApprovalReminded,
    ApprovalRequested,
    ApprovalResolved,
    ApprovalVoted,
    ConnectionRequested,
    ConnectionResolved,
    CredentialRequested,
    CredentialResolved,
    DirectNotice,
    Event,
    FreezeNotice,
    InputQueued,
    InputsTaken,
    Notice,
    ToolStarted,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from core.model import MessageRef, TurnInfo

log = logging.getLogger(__name__)

PROGRESS_REACTION = "eyes"  # a turn is working on this message
QUEUED_REACTION = "hourglass_flowing_sand"  # this message waits behind the running turn
STATUS_REFRESH_S = 100.0  # Slack clears a status line after 2 minutes without a message in the thread
STATUS_REFRESHES = 30  # ...so a long turn says it again, for up to 50 minutes


@dataclass
class _Progress:
    """A running turn's progress sign: the messages it is on, and whether it shows yet."""

    refs: dict[MessageRef, None] = field(default_factory=dict)  # in order, each once
    timer: asyncio.TimerHandle | None = None
    shown: bool = False
    showing: asyncio.Task[None] | None = None  # the delayed reactions, while on their way
    leftover: bool = False  # resumed after a restart: the process before may have shown the sign
    place: tuple[str, str] | None = None  # the thread (channel, thread ts) whose status line can show it
    status: bool = False  # shown as the thread's status line, not as reactions
    status_text: str = ""  # what the status line says now (said again before Slack's 2-minute timeout)
    refresh: asyncio.TimerHandle | None = None
    refreshing: asyncio.Task[bool] | None = None  # a refresh on its way (the clearing waits for it)
    refreshes: int = 0
    offer: asyncio.TimerHandle | None = None  # the Stop button offered to whoever asked, once due


class SlackRenderer:
    def __init__(self, client: AsyncWebClient, port: SlackPort, approvals: SlackApprovals,
                 credentials: SlackCredentials, connections: SlackConnections, *, progress_delay_s: float = 0.0,
                 streams: SlackStreams | None = None, stop_offer_s: float = 0.0) -> None:
        self.client = client
        self.port = port
        self.streams = streams  # the answer shown while it is written (None: only once it is delivered)
        self.approvals = approvals
        self.credentials = credentials
        self.connections = connections
        self.progress_delay_s = progress_delay_s
        self.stop_offer_s = stop_offer_s
        self._later = Later()
        self.status = ThreadStatus(client)
        self.people = port.people  # one cache of users.info with the port (names here, trust labels there)
        # Which messages show the "queued" sign, and each running turn's progress sign (rendering
        # details, so memory is enough: after a restart a leftover sign is only cosmetic).
        self._queued_signs: set[MessageRef] = set()
        self._progress: dict[int, _Progress] = {}

    async def render(self, event: Event) -> None:
        # Every call made for the event (and the timers and tasks it starts) acts in the session's workspace.
        with in_workspace(session_team(event.session.id, event.session.reply_ref)):
            await self._render(event)

    async def _render(self, event: Event) -> None:
        if isinstance(event, DirectNotice):
            await self._direct(event.user, event.text)
            return
        if not event.session.reply_ref.get("channel"):
            return
        if isinstance(event, InputQueued):
            self._queued_signs.add(event.ref)
            await self._react("reactions_add", event.ref, QUEUED_REACTION)
        elif isinstance(event, InputsTaken):
            await self._taken(event)
        elif isinstance(event, AnswerDelta):
            if self.streams is not None:
                self.streams.add(event.session, event.turn.id, event.turn.sender, event.text, restart=event.restart)
        elif isinstance(event, TurnStarted):
            self._offer_stop_later(event.turn)
        elif isinstance(event, TurnFinished):
            await self._clear(event.turn)
        elif isinstance(event, TurnCancelled):
            await self._end_stream(event.turn, "(stopped)")
            await self._clear(event.turn)
        elif isinstance(event, TurnFailed):
            await self._end_stream(event.turn, "(stopped: see below)")
            if not event.turn.answer_optional:  # nobody asked a listening turn anything: its failure is only logged
                await self.port.post_for(event.session, f":warning: {escape(event.message)}")  # may quote an endpoint
            await self._clear(event.turn)
        elif isinstance(event, FreezeNotice):  # said in the thread, then on its status line (a post clears that)
            await self.port.post_notice(event.session, event.text)
            await self._status(event.turn_id, event.status)
        elif isinstance(event, Notice):
            await self.port.post_notice(event.session, event.text)
        elif isinstance(event, ToolStarted):
            await self._status(event.turn.id, f"is {activity(event.tool)}")
        elif isinstance(event, ApprovalRequested):
            if event.batch:  # one model step's gated calls: one card
                await self.approvals.announce_batch(event.batch, event.deciders)
            else:
                await self.approvals.announce(event.request, event.deciders)
            if self._shows_status(event.request.turn_id):
                await self._status(event.request.turn_id, await self._waiting_for(event.deciders))
        elif isinstance(event, ApprovalResolved | ApprovalVoted):  # in place: the outcome, or the votes so far
            await self.approvals.resolve(event.request)
        elif isinstance(event, ApprovalReminded):
            await self.approvals.remind(event.request, event.deciders, event.left)
        elif isinstance(event, CredentialRequested):
            await self.credentials.announce(event.request)
            await self._status(event.request.turn_id, "is waiting for a credential…")
        elif isinstance(event, CredentialResolved):
            await self.credentials.resolve(event.request)
        elif isinstance(event, ConnectionRequested):
            await self.connections.announce(event.request)
            await self._status(event.request.turn_id, f"is waiting for {event.request.connection} to be connected…")
        elif isinstance(event, ConnectionResolved):
            await self.connections.resolve(event.request)

    async def _end_stream(self, turn: TurnInfo, note: str) -> None:
        if self.streams is not None:
            await self.streams.abandon(turn.id, note)

    async def _taken(self, event: InputsTaken) -> None:
        for item in event.refs:
            if item in self._queued_signs:  # the sign changes: heard, and now being worked on
                self._queued_signs.discard(item)
                await self._react("reactions_remove", item, QUEUED_REACTION)
        progress = self._progress.setdefault(event.turn_id, _Progress())
        progress.leftover = progress.leftover or event.resumed
        ref = event.session.reply_ref
        if progress.place is None and ref.get("channel") and ref.get("thread_ts"):
            progress.place = (str(ref["channel"]), str(ref["thread_ts"]))
        new = [item for item in event.refs if item not in progress.refs]
        progress.refs.update(dict.fromkeys(new))
        if progress.shown:
            if not progress.status:  # the status line covers the whole thread; reactions mark each message
                for item in new:
                    await self._react("reactions_add", item, PROGRESS_REACTION)
        elif self.progress_delay_s <= 0:
            progress.shown = True
            await self._sign(progress, new)
        elif progress.timer is None:
            progress.timer = asyncio.get_running_loop().call_later(
                self.progress_delay_s, self._show_later, event.turn_id)

    def _show_later(self, turn_id: int) -> None:
        progress = self._progress.get(turn_id)
        if progress is None or progress.shown:
            return
        progress.shown, progress.timer = True, None
        progress.showing = asyncio.create_task(self._show(progress, list(progress.refs)))

    async def _show(self, progress: _Progress, refs: list[MessageRef]) -> None:
        try:
            await self._sign(progress, refs)
        except Exception as exc:  # Slack unreachable: a missing sign is only cosmetic
            log.warning("progress sign failed: %s", type(exc).__name__)

    async def _sign(self, progress: _Progress, refs: list[MessageRef]) -> None:
        """The thread's status line if Slack shows one here, else the :eyes: reaction on each message."""
        if progress.place is not None and await self.status.show(*progress.place, THINKING):
            progress.status, progress.status_text = True, THINKING
            self._keep_status(progress)
            return
        for item in refs:
            await self._react("reactions_add", item, PROGRESS_REACTION)

    def _shows_status(self, turn_id: int | None) -> bool:
        progress = self._progress.get(turn_id) if turn_id is not None else None
        return progress is not None and progress.status

    async def _status(self, turn_id: int | None, text: str) -> None:
        """A new status line for a turn that shows one (what it is doing now)."""
        progress = self._progress.get(turn_id) if turn_id is not None else None
        if progress is not None and progress.status and progress.place is not None:
            progress.status_text = text
            await self.status.show(*progress.place, text)

    def _keep_status(self, progress: _Progress) -> None:
        """Slack drops a status line after two minutes without a message: a long turn says it again."""
        def again() -> None:
            # A turn this process lost (another replica took it over, or a crash is being recovered) never
            # ends here: its status is said again a bounded number of times, never for ever.
            if progress.refresh is None or progress.place is None or progress.refreshes >= STATUS_REFRESHES:
                progress.refresh = None
                return
            progress.refreshes += 1
            progress.refreshing = asyncio.create_task(self.status.show(*progress.place, progress.status_text))
            progress.refresh = asyncio.get_running_loop().call_later(STATUS_REFRESH_S, again)

        progress.refresh = asyncio.get_running_loop().call_later(STATUS_REFRESH_S, again)

    async def _waiting_for(self, deciders: tuple[str, ...]) -> str:
        """ "is waiting for approval from @alice…", when the few people asked have names to show."""
        # Slack's people by name (``slack:U1`` as ``U1``); anyone else has no Slack name: the plain line.
        asked = deciders if 0 < len(deciders) <= 3 else ()
        names = [await self.people.name(ident) if (ident := slack_person(d)) else None for d in asked]
        if not names or None in names:
            return "is waiting for approval…"
        return f"is waiting for approval from {' or '.join(f'@{n}' for n in names)}…"

    def _offer_stop_later(self, turn: TurnInfo) -> None:
        """A turn still working after ``stop_offer_s`` offers whoever asked a Stop button, privately in the
        thread (Slack lets no button ride on a status line or on a message while it streams)."""
        ref = turn.session.reply_ref
        # Only to a Slack person (not an event's sender), in a thread (an event's first turn has none yet).
        # Nor to whoever wrote what a listening turn took: they asked nothing, and it may end without a word.
        if self.stop_offer_s <= 0 or not turn.sender or slack_person(turn.sender) is None or not ref.get("channel") \
                or not ref.get("thread_ts") or turn.answer_optional:
            return
        progress = self._progress.setdefault(turn.id, _Progress())

        def offer() -> None:
            progress.offer = None
            if self._progress.get(turn.id) is not progress:
                return  # ended meanwhile
            self._later.run(self._offer_stop(turn, str(ref["channel"]), str(ref["thread_ts"])))

        progress.offer = asyncio.get_running_loop().call_later(self.stop_offer_s, offer)

    async def _offer_stop(self, turn: TurnInfo, channel: str, thread_ts: str) -> None:
        text = "I'm still working on this. If it's no longer needed, stop it here."
        await best_effort(self.client, "chat_postEphemeral", channel=channel, user=str(turn.sender),
                          thread_ts=thread_ts, text=text,
                          blocks=[{"type": "section", "text": {"type": "mrkdwn", "text": text}}, stop_block(turn.id)])

    async def _clear(self, turn: TurnInfo) -> None:
        progress = self._progress.pop(turn.id, None)
        if progress is not None and progress.offer is not None:
            progress.offer.cancel()
            progress.offer = None
        if progress is not None and progress.refresh is not None:
            progress.refresh.cancel()
            progress.refresh = None
        if progress is not None and progress.refreshing is not None:
            await asyncio.wait([progress.refreshing])  # a refresh still on its way lands before the clearing
        if progress is not None and progress.timer is not None:  # ended before its sign was due
            progress.timer.cancel()
            if not progress.leftover:
                return
        if progress is not None and progress.showing is not None:
            await progress.showing  # an add still on its way lands before its removal
        if progress is not None and progress.status and progress.place is not None:
            await self.status.show(*progress.place, "")
            if not progress.leftover:
                return
        # A turn this process never saw start (it ran before a restart) may still wear its sign.
        for item in progress.refs if progress is not None else turn.inputs:
            await self._react("reactions_remove", item, PROGRESS_REACTION)

    async def _direct(self, user: str, text: str) -> None:
        try:
            opened = await self.client.conversations_open(users=user)
            await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text)
        except SlackApiError as exc:
            log.error("could not DM %s: %s", user, error_code(exc))

    async def _react(self, method: str, item: MessageRef, name: str) -> None:
        if not item.channel or not item.ts:
            return
        try:
            await getattr(self.client, method)(channel=item.channel, timestamp=item.ts, name=name)
        except SlackApiError as exc:
            code = error_code(exc)
            if code not in ("already_reacted", "no_reaction"):
                log.warning("%s failed: %s", method, code)
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:  # RuntimeError: shutting down
            log.warning("%s failed: %s", method, type(exc).__name__)  # a sign is only cosmetic

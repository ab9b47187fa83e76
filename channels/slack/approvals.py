"""Approvals in Slack: the Block Kit request message, its buttons, the Deny reason modal, and the
in-place update once settled. Every rule (who may decide, settle once) is core's (through the Gateway)."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from channels.slack.api import PrivateReplies, error_code
from channels.slack.approval_cards import (
    DENY_VIEW,
    EDIT_VIEW,
    approval_blocks,
    batch_blocks,
    batch_fallback_text,
    deny_modal,
    edit_modal,
    fallback_text,
    fits_in_batch,
    fits_on_card,
    mention,
    time_left,
)
from channels.slack.formatting import escape
from channels.slack.payloads import channel_id, input_value, slack_person, user_id
from channels.slack.request_cards import CardMessages, carried_id, section
from channels.slack.threads import SessionThreads
from channels.slack.tool_effects import ToolEffects
from channels.slack.workspaces import in_workspace, request_workspace, team_of
from core.display import arguments_text
from core.errors import InvalidInput, NotFound
from core.gateway import Gateway
from core.model import ApprovalInfo

log = logging.getLogger(__name__)

ACTION = re.compile(r"^approval:(approve|deny|always|thread|stop|edit)$")
BATCH_ACTION = re.compile(r"^approval_batch:(approve|deny)$")
_BATCH_MAX = 10  # calls on one card (Slack allows 50 blocks); more, and each gets its own card
_MAX_DM_CARDS = 25  # a group of hundreds is asked in the thread, not by hundreds of DMs
_TOO_BIG = {"invalid_blocks", "msg_too_long", "too_many_blocks", "msg_blocks_too_long"}


class SlackApprovals:
    def __init__(self, app: AsyncApp, client: AsyncWebClient, gateway: Gateway, channel: str,
                 members: Callable[[str], Awaitable[set[str]]] | None = None,
                 threads: SessionThreads | None = None) -> None:
        self.client = client
        self.gateway = gateway
        self.channel = channel  # the channel's name in core ("slack"): whose people click here
        self.members = members  # a user group's members (SlackPort.group_members): DM cards go to each
        self.threads = threads or SessionThreads(gateway)  # where the request's conversation posts now
        self._private = PrivateReplies(client)
        self._cards = CardMessages(client, "approval", self.threads)
        self._effects = ToolEffects(client)  # what a Slack tool's call will do, in words, on its card
        app.action(ACTION)(self._on_click)
        app.action(BATCH_ACTION)(self._on_batch_click)
        app.view(DENY_VIEW)(self._on_deny_submitted)
        app.view(EDIT_VIEW)(self._on_edit_submitted)

    # -- rendering ------------------------------------------------------------------------------

    async def announce_batch(self, requests: tuple[ApprovalInfo, ...], deciders: tuple[str, ...] = ()) -> None:
        """One model step's gated calls on one card in the thread. A batch that cannot be one card (too many calls,
        arguments too long for their part of it, or a rule that asks by DM) is shown as a card per call."""
        current = [await self.gateway.approval(r.id) or r for r in requests]
        if (len(current) > _BATCH_MAX or not all(fits_in_batch(r) for r in current)
                or any(r.notify != ("thread",) for r in current)):
            for request in current:
                await self.announce(request, deciders)
            return
        effects = {r.id: effect for r in current
                   if (effect := await self._effects.describe(r.tool, r.arguments,
                                                              team=team_of(r.session.place))) is not None}

        async def send(channel: str, thread_ts: str | None) -> AsyncSlackResponse:
            return await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts,
                                                      text=batch_fallback_text(current),
                                                      blocks=batch_blocks(current, effects))
        try:
            posted = await self.threads.post(current[0].session, send, lambda posted: str(posted["ts"]))
        except SlackApiError as exc:  # e.g. Slack is down: they stay pending, and expire if nobody can decide
            log.error("could not post approvals %s: %s", [r.id for r in current], error_code(exc))
            if error_code(exc) in _TOO_BIG:  # too much for one message after all: a card each
                for request in current:
                    await self.announce(request, deciders)
            return
        for request in current:
            where: dict[str, Any] = {"channel": posted["channel"], "ts": posted["ts"], "batch": True}
            if request.id in effects:
                where["effect"] = effects[request.id]
            await self.gateway.approval_shown(request.id, where)
        # Decided while it was posted: the card shows it now.
        latest = await self.gateway.approval_batch(current[0])
        if any(r.settled for r in latest):
            await self.resolve(latest[0])

    async def announce(self, request: ApprovalInfo, deciders: tuple[str, ...] = ()) -> None:
        """The card in the thread and, with a rule's ``notify = ["dm"]``, in each decider's DM; where each
        copy is goes on record, so a decision anywhere updates them all."""
        attached = None
        if not request.settled and not fits_on_card(request):
            # The file goes first, so no button is ever shown before the arguments can be read.
            attached = await self._attach(request)
            if attached is None:
                await self.gateway.approval_unshowable(request.id)
                return
        where: dict[str, Any] = {}
        effect = await self._effects.describe(request.tool, request.arguments, team=team_of(request.session.place))
        cut = False
        if "dm" in request.notify:
            where["copies"], cut = await self._dm_cards(request, deciders, effect=effect)
        # The thread too, unless only DMs were asked for and every one landed: never shown nowhere.
        if "thread" in request.notify or not where.get("copies") or cut:
            for attempt in range(2):
                try:
                    # The conversation's first post (an event's) opens its thread: the answer follows it there.
                    posted = await self.threads.post(request.session, self._card_sender(request, attached, effect),
                                                     lambda posted: str(posted["ts"]))
                    where |= {"channel": posted["channel"], "ts": posted["ts"]}
                    break
                except SlackApiError as exc:
                    log.error("could not post approval %s: %s", request.id, error_code(exc))
                    if attempt or attached is not None or request.settled or error_code(exc) not in _TOO_BIG:
                        break  # e.g. Slack is down: it stays pending, and expires if nobody can decide
                # Slack would not take the arguments on the card after all: attach them, or refuse the call.
                attached = await self._attach(request)
                if attached is None:
                    await self.gateway.approval_unshowable(request.id)
                    break
        if where:
            if effect is not None:  # kept with the card: the settled card says what was asked, not what is true now
                where["effect"] = effect
            await self.gateway.approval_shown(request.id, where)

    def _card_sender(self, request: ApprovalInfo, attached: str | None, effect: str | None
                     ) -> Callable[[str, str | None], Awaitable[AsyncSlackResponse]]:
        async def send(channel: str, thread_ts: str | None) -> AsyncSlackResponse:
            return await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=fallback_text(request),
                                                      blocks=approval_blocks(request, attached=attached, effect=effect))
        return send

    async def remind(self, request: ApprovalInfo, deciders: tuple[str, ...], left: timedelta) -> None:
        """A reminder in the thread that mentions whoever may decide (escalated ones included), and with DM
        cards a new card in each one's DM (kept on record with the others)."""
        current = await self.gateway.approval(request.id)
        if current is None or current.settled:  # decided meanwhile: nothing to remind anyone of
            return
        people = " ".join(mention(d) for d in deciders if slack_person(d)) or "approvers"
        text = (f":bell: Reminder: {people} — `{escape(request.tool)}` is still waiting for a decision; "
                f"about {time_left(left)} left before it expires.")
        try:
            await self.threads.post(request.session, lambda channel, thread_ts: self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=text), lambda posted: str(posted["ts"]))
        except SlackApiError as exc:
            log.warning("could not remind about approval %s: %s", request.id, error_code(exc))
        if "dm" in request.notify:
            copies, _cut = await self._dm_cards(current, deciders, reminder=True, effect=_effect(current))
            latest = await self.gateway.approval(request.id) or current
            where = dict(latest.announcement or {})
            where["copies"] = [*where.get("copies", []), *copies]
            await self.gateway.approval_shown(request.id, where)
            settled = await self.gateway.approval(request.id)
            if settled is not None and settled.settled:  # decided while these went out: no buttons left on them
                await self.resolve(settled)

    async def _dm_cards(self, request: ApprovalInfo, deciders: tuple[str, ...], *, reminder: bool = False,
                        effect: str | None = None) -> tuple[list[dict[str, str]], bool]:
        """The card in each decider's DM (people named first, then user groups' members; at most
        _MAX_DM_CARDS): where each landed, and whether the list was cut short. Arguments too long for a card
        go to each DM as a file first."""
        # Slack's people only, bare (``U1``) or named with their channel (``slack:U1``); another channel's
        # person (``web:web``, ``testchat:U1``) is never DMed here, even with an id of Slack's shape.
        ids = [ident for d in deciders if (ident := slack_person(d)) is not None]
        people = [d for d in ids if d[:1] in ("U", "W")]
        for group in (d for d in ids if d.startswith("S")):
            if self.members is not None:
                people += sorted(await self.members(group))
        people = list(dict.fromkeys(people))
        cut = len(people) > _MAX_DM_CARDS
        if cut:
            log.warning("approval %s: %d approvers, cards by DM to the first %d (the thread has it too)",
                        request.id, len(people), _MAX_DM_CARDS)
        copies = []
        for user in people[:_MAX_DM_CARDS]:
            try:
                channel = (await self.client.conversations_open(users=user))["channel"]["id"]
                attached = None
                if not fits_on_card(request):  # they must be able to read every argument where they decide
                    attached = await self._attach(request, channel=channel)
                    if attached is None:
                        continue
                blocks = approval_blocks(request, attached=attached, effect=effect)
                if reminder:
                    blocks = [section(":bell: Reminder: this still waits for your decision."), *blocks]
                posted = await self.client.chat_postMessage(channel=channel, text=fallback_text(request), blocks=blocks)
                copies.append({"channel": posted["channel"], "ts": posted["ts"]})
            except Exception as exc:  # one DM failing (closed DMs, the network) leaves the others
                log.warning("could not send approval %s to %s by DM: %s", request.id, user,
                            error_code(exc) if isinstance(exc, SlackApiError) else type(exc).__name__)
        return copies, cut

    async def _attach(self, request: ApprovalInfo, *, channel: str | None = None) -> str | None:
        """Post the arguments in full as a file in the request's thread (or in ``channel``, a DM); its name, or
        None if that failed."""
        # Never the conversation's first post: in its thread if one is open, else top-level (the card follows).
        place, thread_ts = await self.threads.place(request.session) if channel is None else (channel, None)
        filename = f"approval-{request.id}-arguments.txt"
        content = (f"Approval request {request.id}: {request.agent} wants to run {request.tool}.\n"
                   "Every argument in full. Whitespace and invisible characters are shown as marks like "
                   "⟦3 spaces⟧ or ⟦U+202E⟧.\n\n" + arguments_text(request.arguments) + "\n")
        try:
            await self.client.files_upload_v2(channel=place, thread_ts=thread_ts,
                                              content=content, filename=filename,
                                              title=f"Arguments of approval request {request.id}")
        except Exception as exc:  # whatever went wrong, nobody can read them: core refuses the call
            log.error("could not attach the arguments of approval %s: %s", request.id,
                      error_code(exc) if isinstance(exc, SlackApiError) else type(exc).__name__)
            return None
        return filename

    async def resolve(self, request: ApprovalInfo) -> None:
        """Update the request's message in place, and every DM copy: no buttons, who decided what; or,
        while it waits on more votes, the votes so far (read again: a settled card never gets its buttons back
        from a late vote)."""
        if not request.settled or not request.announcement:
            request = await self.gateway.approval(request.id) or request
        where = request.announcement or {}
        if where.get("batch") and request.batch is not None:  # one card for the batch: every call as it stands
            batch = await self.gateway.approval_batch(request)
            effects = {r.id: e for r in batch if (e := _effect(r)) is not None}
            await self._cards.update(request, where, batch_fallback_text(batch), batch_blocks(batch, effects))
            return
        places = ([{"channel": where["channel"], "ts": where["ts"]}] if "channel" in where else []) + list(
            where.get("copies") or [])
        text, blocks = fallback_text(request), approval_blocks(request, effect=_effect(request))
        if not places:  # never announced (Slack was down): say how it ended instead
            await self._cards.post(request, text, blocks)
            return
        await asyncio.gather(*(self._cards.update(request, place, text, blocks) for place in places))

    # -- interactions ---------------------------------------------------------------------------

    async def _on_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        if (clicked := self._button(body, action, ACTION)) is None:
            return
        user, channel, verdict, request_id = clicked
        with in_workspace(await self._workspace_of(request_id)):
            try:
                await self._clicked(user, channel, verdict, request_id, str(body.get("trigger_id") or ""))
            except NotFound:  # unknown, or another channel's: none that a click here can decide
                self._private.tell(channel, user, "That approval request does not exist.")

    def _button(self, body: dict[str, Any], action: dict[str, Any], pattern: re.Pattern[str]
                ) -> tuple[str, str, re.Match[str], int] | None:
        """Who clicked where, the action and the one request id its value carries; None (the clicker told when
        there is one) for a click that names no request of ours."""
        user, channel = user_id(body), channel_id(body)  # shapes checked before bolt (payloads.shape_problem)
        if not user:
            return None
        verdict = pattern.match(str(action.get("action_id")))
        request_id = _request_id(action.get("value"))
        if verdict is None or request_id is None:
            self._private.tell(channel, user, "That button does not belong to an approval request I know.")
            return None
        return user, channel, verdict, request_id

    async def _on_batch_click(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        """Approve all / Deny all: core decides each still-pending call of the card's batch on its own."""
        await ack()
        if (clicked := self._button(body, action, BATCH_ACTION)) is None:
            return
        user, channel, verdict, request_id = clicked
        with in_workspace(await self._workspace_of(request_id)):
            try:
                result = await self.gateway.decide_all(request_id, verdict.group(1), by=user, channel=self.channel)
            except NotFound:
                self._private.tell(channel, user, "That approval request does not exist.")
                return
        if result.message:
            self._private.tell(channel, user, result.message)

    async def _on_edit_submitted(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        """The edit box submitted: core checks the edit and approves the edited call, or the box says why not (it
        stays open; nothing was decided)."""
        user = user_id(body)
        request_id = _request_id(view.get("private_metadata"))
        if request_id is None or not user:
            await ack()
            return
        text = input_value(view, "arguments", "json")
        try:
            with in_workspace(await self._workspace_of(request_id)):
                result = await self.gateway.edit(request_id, text, by=user, channel=self.channel)
        except (InvalidInput, NotFound) as exc:
            await ack(response_action="errors", errors={"arguments": str(exc)[:300]})
            return
        if result.won:
            await ack()
        else:
            await ack(response_action="errors", errors={"arguments": result.message[:300]})

    async def _workspace_of(self, request_id: int) -> str | None:
        return await request_workspace(self.client, self.gateway.approval, request_id)

    async def _clicked(self, user: str, channel: str, verdict: re.Match[str], request_id: int, trigger: str) -> None:
        if verdict.group(1) == "stop":  # a budget's Stop: no reason asked
            result = await self.gateway.decide(request_id, "deny", by=user, channel=self.channel)
            if not result.won:
                self._private.tell(channel, user, result.message)
            return
        if verdict.group(1) == "edit":
            editing = await self.gateway.edit_prompt(request_id, by=user, channel=self.channel)
            if isinstance(editing, str):
                self._private.tell(channel, user, editing)
                return
            try:
                await self.client.views_open(trigger_id=trigger, view=edit_modal(editing))
            except SlackApiError as exc:
                log.warning("could not open the edit modal: %s", error_code(exc))
            return
        if verdict.group(1) == "deny":
            prompt = await self.gateway.deny_prompt(request_id, by=user, channel=self.channel)
            if isinstance(prompt, ApprovalInfo):  # it may be denied: ask why first
                await self._open_deny_modal(trigger, prompt)
            else:  # refused, or it had already been settled
                self._private.tell(channel, user, prompt.message)
            return
        result = await self.gateway.decide(request_id, verdict.group(1), by=user, channel=self.channel)
        if not result.won:
            self._private.tell(channel, user, result.message)

    async def _open_deny_modal(self, trigger_id: str, request: ApprovalInfo) -> None:
        try:
            await self.client.views_open(trigger_id=trigger_id, view=deny_modal(request))
        except SlackApiError as exc:  # no modal (e.g. an expired trigger): deny without a reason
            log.warning("could not open the deny modal: %s", error_code(exc))

    async def _on_deny_submitted(self, ack: Any, body: dict[str, Any], view: dict[str, Any]) -> None:
        await ack()
        user = user_id(body)
        request_id = _request_id(view.get("private_metadata"))
        if request_id is None or not user:
            return
        reason = input_value(view, "reason", "text").strip()
        try:
            with in_workspace(await self._workspace_of(request_id)):
                result = await self.gateway.decide(request_id, "deny", by=user, reason=reason or None,
                                                   channel=self.channel)
        except (InvalidInput, NotFound) as exc:  # e.g. a reason longer than the modal allows: nothing was decided
            log.warning("deny of approval %s refused: %s", request_id, exc)
            return
        told = (result.request.announcement or {}).get("channel") if result.request is not None else None
        if not result.won and told:
            self._private.tell(told, user, result.message)


def _request_id(value: Any) -> int | None:
    return carried_id(value) or None  # 0 is no request


def _effect(request: ApprovalInfo) -> str | None:
    """What the card said the call would do, when it was first shown."""
    effect = (request.announcement or {}).get("effect")
    return effect if isinstance(effect, str) else None

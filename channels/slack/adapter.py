"""Slack adapter: bolt listeners translate events into ``Gateway.accept``; bus events become messages.

It decides nothing core should decide: whether a message starts a turn, dedupe, and turn order are
core's. It only knows Slack's shapes (ids, mentions, threads, reactions, limits).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from channels.errors import MalformedPayload
from channels.slack.api import PrivateReplies, error_code
from channels.slack.approvals import SlackApprovals
from channels.slack.commands import SlackCommands
from channels.slack.credentials import SlackCredentials
from channels.slack.formatting import split_message, to_mrkdwn
from channels.slack.payloads import PERSON_SUBTYPES, channel_id, is_id, is_ts, shape_problem, user_id
from core.approvals import ApprovalBroker
from core.credentials import CredentialService
from core.dispatcher import Dispatcher
from core.errors import InvalidInput
from core.events import (
    ApprovalRequested,
    ApprovalResolved,
    CredentialRequested,
    CredentialResolved,
    DirectNotice,
    Event,
    InputQueued,
    InputsTaken,
    Notice,
    TurnCancelled,
    TurnFailed,
    TurnFinished,
)
from core.model import Inbound, MessageRef
from core.schedules import ScheduleService
from core.text import clean_tree
from core.tools import ToolError

log = logging.getLogger(__name__)

PROGRESS_REACTION = "eyes"  # a turn is working on this message
QUEUED_REACTION = "hourglass_flowing_sand"  # this message waits behind the running turn


@dataclass(frozen=True)
class SlackConfig:
    bot_token: str
    signing_secret: str | None = None
    app_token: str | None = None
    api_url: str = "https://slack.com/api/"
    command: str = "/bot"
    rate_limit_retries: int = 3


class SlackChannel:
    name = "slack"

    def __init__(self, config: SlackConfig, dispatcher: Dispatcher, approvals: ApprovalBroker,
                 credentials: CredentialService) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.approvals = approvals
        self.client = AsyncWebClient(token=config.bot_token, base_url=config.api_url)
        self.client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=config.rate_limit_retries))
        http_mode = config.app_token is None
        self.app = AsyncApp(
            client=self.client,
            signing_secret=config.signing_secret or "",
            request_verification_enabled=http_mode,
            # Our listeners only store the message (a few ms) and hand the turn to a task: storing
            # before the ack means an acknowledged message is never lost.
            process_before_response=True,
        )
        self._verifier = SignatureVerifier(config.signing_secret) if config.signing_secret else None
        self._socket: Any = None
        # Which messages show the "queued" sign (a rendering detail, so memory is enough: after a
        # restart a leftover sign is only cosmetic).
        self._queued_signs: set[MessageRef] = set()
        self.started = False
        self.app.event("app_mention")(self._on_app_mention)
        self.app.event("message")(self._on_message)
        self._commands = SlackCommands(self.app, config.command, self.name, dispatcher, approvals)
        self._private = PrivateReplies(self.client)
        self._approvals = SlackApprovals(self.app, self.client, approvals)
        self._credentials = SlackCredentials(self.app, self.client, credentials)
        self.app.action(re.compile(".*"))(self._on_unknown_action)  # registered last: anything not matched above
        self.app.error(self._on_error)
        self._groups: dict[str, tuple[float, set[str]]] = {}
        self._channel_ids: dict[str, str] = {}
        dispatcher.bus.subscribe(self.render, channel=self.name)

    @property
    def schedules(self) -> ScheduleService | None:
        return self._commands.schedules

    @schedules.setter
    def schedules(self, service: ScheduleService | None) -> None:  # set by the wiring once the scheduler exists
        self._commands.schedules = service

    # -- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        if self.config.app_token is not None:
            return []
        return [web.post("/slack/events", self.handle_http)]

    async def start(self) -> None:
        if self.config.app_token is not None:
            self._socket = _checked_socket_handler(
                self.app, self.config.app_token, web_client=AsyncWebClient(base_url=self.config.api_url)
            )
            await self._socket.connect_async()
        self.started = True

    async def stop(self) -> None:
        self.started = False
        if self._socket is not None:
            await self._socket.close_async()

    # -- HTTP mode ------------------------------------------------------------------------------

    async def handle_http(self, request: web.Request) -> web.Response:
        body = await request.text()
        headers: dict[str, str] = dict(request.headers)
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string, headers=dict(headers))
            problem = shape_problem(bolt_request.body)
        except Exception:
            problem = "the body is not a Slack payload"
        if problem is not None:
            # Bolt (or a listener) would fail on it with a 500, and Slack would retry: refuse it here,
            # once, before anything reads it. 401 if unsigned (bolt's verification is not bypassed), else 400.
            if self._verifier is None or not self._verifier.is_valid_request(body, headers):
                return web.json_response({"error": "invalid request signature"}, status=401)
            log.warning("malformed Slack payload refused: %s", problem)
            return web.json_response({"error": f"malformed payload: {problem}"}, status=400)
        # No NUL, no lone surrogate in any text, before bolt or a listener reads it (in place: the
        # signature was checked on the raw body).
        clean_tree(bolt_request.body)
        response = await self.app.async_dispatch(bolt_request)
        return await to_aiohttp_response(response)

    async def _on_error(self, error: Exception, body: Any) -> BoltResponse | None:
        problem = str(error) if isinstance(error, MalformedPayload) else shape_problem(body)
        if problem is not None:  # the payload's fault: a retry would fail the same way
            log.warning("malformed Slack payload: %s", problem)
            return BoltResponse(status=400, body=json.dumps({"error": f"malformed payload: {problem}"}),
                                headers={"content-type": "application/json"})
        log.error("Slack listener failed: %s: %s", type(error).__name__, error, exc_info=error)
        if not isinstance(body, dict) or body.get("type") == "event_callback":
            return None  # our own failure on a valid event: bolt answers 500, so Slack delivers it again
        # Slack never retries a slash command or an interaction: a 500 would only show the person a
        # cryptic failure. Tell them instead.
        text = (f":warning: Something went wrong on my side ({type(error).__name__}). It is logged; try again, "
                "and tell the operator if it keeps happening.")
        if "command" in body:
            return BoltResponse(status=200, body=json.dumps({"response_type": "ephemeral", "text": text}),
                                headers={"content-type": "application/json"})
        self._private.tell(channel_id(body), user_id(body), text)
        return BoltResponse(status=200, body="")

    # -- inbound --------------------------------------------------------------------------------

    async def _on_app_mention(self, body: dict[str, Any], event: dict[str, Any], context: Any) -> None:
        await self._take(body, event, context.bot_user_id, addressed=True)

    async def _on_message(self, body: dict[str, Any], event: dict[str, Any], context: Any) -> None:
        if not isinstance(event, dict):
            raise MalformedPayload("event is not an object")
        if event.get("subtype") not in PERSON_SUBTYPES or event.get("bot_id") or event.get("bot_profile"):
            return
        bot_user = context.bot_user_id
        text = event.get("text") or ""
        addressed = event.get("channel_type") == "im" or (
            bot_user is not None and isinstance(text, str) and f"<@{bot_user}>" in text
        )
        await self._take(body, event, bot_user, addressed=addressed)

    async def _take(
        self, body: dict[str, Any], event: dict[str, Any], bot_user: str | None, *, addressed: bool
    ) -> None:
        if not isinstance(event, dict):
            raise MalformedPayload("event is not an object")
        if event.get("bot_id") or (bot_user is not None and event.get("user") == bot_user):
            return
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        text = event.get("text") or ""
        thread_ts = event.get("thread_ts") or ts
        team = body.get("team_id") or event.get("team") or "T0"
        # Checked again where they become a session id and a place (shape_problem refused them already).
        if not (is_id(user) and is_id(channel) and is_id(team) and is_ts(ts) and is_ts(thread_ts)):
            raise MalformedPayload("event.user, channel, ts or team is not a Slack id or timestamp")
        if not isinstance(text, str):
            raise MalformedPayload("event.text is not a string")
        event_id = body.get("event_id")
        message = Inbound(
            session_id=f"slack:{team}:{channel}:{thread_ts}",
            channel=self.name,
            sender=str(user),
            text=_strip_mention(text, bot_user),
            addressed=addressed,
            reply_ref={"channel": channel, "thread_ts": thread_ts},
            ref=MessageRef(str(channel), str(ts)),
            idempotency_key=f"{channel}:{ts}",
            delivery_key=f"slack:{event_id}" if isinstance(event_id, str) else None,
            place=f"slack:{team}:{channel}",
        )
        try:
            await self.dispatcher.accept(message)
        except InvalidInput as exc:
            await self._post(str(channel), thread_ts, f":no_entry: I can't take this message: {exc}")

    # -- outbound (rendering core events) -------------------------------------------------------

    async def render(self, event: Event) -> None:
        if isinstance(event, DirectNotice):
            await self._direct(event.user, event.text)
            return
        ref = event.session.reply_ref
        channel, thread_ts = ref.get("channel"), ref.get("thread_ts")
        if not channel:
            return
        if isinstance(event, InputQueued):
            self._queued_signs.add(event.ref)
            await self._react("reactions_add", event.ref, QUEUED_REACTION)
        elif isinstance(event, InputsTaken):
            for item in event.refs:
                if item in self._queued_signs:
                    self._queued_signs.discard(item)
                    await self._react("reactions_remove", item, QUEUED_REACTION)
                await self._react("reactions_add", item, PROGRESS_REACTION)
        elif isinstance(event, TurnFinished):
            first_ts, error = None, None
            for chunk in split_message(to_mrkdwn(event.text)):
                ts, problem = await self._post(channel, thread_ts, chunk)
                first_ts, error = first_ts or ts, error or problem
            # Verified, not assumed: core records where the answer landed (or why it did not).
            await self.dispatcher.report_delivery(event.turn.id, first_ts, error)
            await self._clear(event.turn.inputs)
        elif isinstance(event, TurnFailed):
            await self._post(channel, thread_ts, f":warning: {event.message}")
            await self._clear(event.turn.inputs)
        elif isinstance(event, TurnCancelled):
            await self._clear(event.turn.inputs)
        elif isinstance(event, Notice):
            await self._post(channel, thread_ts, f":information_source: {event.text}")
        elif isinstance(event, ApprovalRequested):
            await self._approvals.announce(event.request)
        elif isinstance(event, ApprovalResolved):
            await self._approvals.resolve(event.request)
        elif isinstance(event, CredentialRequested):
            await self._credentials.announce(event.request)
        elif isinstance(event, CredentialResolved):
            await self._credentials.resolve(event.request)

    async def _clear(self, refs: tuple[MessageRef, ...]) -> None:
        for item in refs:
            await self._react("reactions_remove", item, PROGRESS_REACTION)

    async def _direct(self, user: str, text: str) -> None:
        try:
            opened = await self.client.conversations_open(users=user)
            await self.client.chat_postMessage(channel=opened["channel"]["id"], text=text)
        except SlackApiError as exc:
            log.error("could not DM %s: %s", user, error_code(exc))

    async def resolve_destination(self, destination: str) -> str:
        """A schedule's destination: the channel id, if the bot can post there (else InvalidInput)."""
        try:
            channel_id = await self._channel_id(destination)
        except ToolError as exc:
            raise InvalidInput(str(exc)) from None
        if channel_id.startswith("D"):
            return channel_id
        try:
            info = await self.client.conversations_info(channel=channel_id)
        except SlackApiError as exc:
            raise InvalidInput(f"cannot post to {destination}: {error_code(exc)}") from None
        if (info.get("channel") or {}).get("is_member") is False:
            raise InvalidInput(f"the bot is not in {destination}: invite it there first (/invite @bot)")
        return channel_id

    async def _on_unknown_action(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        log.warning("unknown Slack action %r", action.get("action_id"))
        self._private.tell(channel_id(body), user_id(body), "I don't know that button; nothing was done.")

    # -- used by core through bot's wiring --------------------------------------------------------

    async def members(self, group_id: str) -> set[str]:
        """Members of a Slack user group (cached for a minute: approvers are checked on every click)."""
        cached = self._groups.get(group_id)
        if cached is not None and time.monotonic() - cached[0] < 60:
            return cached[1]
        try:
            response = await self.client.usergroups_users_list(usergroup=group_id)
            users = set(response.get("users") or [])
        except SlackApiError as exc:
            log.warning("usergroups.users.list %s failed: %s", group_id, error_code(exc))
            users = set()
        self._groups[group_id] = (time.monotonic(), users)
        return users

    async def send_message(self, channel: str, text: str) -> str:
        """``message_send``: post to ``#name`` or a channel id; errors become tool errors the model reads."""
        channel_id = await self._channel_id(channel)
        try:
            response = await self.client.chat_postMessage(channel=channel_id, text=text)
        except SlackApiError as exc:
            error = error_code(exc)
            hint = {"not_in_channel": "invite the bot to that channel first",
                    "channel_not_found": "no such channel", "is_archived": "that channel is archived"}
            raise ToolError(f"Slack refused the message to {channel}: {hint.get(error, error)}") from None
        return f"posted to {channel} (ts {response.get('ts')})"

    async def _channel_id(self, channel: str) -> str:
        if not channel.startswith("#"):
            if re.fullmatch(r"[CGD][A-Z0-9]{2,}", channel):
                return channel
            raise ToolError(f"{channel!r} is not a channel: use #name or a channel id such as C0123ABCD")
        name = channel[1:].lower()
        if name not in self._channel_ids:
            cursor = None
            while True:
                response = await self.client.conversations_list(
                    types="public_channel,private_channel", exclude_archived=True, limit=1000, cursor=cursor)
                for item in response.get("channels") or []:
                    self._channel_ids[str(item.get("name"))] = str(item.get("id"))
                cursor = (response.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        if name not in self._channel_ids:
            raise ToolError(f"there is no channel {channel} that the bot can see")
        return self._channel_ids[name]

    async def _post(self, channel: str, thread_ts: str | None, text: str) -> tuple[str | None, str | None]:
        """Post; returns (ts, None) or (None, Slack's error)."""
        try:
            response = await self.client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        except SlackApiError as exc:
            code = error_code(exc)
            log.error("chat.postMessage to %s failed: %s", channel, code)
            return None, code
        return str(response.get("ts")), None

    async def _react(self, method: str, item: MessageRef, name: str) -> None:
        if not item.channel or not item.ts:
            return
        try:
            await getattr(self.client, method)(channel=item.channel, timestamp=item.ts, name=name)
        except SlackApiError as exc:
            code = error_code(exc)
            if code not in ("already_reacted", "no_reaction"):
                log.warning("%s failed: %s", method, code)


def _checked_socket_handler(app: AsyncApp, app_token: str, web_client: AsyncWebClient) -> Any:
    """Bolt's Socket Mode handler, refusing malformed envelopes before bolt reads them (as HTTP mode does):
    acknowledged, so Slack does not send them again, and otherwise ignored."""
    from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
    from slack_sdk.socket_mode.response import SocketModeResponse

    class CheckedSocketModeHandler(AsyncSocketModeHandler):
        async def handle(self, client: Any, req: Any) -> None:
            problem = shape_problem(req.payload)
            if problem is None:
                clean_tree(req.payload)  # in place, as in HTTP mode
                await super().handle(client, req)
                return
            log.warning("malformed Slack payload refused: %s", problem)
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))

    return CheckedSocketModeHandler(app, app_token, web_client=web_client)


def _strip_mention(text: str, bot_user: str | None) -> str:
    if bot_user:
        text = re.sub(rf"<@{re.escape(bot_user)}(\|[^>]*)?>", "", text)
    return text.strip()

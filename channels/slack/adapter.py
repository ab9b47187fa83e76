"""Slack adapter: bolt wiring (HTTP or Socket Mode) and the translation of Slack events into core calls.

It decides nothing core should decide: whether a message starts a turn, dedupe, and turn order are
core's. It only knows Slack's shapes (ids, mentions, threads). Rendering is ``render``; what core
calls on Slack is ``port``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from channels.errors import MalformedPayload
from channels.slack.api import PrivateReplies
from channels.slack.approvals import SlackApprovals
from channels.slack.assistant import SlackAssistant
from channels.slack.commands import SlackCommands
from channels.slack.connections import SlackConnections
from channels.slack.credentials import SlackCredentials
from channels.slack.feedback import SlackFeedback
from channels.slack.files import FILE_HOSTS
from channels.slack.install import SlackInstall
from channels.slack.listening import ListeningChannels
from channels.slack.payloads import (
    PERSON_SUBTYPES,
    channel_id,
    is_id,
    is_ts,
    shape_problem,
    shared_files,
    team_id,
    thread_session,
    user_id,
)
from channels.slack.port import SlackPort
from channels.slack.render import SlackRenderer
from channels.slack.stopping import SlackStopping
from channels.slack.streams import SlackStreams
from channels.slack.threads import SessionThreads
from channels.slack.workspaces import WorkspaceAuthorize, WorkspaceClient, session_team, set_inbound
from core.errors import InvalidInput
from core.gateway import AcceptOutcome, Gateway
from core.model import Inbound, MessageRef
from core.text import clean_tree

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class SlackConfig:
    bot_token: str | None  # None: multi-workspace (OAuth) mode, a token per installed workspace
    signing_secret: str | None = None
    app_token: str | None = None
    api_url: str = "https://slack.com/api/"
    command: str = "/bot"
    rate_limit_retries: int = 3
    progress_delay_s: float = 0.0  # a turn shows its progress reaction once it has run this long
    streaming: bool = False  # answers stream into the thread while the model writes (SLACK_STREAMING)
    stream_delay_s: float = 0.3  # ...once it has written for this long (SLACK_STREAM_DELAY_S)
    stop_offer_s: float = 10.0  # a turn working this long offers whoever asked a Stop button (0: never)
    suggested_prompts: tuple[tuple[str, str], ...] = ()  # (title, message): a new assistant pane chat offers them
    listen_channels: tuple[str, ...] = ()  # #names or ids: there an unaddressed message starts a turn ([slack])
    listen_rate_per_minute: int = 6  # ...at most this many a channel a minute (core counts them)


class SlackChannel:
    name = "slack"

    def __init__(self, config: SlackConfig, gateway: Gateway, install: SlackInstall | None = None) -> None:
        self.config = config
        self.gateway = gateway
        self.install = install  # multi-workspace mode: the install routes, and each event's token from its store
        if install is not None:  # each call carries the token of the workspace it acts in (channels.slack.workspaces)
            self.client: AsyncWebClient = WorkspaceClient(
                install.installations.workspace_bot, allowed=install.allowed_teams, base_url=config.api_url)
        else:
            self.client = AsyncWebClient(token=config.bot_token, base_url=config.api_url)
        self.client.retry_handlers.append(AsyncRateLimitErrorRetryHandler(max_retry_count=config.rate_limit_retries))
        http_mode = config.app_token is None
        self.app = AsyncApp(
            # Named, or bolt names it from inspect.stack(), which reads every caller's source file.
            name="chatops-gateway",
            client=self.client,
            signing_secret=config.signing_secret or "",
            request_verification_enabled=http_mode,
            # Our listeners only store the message (a few ms) and hand the turn to a task: storing
            # before the ack means an acknowledged message is never lost.
            process_before_response=True,
            # Multi-workspace: each request's workspace token and bot ids from the installation store.
            oauth_flow=install.flow if install is not None else None,
            # (bolt's hint says a result is always returned; None, "not installed here", is what its own returns)
            authorize=WorkspaceAuthorize(self.client) if isinstance(self.client, WorkspaceClient) else None,  # type: ignore[arg-type]
        )
        self._verifier = SignatureVerifier(config.signing_secret) if config.signing_secret else None
        self._socket: Any = None
        streams = SlackStreams(self.client, start_delay_s=config.stream_delay_s) if config.streaming else None
        # What core calls (answers, destinations, groups, shared files: only from Slack's file host, or from the
        # configured API host when it is not Slack's own, a test Slack or a proxy).
        api_host = urlsplit(config.api_url).netloc.lower()
        name = api_host.split(":")[0]
        own = name in ("slack.com", "slack-gov.com") or name.endswith((".slack.com", ".slack-gov.com"))
        file_hosts = FILE_HOSTS | ({api_host} if api_host and not own else set())
        # Where each conversation's posts go, shared by everything that posts for one (its first post may open
        # its thread: channels.slack.threads).
        threads = SessionThreads(gateway)
        self.port = SlackPort(self.client, streams, file_hosts=frozenset(file_hosts), threads=threads)
        self.listening = ListeningChannels(self.port, config.listen_channels, config.listen_rate_per_minute)
        self.started = False
        if install is not None:
            self.app.use(self._in_workspace)
            self.app.event("app_uninstalled")(self._on_uninstalled)
            self.app.event("tokens_revoked")(self._on_uninstalled)
            install.installations.changed.append(self._forget)
        self.app.event("app_mention")(self._on_app_mention)
        self.app.event("message")(self._on_message)
        self._commands = SlackCommands(self.app, config.command, self.name, gateway)
        self._private = PrivateReplies(self.client)
        approvals_ui = SlackApprovals(self.app, self.client, gateway, self.name, members=self.port.group_members,
                                      threads=threads)
        credentials_ui = SlackCredentials(self.app, self.client, gateway, self.name, threads=threads)
        connections_ui = SlackConnections(self.app, self.client, gateway, threads=threads)
        SlackFeedback(self.app, self._private, gateway, self.name)
        SlackStopping(self.app, self._private, gateway)
        self.assistant = SlackAssistant(self.app, self.client, gateway, self.name, config.suggested_prompts)
        self.app.action(re.compile(".*"))(self._on_unknown_action)  # registered last: anything not matched above
        self.app.error(self._on_error)
        self.renderer = SlackRenderer(self.client, self.port, approvals_ui, credentials_ui, connections_ui,
                                      progress_delay_s=config.progress_delay_s, streams=streams,
                                      stop_offer_s=config.stop_offer_s)
        gateway.subscribe(self.renderer.render, channel=self.name)

    # -- lifecycle ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        if self.config.app_token is not None:
            return []
        install = self.install.routes() if self.install is not None else []
        return [web.post("/slack/events", self.handle_http), *install]

    async def start(self) -> None:
        # One session for every Web API call: connections to Slack are kept alive and reused, not opened
        # (and torn down) per call, as slack_sdk does without one.
        # No cookie jar: like slack_sdk's own per-call sessions, nothing one response sets goes with the next.
        self.client.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.client.timeout),
                                                    trust_env=self.client.trust_env_in_session,
                                                    cookie_jar=aiohttp.DummyCookieJar())
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

    async def close(self) -> None:
        # Only after running turns were drained: they still post, stream and look people up (a lookup cut
        # off here would label a member a guest and cancel the request their resumed turn waits on).
        if self.port.streams is not None:
            await self.port.streams.close()
        session, self.client.session = self.client.session, None
        if session is not None:
            await session.close()

    # -- HTTP mode ------------------------------------------------------------------------------

    async def handle_http(self, request: web.Request) -> web.Response:
        body = await request.text()
        headers: dict[str, str] = dict(request.headers)
        # The signature first: an unsigned body is refused before anything parses or walks it (a flood of
        # large, well-shaped unsigned bodies otherwise costs seconds of the loop that real acks need).
        if self._verifier is not None and not self._verifier.is_valid_request(body, headers):
            return web.json_response({"error": "invalid request signature"}, status=401)
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string, headers=dict(headers))
            problem = shape_problem(bolt_request.body)
        except Exception:
            problem = "the body is not a Slack payload"
        if problem is not None:
            # Bolt (or a listener) would fail on it with a 500, and Slack would retry: refuse it here,
            # once, before anything reads it (401 without a signing secret: bolt's check is not bypassed).
            if self._verifier is None:
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

    # -- workspaces (multi-workspace mode) ----------------------------------------------------------

    async def _in_workspace(self, context: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        """Every listener (and the tasks it starts) acts in the workspace the request came from."""
        set_inbound(context.team_id if is_id(context.team_id) else None)
        return await next()

    async def _on_uninstalled(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """``app_uninstalled``, or ``tokens_revoked`` naming the bot's token: the workspace's install goes (its
        history stays) and core cancels what its conversations wait on."""
        if not isinstance(event, dict):
            raise MalformedPayload("event is not an object")
        kind = str(event.get("type"))
        if kind == "tokens_revoked" and not (event.get("tokens") or {}).get("bot"):
            return  # only people's tokens: the bot asks for none, and its own still works
        team, enterprise = body.get("team_id"), body.get("enterprise_id")
        if not is_id(team) or (enterprise is not None and not is_id(enterprise)):
            raise MalformedPayload("team_id or enterprise_id is not a Slack id")
        assert self.install is not None
        if await self.install.installations.uninstalled(enterprise, str(team), why=kind):
            stopped = await self.gateway.workspace_removed(
                self.name, lambda session_id, reply_ref: session_team(session_id, reply_ref) == team,
                why=f"Slack: {kind}")
            log.info("Slack workspace %s: %s; %d conversation(s) stopped", team, kind, stopped)

    def _forget(self, team: str) -> None:
        """A workspace re-installed or removed: nothing cached from its old install is used again."""
        if isinstance(self.client, WorkspaceClient):
            self.client.forget(team)
        self.port.forget(team)
        self.listening.forget(team)
        self.renderer.status.refused_in.discard(team)  # a re-install may have granted what was refused

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
        # A mention in any form app_mention reports (``<@U1>``, ``<@U1|name>``): its twin event is then the same
        # addressed message (deduplicated by core), never an unaddressed one that would start a second turn.
        addressed = event.get("channel_type") == "im" or (
            bot_user is not None and isinstance(text, str) and _mentions(text, bot_user)
        )
        listen = None
        own = bot_user is not None and event.get("user") == bot_user
        # Slackbot writes as a user (no bot_id): it is a bot all the same, and never starts a listening turn.
        bot = own or event.get("user") == SLACKBOT
        if not addressed and not bot and is_id(event.get("channel")):
            listen = await self.listening.rate_in(str(event["channel"]))
        await self._take(body, event, bot_user, addressed=addressed, listen_per_minute=listen)

    async def _take(
        self, body: dict[str, Any], event: dict[str, Any], bot_user: str | None, *, addressed: bool,
        listen_per_minute: int | None = None,
    ) -> None:
        if not isinstance(event, dict):
            raise MalformedPayload("event is not an object")
        if event.get("bot_id") or (bot_user is not None and event.get("user") == bot_user):
            return
        user, channel, ts = event.get("user"), event.get("channel"), event.get("ts")
        text = event.get("text") or ""
        thread_ts = event.get("thread_ts") or ts
        team = team_id(body) or event.get("team") or "T0"  # the installation's (bolt authorized that one)
        # Checked again where they become a session id and a place (shape_problem refused them already).
        if not (is_id(user) and is_id(channel) and is_id(team) and is_ts(ts) and is_ts(thread_ts)):
            raise MalformedPayload("event.user, channel, ts or team is not a Slack id or timestamp")
        if not isinstance(text, str):
            raise MalformedPayload("event.text is not a string")
        event_id = body.get("event_id")
        message = Inbound(
            session_id=thread_session(team, channel, thread_ts),
            channel=self.name,
            sender=str(user),
            text=_strip_mention(text, bot_user),
            addressed=addressed,
            reply_ref={"channel": channel, "thread_ts": thread_ts},
            ref=MessageRef(str(channel), str(ts)),
            idempotency_key=f"{channel}:{ts}",
            delivery_key=f"slack:{event_id}" if isinstance(event_id, str) else None,
            place=f"slack:{team}:{channel}",
            attachments=shared_files(event.get("files")),
            listen_per_minute=listen_per_minute,
        )
        try:
            accepted = await self.gateway.accept(message)
        except InvalidInput as exc:
            if addressed:  # an unaddressed message asked nothing: no refusal to tell
                await self.port.post(str(channel), thread_ts, f":no_entry: I can't take this message: {exc}")
            return
        if accepted.outcome is AcceptOutcome.QUEUED:
            self.assistant.asked(str(channel), thread_ts, message.text)  # a new assistant chat's first question

    async def _on_unknown_action(self, ack: Any, body: dict[str, Any], action: dict[str, Any]) -> None:
        await ack()
        log.warning("unknown Slack action %r", action.get("action_id"))
        self._private.tell(channel_id(body), user_id(body), "I don't know that button; nothing was done.")


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


SLACKBOT = "USLACKBOT"


def _mentions(text: str, bot_user: str) -> bool:
    return re.search(rf"<@{re.escape(bot_user)}(\|[^>]*)?>", text) is not None


def _strip_mention(text: str, bot_user: str | None) -> str:
    if bot_user:
        text = re.sub(rf"<@{re.escape(bot_user)}(\|[^>]*)?>", "", text)
    return text.strip()

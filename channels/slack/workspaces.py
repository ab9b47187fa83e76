"""Which workspace a Slack Web API call acts in, and so which bot token it carries (multi-workspace mode).

Every Slack module shares one ``AsyncWebClient``. In multi-workspace mode it is a ``WorkspaceClient``: each
call takes the token of the workspace in scope, looked up in the installation store (sealed there) and kept
for ``TOKEN_CACHE_S``. The scope is, strongest first:

1. ``in_workspace(team)``: set by the port and the renderer from the session or place they serve (a session
   that names no workspace sets "none": never what a task happened to inherit);
2. the running turn's session (``core.current``): a tool's post or a shared file's download in that turn (a
   turn whose session names no workspace, e.g. the web chat's, acts in none);
3. the inbound request's team (bolt middleware): listeners, and the work they hand to tasks.

No scope, or a workspace the app is not installed in, is an error (``NoWorkspace``): a call never goes out
with another workspace's token. In single-workspace mode the client is a plain one with ``SLACK_BOT_TOKEN``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from slack_bolt.authorization import AuthorizeResult
from slack_bolt.authorization.async_authorize import AsyncAuthorize
from slack_sdk.errors import SlackApiError
from slack_sdk.oauth.installation_store import Bot
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from core import current

TOKEN_CACHE_S = 60.0  # a token read from the store is used this long (an uninstall drops it at once)
BotLookup = Callable[[str], Awaitable[Bot | None]]  # team id → its install (bot token, ids), None: not installed

_TEAM = re.compile(r"[TE][A-Z0-9]{1,31}")  # a workspace (or Enterprise Grid org) id
_EXPLICIT: ContextVar[str | None] = ContextVar("slack_workspace", default=None)
_INBOUND: ContextVar[str | None] = ContextVar("slack_inbound_workspace", default=None)


NOT_INSTALLED = "not_installed"  # the error code of a call that had no workspace token (nothing was sent)
# Slack's answers to a token that no longer works: about the token, not about what was asked (a re-install
# elsewhere, an uninstall racing the call). Never a reason to stop using a feature in that workspace.
TOKEN_GONE = frozenset({"invalid_auth", "token_revoked", "account_inactive", "not_authed", "token_expired",
                        NOT_INSTALLED})


class NoWorkspace(SlackApiError):
    """A call with no workspace in scope, or for one the app is not installed in: nothing was sent. A Slack
    error (``not_installed``, never retried) so every caller handles it as it handles Slack's refusals."""

    def __init__(self, why: str) -> None:
        response = AsyncSlackResponse(client=None, http_verb="POST", api_url="", req_args={},
                                      data={"ok": False, "error": NOT_INSTALLED}, headers={}, status_code=200)
        super().__init__(why, response)


@contextmanager
def in_workspace(team: str | None) -> Iterator[None]:
    """Calls made inside act in ``team``; None: in no workspace (they fail, whatever scope the task inherited,
    e.g. an event bus worker started during another workspace's turn)."""
    token = _EXPLICIT.set(team or "")
    try:
        yield
    finally:
        _EXPLICIT.reset(token)


def set_inbound(team: str | None) -> None:
    """The team an inbound Slack request came from (the weakest scope: a turn's own session beats it). Set for
    the rest of the request's task, never reset: bolt runs the listeners after its middleware has returned. Each
    request has its task (aiohttp), so nothing carries over to another request."""
    _INBOUND.set(team)


def team_of(place: str | None) -> str | None:
    """The workspace (or Enterprise Grid org) id of a place ``slack:<team>:<channel>``, if it names one."""
    parts = (place or "").split(":")
    return parts[1] if len(parts) >= 3 and parts[0] == "slack" and _TEAM.fullmatch(parts[1]) else None


def session_team(session_id: str, reply_ref: Mapping[str, Any] | None = None) -> str | None:
    """The workspace of a session: from its id (``slack:<team>:…``, or a sub-agent's ``sub:slack:<team>:…``),
    else from its reply reference's ``origin`` (a schedule's firing: the session it was asked for in)."""
    while session_id.startswith("sub:"):
        session_id = session_id[len("sub:"):]
    team = team_of(session_id)
    if team is None and reply_ref is not None and isinstance(reply_ref.get("origin"), str):
        team = session_team(str(reply_ref["origin"]))
    return team


def current_team() -> str | None:
    """The workspace in scope (see the module's doc), None when there is none."""
    explicit = _EXPLICIT.get()
    if explicit is not None:
        return explicit or None
    session = current.session.get()
    if session is not None:  # a turn acts where its conversation is, or nowhere: never where a task came from
        return session_team(session.id, session.reply_ref)
    return _INBOUND.get()


def served_team() -> str | None:
    """The workspace of the conversation being served (explicit scope, else the running turn's), never the
    inbound request's: whom a person is relative to must not depend on where their click came from."""
    explicit = _EXPLICIT.get()
    if explicit is not None:
        return explicit or None
    session = current.session.get()
    return session_team(session.id, session.reply_ref) if session is not None else None


class WorkspaceClient(AsyncWebClient):
    """An ``AsyncWebClient`` whose every call carries the token of the workspace in scope."""

    def __init__(self, lookup: BotLookup, *, allowed: frozenset[str] | None = None, **kwargs: Any) -> None:
        super().__init__(token=None, **kwargs)
        self._lookup = lookup
        self.allowed = allowed  # SLACK_ALLOWED_TEAMS: a workspace taken off the list is served no more
        self._bots: dict[str, tuple[float, Bot]] = {}

    def forget(self, team: str) -> None:
        """Drop a cached token (the workspace was re-installed, uninstalled or its token refused)."""
        self._bots.pop(team, None)

    async def bot_for(self, team: str) -> Bot:
        """Workspace ``team``'s install (NoWorkspace if the app is not installed there)."""
        if self.allowed is not None and team not in self.allowed:
            raise NoWorkspace(f"Slack workspace {team} is not in SLACK_ALLOWED_TEAMS")
        cached = self._bots.get(team)
        if cached is not None and time.monotonic() - cached[0] < TOKEN_CACHE_S:
            return cached[1]
        bot = await self._lookup(team)
        if bot is None or not bot.bot_token:
            self._bots.pop(team, None)
            raise NoWorkspace(f"the app is not installed in Slack workspace {team}")
        if len(self._bots) > 4096:
            self._bots.clear()
        self._bots[team] = (time.monotonic(), bot)
        return bot

    async def token_for(self, team: str) -> str:
        return str((await self.bot_for(team)).bot_token)

    async def current_token(self) -> str:
        team = current_team()
        if team is None:
            raise NoWorkspace("no Slack workspace in scope for this call (multi-workspace mode)")
        return await self.token_for(team)

    async def api_call(self, api_method: str, *, http_verb: str = "POST", files: dict[str, Any] | None = None,
                       data: Any = None, params: dict[str, Any] | None = None, json: dict[str, Any] | None = None,
                       headers: dict[str, Any] | None = None, auth: dict[str, Any] | None = None
                       ) -> AsyncSlackResponse:
        headers = dict(headers or {})
        team = current_team()
        if auth is None and "Authorization" not in headers:
            if team is None:
                raise NoWorkspace(f"{api_method}: no Slack workspace in scope (multi-workspace mode)")
            headers["Authorization"] = f"Bearer {await self.token_for(team)}"
        try:
            return await super().api_call(api_method, http_verb=http_verb, files=files, data=data, params=params,
                                          json=json, headers=headers, auth=auth)
        except SlackApiError as exc:
            error = getattr(exc.response, "data", None)
            if team is not None and isinstance(error, dict) and error.get("error") in TOKEN_GONE:
                self.forget(team)  # asked again next time: a re-install's new token is found at once
            raise


async def bot_token(client: AsyncWebClient) -> str | None:
    """The token a call made here would carry (a file download's Authorization header)."""
    if isinstance(client, WorkspaceClient):
        return await client.current_token()
    return client.token


async def request_workspace(client: AsyncWebClient, request: Callable[[int], Awaitable[Any]], request_id: int
                            ) -> str | None:
    """The workspace of a request's conversation (an approval's, a credential request's): whom a person acting on
    it is judged against. Several workspaces: a firing's place names none, and the click's own workspace would
    call its people members. One workspace: the scope already in effect (no lookup)."""
    if not isinstance(client, WorkspaceClient):
        return current_team()
    info = await request(request_id)
    return session_team(info.session.id, info.session.reply_ref) if info is not None else current_team()


class WorkspaceAuthorize(AsyncAuthorize):
    """Bolt's authorize step from the installs the client already reads: the token and the bot's ids as stored
    at install time. Bolt's own would call auth.test on every request, on the ack path."""

    def __init__(self, client: WorkspaceClient) -> None:
        self.client = client

    async def __call__(self, *, context: Any, enterprise_id: str | None, team_id: str | None, user_id: str | None,
                       **_actor: Any) -> AuthorizeResult | None:
        if not team_id or not _TEAM.fullmatch(team_id):
            return None
        try:
            bot = await self.client.bot_for(team_id)
        except NoWorkspace:
            return None
        return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id, bot_token=bot.bot_token,
                               bot_id=bot.bot_id or None, bot_user_id=bot.bot_user_id or None, user_id=user_id)

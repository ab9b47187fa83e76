"""Multi-workspace (OAuth) installs: ``GET /slack/install`` (a page with an Add-to-Slack link) and
``GET /slack/oauth_redirect`` (Slack sends the installer back with a code), through bolt's ``AsyncOAuthFlow``.

The token exchange goes to ``SLACK_API_URL`` (the flow gets a client pointed there; it would build its own, at
slack.com, otherwise). The state is single-use and bound to the installer's browser by a cookie, written so a
browser keeps it on ``http://localhost`` as well as behind https (bolt's is always ``Secure``).

Who may install: with ``SLACK_ALLOWED_TEAMS`` only those workspaces (an install into another is refused and its
token revoked). Without it any workspace may (the page cannot tell the operator from a stranger: behind a proxy
on the same host every request looks local), and its people are labelled guests (channels/slack/port.py):
they talk to the bot but make no gated tool run, approve, provide or schedule. Org-wide (Enterprise Grid)
installs are refused: answers take the token of the workspace that asked.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from aiohttp import web
from slack_bolt.error import BoltError
from slack_bolt.oauth.async_oauth_flow import AsyncOAuthFlow
from slack_bolt.oauth.async_oauth_settings import AsyncOAuthSettings
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.oauth import OAuthStateUtils
from slack_sdk.oauth.installation_store import Bot, Installation
from slack_sdk.oauth.installation_store.async_installation_store import AsyncInstallationStore
from slack_sdk.oauth.state_store.async_state_store import AsyncOAuthStateStore
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

INSTALL_PATH = "/slack/install"
REDIRECT_PATH = "/slack/oauth_redirect"
STATE_COOKIE = "slack-app-oauth-state"


@dataclass(frozen=True)
class InstallConfig:
    client_id: str
    client_secret: str
    scopes: Sequence[str]
    api_url: str = "https://slack.com/api/"
    public_url: str | None = None  # BOT_PUBLIC_URL: the redirect URL Slack is told, and https cookies
    state_ttl_s: int = 600
    allowed_teams: frozenset[str] | None = None  # SLACK_ALLOWED_TEAMS; None: installs from this machine only


class Installations(Protocol):
    """What the Slack channel needs of the installation store besides slack_sdk's interface (installs.py)."""

    changed: list[Callable[[str], None]]  # told a team whose install was replaced or removed

    async def workspace_bot(self, team: str) -> Bot | None:
        """Workspace ``team``'s install (bot token and ids); None if the app is not installed there."""
        ...

    async def uninstalled(self, enterprise_id: str | None, team_id: str | None, *, why: str) -> bool:
        """Forget a workspace's install (Slack said it was uninstalled or its token revoked): whether one was."""
        ...


class StateCookie(OAuthStateUtils):
    """Bolt's state cookie without its fixed ``Secure`` flag: ``Secure`` only when the bot is served over https
    (a browser drops a Secure cookie set over plain http, and the state check then fails), ``SameSite=Lax``
    (the way back from slack.com is a top-level GET, which carries Lax cookies) and the redirect's path only."""

    def __init__(self, *, secure: bool, path: str, expiration_seconds: int) -> None:
        super().__init__(cookie_name=STATE_COOKIE, expiration_seconds=expiration_seconds)
        self.flags = f"HttpOnly; SameSite=Lax; Path={path}" + ("; Secure" if secure else "")

    def build_set_cookie_for_new_state(self, state: str) -> str:
        return f"{self.cookie_name}={state}; {self.flags}; Max-Age={self.expiration_seconds}"

    def build_set_cookie_for_deletion(self) -> str:
        return f"{self.cookie_name}=deleted; {self.flags}; Max-Age=0"


class _Flow(AsyncOAuthFlow):
    allowed_teams: frozenset[str] | None = None

    async def store_installation(self, request: AsyncBoltRequest, installation: Installation) -> None:
        problem = refusal(installation, self.allowed_teams)
        if problem is not None:
            log.warning("Slack install refused: %s", problem)
            try:  # Slack installed it already: take the token back, so the app is not left installed there
                await self.client.auth_revoke(token=installation.bot_token)
            except SlackApiError as exc:
                log.warning("could not revoke the refused install's token: %s", exc.response.get("error"))
            request.context["install_refused"] = problem  # the page says why (see SlackInstall.redirect)
            raise BoltError(problem)  # bolt's failure path, not a traceback
        await super().store_installation(request, installation)

    async def build_install_page_html(self, url: str, request: AsyncBoltRequest) -> str:
        link = html.escape(url, quote=True)
        return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>Install the bot</title>"
                "<meta name=\"referrer\" content=\"no-referrer\"></head>"
                "<body><h1>Install the bot into a Slack workspace</h1>"
                f"<p><a id=\"add-to-slack\" href=\"{link}\">Add to Slack</a></p>"
                "<p>Slack asks you which workspace, and what the bot may do there.</p></body></html>")


def refusal(installation: Installation, allowed_teams: frozenset[str] | None) -> str | None:
    """Why an install may not be kept, or None."""
    if installation.is_enterprise_install:
        return "org-wide (Enterprise Grid) installs are not supported: install into each workspace"
    if allowed_teams is not None and installation.team_id not in allowed_teams:
        return f"workspace {installation.team_id} is not in SLACK_ALLOWED_TEAMS"
    return None


def authorize_url(api_url: str) -> str:
    """Where installers are sent: Slack's own page, or the same host's for a test Slack or a proxy."""
    parts = urlsplit(api_url)
    host = (parts.hostname or "").lower()
    if host in ("slack.com", "slack-gov.com") or host.endswith((".slack.com", ".slack-gov.com")):
        return "https://slack.com/oauth/v2/authorize"
    return f"{parts.scheme}://{parts.netloc}/oauth/v2/authorize"


class SlackInstall:
    """The two install routes, on bolt's OAuth flow with the bot's own stores."""

    def __init__(self, config: InstallConfig, installations: Installations, states: AsyncOAuthStateStore) -> None:
        if not isinstance(installations, AsyncInstallationStore):
            raise TypeError("the installation store must be a slack_sdk AsyncInstallationStore")
        self.installations = installations
        public = (config.public_url or "").rstrip("/")
        prefix = urlsplit(public).path if public else ""
        redirect_uri = f"{public}{REDIRECT_PATH}" if public else None
        # A client of its own, at SLACK_API_URL: oauth.v2.access and the auth.test after it go there.
        self.client = AsyncWebClient(base_url=config.api_url)
        settings = AsyncOAuthSettings(
            client_id=config.client_id, client_secret=config.client_secret, scopes=list(config.scopes),
            user_scopes=[], redirect_uri=redirect_uri, install_path=INSTALL_PATH, redirect_uri_path=REDIRECT_PATH,
            authorization_url=authorize_url(config.api_url), installation_store=installations,
            installation_store_bot_only=True, state_store=states, state_cookie_name=STATE_COOKIE,
            state_expiration_seconds=config.state_ttl_s, logger=log)
        settings.state_utils = StateCookie(secure=public.startswith("https://"), path=f"{prefix}{REDIRECT_PATH}",
                                           expiration_seconds=config.state_ttl_s)
        self.flow = _Flow(client=self.client, settings=settings, logger=log)
        self.flow.allowed_teams = config.allowed_teams
        self.settings = settings
        self.allowed_teams = config.allowed_teams

    def routes(self) -> list[web.RouteDef]:
        return [web.get(INSTALL_PATH, self.install), web.get(REDIRECT_PATH, self.redirect)]

    async def install(self, request: web.Request) -> web.Response:
        response = await self.flow.handle_installation(_bolt_request(request))
        return _to_response(response)

    async def redirect(self, request: web.Request) -> web.Response:
        bolt_request = _bolt_request(request)
        response = await self.flow.handle_callback(bolt_request)
        refused = bolt_request.context.get("install_refused")
        if refused is not None:  # bolt's answer (its state cookie deleted), saying why, as a refusal
            page = _to_response(response)
            page.set_status(403)
            page.text = f"<!doctype html><p>Not installed: {html.escape(str(refused))}.</p>"
            return page
        if response.status >= 400:
            log.warning("a Slack install did not finish: HTTP %s", response.status)
        return _to_response(response)


def _bolt_request(request: web.Request) -> AsyncBoltRequest:
    headers = {name.lower(): request.headers.getall(name) for name in request.headers}
    return AsyncBoltRequest(body="", query=request.query_string, headers=headers)  # type: ignore[arg-type]


def _to_response(bolt: BoltResponse) -> web.Response:
    """Bolt's answer as is: its Set-Cookie lines unchanged (bolt's aiohttp adapter would force them Secure)."""
    headers = bolt.first_headers_without_set_cookie()
    content_type = headers.pop("content-type", "text/html").split(";")[0]
    response = web.Response(status=bolt.status, text=bolt.body, headers=headers, content_type=content_type,
                            charset="utf-8")
    for cookie in bolt.headers.get("set-cookie", []):
        response.headers.add("Set-Cookie", cookie)
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response

"""The OAuth side of the fake Slack (multi-workspace installs): install codes, oauth.v2.access and the
authorize page, approved at once."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

TEAM_ID = "T1"
BOT_USER_ID = "UBOT"


@dataclass
class FakeSlackOAuth:
    scopes: list[str] = field(
        default_factory=lambda: __import__("channels.slack.manifest", fromlist=["BOT_SCOPES"]).BOT_SCOPES)
    # OAuth installs (multi-workspace mode): codes handed out by ``issue_code`` (code -> the workspace it installs
    # into), the client id and secret oauth.v2.access accepts, and the bot token minted for each workspace.
    codes: dict[str, tuple[str, str]] = field(default_factory=dict)
    client_id: str = "1111.2222"
    client_secret: str = "fake-client-secret"
    tokens: dict[str, str] = field(default_factory=dict)  # bot token -> team id
    redirect_to: str = ""  # the app's configured redirect URL (used when the install link names none)
    minted: int = 0  # tokens minted so far

    def issue_code(self, team_id: str = TEAM_ID, team_name: str = "Team") -> str:
        """A code as Slack puts on the redirect once someone approved the install into ``team_id``."""
        code = f"code-{team_id}-{len(self.codes) + 1}"
        self.codes[code] = (team_id, team_name)
        return code

    def token_of(self, team_id: str) -> str:
        return next(token for token, team in self.tokens.items() if team == team_id)

    def _oauth_access(self, request: web.Request, params: dict[str, Any]) -> dict[str, Any]:
        basic = request.headers.get("Authorization", "").removeprefix("Basic ")
        posted = f"{params.get('client_id')}:{params.get('client_secret')}"
        client = base64.b64decode(basic).decode() if basic else posted
        if client != f"{self.client_id}:{self.client_secret}":
            return {"ok": False, "error": "invalid_client_id"}
        place = self.codes.pop(str(params.get("code")), None)  # a code works once
        if place is None:
            return {"ok": False, "error": "invalid_code"}
        team_id, team_name = place
        self.minted += 1  # never the name of a token revoked before
        token = f"xoxb-{team_id.lower()}-{self.minted}-installed"
        self.tokens[token] = team_id
        return {"ok": True, "app_id": "A0APP", "access_token": token, "token_type": "bot",
                "scope": ",".join(self.scopes), "bot_user_id": BOT_USER_ID, "team": {"id": team_id, "name": team_name},
                "enterprise": None, "is_enterprise_install": False, "authed_user": {"id": "UINSTALLER"}}

    async def _authorize(self, request: web.Request) -> web.Response:
        """Slack's install page, approved at once: back to the redirect URL with a code and the state."""
        redirect = request.query.get("redirect_uri") or self.redirect_to
        code = self.issue_code(request.query.get("team") or TEAM_ID)
        query = urlencode({"code": code, "state": request.query.get("state", "")})
        raise web.HTTPFound(f"{redirect}?{query}")

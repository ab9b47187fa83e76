"""The scopes the bot's token has in the workspace in scope (auth.test's ``x-oauth-scopes``): which Slack tools it
can be offered. Asked once per workspace, kept for ``TTL_S`` (a re-install drops it at once: ``forget``)."""

from __future__ import annotations

import logging
import time

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import TRANSPORT_ERRORS, error_code, transient
from channels.slack.workspaces import TOKEN_GONE, current_team

log = logging.getLogger(__name__)

TTL_S = 600.0


class TokenScopes:
    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._granted: dict[str, tuple[float, frozenset[str] | None]] = {}  # workspace ("": the only one) → scopes

    def forget(self, team: str) -> None:
        self._granted.pop(team, None)

    async def granted(self) -> frozenset[str] | None:
        """The token's scopes; None when Slack did not say (no header, or not reachable now: unknown, not none).
        An empty set: no working token in this workspace (nothing can be offered)."""
        key = current_team() or ""
        cached = self._granted.get(key)
        if cached is not None and time.monotonic() - cached[0] < TTL_S:
            return cached[1]
        try:
            response = await self.client.auth_test()
        except SlackApiError as exc:
            code = error_code(exc)
            if transient(exc, code):
                return None
            if code in TOKEN_GONE:  # no working token here now (uninstalled, or a re-install racing): asked again
                return frozenset()
            log.warning("auth.test refused (%s): no Slack tools offered in this workspace", code)
            scopes: frozenset[str] | None = frozenset()
        except TRANSPORT_ERRORS as exc:
            log.warning("auth.test failed: %s", type(exc).__name__)
            return None
        else:
            header = str((response.headers or {}).get("x-oauth-scopes", "") or "")
            found = {s.strip() for s in header.split(",") if s.strip()}
            scopes = frozenset(found) if found else None
        if len(self._granted) > 4096:
            self._granted.clear()
        self._granted[key] = (time.monotonic(), scopes)
        return scopes

    async def has(self, needs: tuple[str, ...]) -> bool:
        """Whether the token has every scope in ``needs`` (True when unknown: Slack's own refusal says so then)."""
        granted = await self.granted()
        return granted is None or set(needs) <= granted

"""People as Slack knows them (users.info): display names for what the bot says about them in plain text
(the status line), and the facts a sender's trust level is labelled from (core.trust decides what it allows).

Looked up off the ack path only, cached for ``TTL_S``; a workspace that refuses the lookup (no
``users:read``) is remembered, and callers say things without names.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient

log = logging.getLogger(__name__)

TTL_S = 600.0
NAME_MAX = 40
_USER = re.compile(r"[UW][A-Z0-9]{1,31}")
_TEAM = re.compile(r"[TE][A-Z0-9]{1,31}")  # a workspace (or Enterprise Grid org) id
# Nothing invisible, nothing that reorders text, no markup: control and format characters, bidi marks,
# zero-width and tag characters, the soft hyphen, and ``<>&@``.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f"
                      "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f<>&@]")


class SlackPeople:
    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.refused = False
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._known: dict[str, dict[str, Any]] = {}  # the last record each user had (a failed lookup keeps it)
        # One users.info per user at a time: (the record, whether Slack just gave it).
        self._lookups: dict[str, asyncio.Future[tuple[dict[str, Any] | None, bool]]] = {}

    async def name(self, user: str) -> str | None:
        """``user``'s display name (plain text, short, nothing invisible), or None when it is not known."""
        found = await self._record(user)
        if found is None:
            return None
        profile = found.get("profile") or {}
        raw = profile.get("display_name") or found.get("real_name") or found.get("name")
        return _shown(raw) if isinstance(raw, str) else None

    async def trust(self, user: str, team: str | None) -> str | None:
        """The platform's facts about ``user`` as a trust label (core decides what it allows): ``bot``,
        ``external`` (another organisation's user, Slack Connect), ``guest`` (a restricted account),
        ``member``; None when Slack cannot say (unknown, deleted, users.info refused)."""
        found = await self._record(user, stale_ok=False)  # an outage never keeps a demoted person's old label
        if found is None or found.get("deleted"):
            return None
        if found.get("is_bot") or found.get("is_app_user"):
            return "bot"
        home = found.get("team_id") or found.get("team")
        teams = (found.get("enterprise_user") or {}).get("teams") or []
        if found.get("is_stranger") or (team and isinstance(home, str) and home != team and team not in teams):
            return "external"
        if found.get("is_restricted") or found.get("is_ultra_restricted"):
            return "guest"
        return "member"

    async def _record(self, user: str, *, stale_ok: bool = True) -> dict[str, Any] | None:
        """``user``'s users.info record (cached for TTL_S); when the lookup fails, the last one known if
        ``stale_ok`` (names), else None."""
        if self.refused or not _USER.fullmatch(user):
            return None
        cached = self._users.get(user)
        if cached is not None and time.monotonic() - cached[0] < TTL_S:
            return cached[1]
        pending = self._lookups.get(user)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup(user))
            self._lookups[user] = pending
            pending.add_done_callback(lambda _f: self._lookups.pop(user, None))
        found, fresh = await asyncio.shield(pending)
        return found if fresh or stale_ok else None

    async def _lookup(self, user: str) -> tuple[dict[str, Any] | None, bool]:
        """(the record, whether Slack just answered): a failed lookup gives the last record known, not fresh."""
        found: dict[str, Any] | None = None
        try:
            response = await self.client.users_info(user=user)
            record = response.get("user")
            found = record if isinstance(record, dict) else None
        except SlackApiError as exc:
            code = error_code(exc)
            if not transient(exc, code) and code != "user_not_found":
                self.refused = True
                log.warning("users.info refused (%s): statuses name nobody, and every sender's trust is unknown "
                            "(counted as a guest); add the users:read scope", code)
            elif transient(exc, code):
                return self._known.get(user), False
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:  # RuntimeError: shutting down
            log.warning("users.info failed: %s", type(exc).__name__)
            return self._known.get(user), False  # not cached: the next turn asks again; meanwhile what it was
        if len(self._users) > 4096:
            self._users.clear()
            self._known.clear()
        self._users[user] = (time.monotonic(), found)
        if found is not None:
            self._known[user] = found
        return found, True


def team_of(place: str | None) -> str | None:
    """The workspace (or Enterprise Grid org) id of a place ``slack:<team>:<channel>``, if it names one."""
    parts = (place or "").split(":")
    return parts[1] if len(parts) >= 3 and parts[0] == "slack" and _TEAM.fullmatch(parts[1]) else None


def _shown(raw: str) -> str | None:
    name = " ".join(_UNSHOWN.sub("", raw).split())[:NAME_MAX]
    return name or None

"""People as Slack knows them (users.info): display names for what the bot says about them in plain text
(the status line), and the facts a sender's trust level is labelled from (core.trust decides what it allows).

Looked up off the ack path only, cached for ``TTL_S`` per workspace (multi-workspace mode: each with its own
token); a workspace that refuses the lookup (no ``users:read``) is remembered, and callers say things without
names.
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
from channels.slack.workspaces import TOKEN_GONE, current_team

log = logging.getLogger(__name__)

TTL_S = 600.0
NAME_MAX = 40
_USER = re.compile(r"[UW][A-Z0-9]{1,31}")
# Nothing invisible, nothing that reorders text, no markup: control and format characters, bidi marks,
# zero-width and tag characters, the soft hyphen, and ``<>&@``.
_UNSHOWN = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f"
                      "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f<>&@]")


class SlackPeople:
    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.refused_in: set[str] = set()  # workspaces that refused users.info for good ("": the only one)
        # Keyed by (workspace, user): a record read with one workspace's token says nothing in another.
        self._users: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = {}
        self._known: dict[tuple[str, str], dict[str, Any]] = {}  # the last record each had (kept past a failure)
        # One users.info per user at a time: (the record, whether Slack just gave it).
        self._lookups: dict[tuple[str, str], asyncio.Future[tuple[dict[str, Any] | None, bool]]] = {}
        self._emails: dict[tuple[str, str], tuple[float, str | None]] = {}  # (workspace, e-mail) → user id

    def forget(self, team: str) -> None:
        """Drop what is known of workspace ``team``'s people (re-installed or removed)."""
        self.refused_in.discard(team)
        for cache in (self._users, self._known, self._emails):
            for key in [key for key in cache if key[0] == team]:
                del cache[key]

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

    async def by_email(self, email: str) -> str | None:
        """The user id of this workspace's active full member with ``email`` (users.lookupByEmail, cached for
        TTL_S): on-call approvers (core.oncall). A bot, a guest, another organisation's user or a deactivated
        account is nobody here (and could not approve anyway: core.trust)."""
        key = (current_team() or "", email.lower())
        cached = self._emails.get(key)
        if cached is not None and time.monotonic() - cached[0] < TTL_S:
            return cached[1]
        try:
            response = await self.client.users_lookupByEmail(email=email)
        except SlackApiError as exc:
            code = error_code(exc)
            if code != "users_not_found":  # not cached: a missing scope or an outage may be fixed by the next ask
                log.warning("users.lookupByEmail refused (%s): on-call people are not found%s", code,
                            "; add the users:read.email scope" if code == "missing_scope" else "")
                return None
            found = None
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:
            log.warning("users.lookupByEmail failed: %s", type(exc).__name__)
            return None
        else:
            record = response.get("user")
            found = record.get("id") if isinstance(record, dict) and _full_member(record, key[0]) else None
            found = found if isinstance(found, str) and _USER.fullmatch(found) else None
        if len(self._emails) > 4096:
            self._emails.clear()
        self._emails[key] = (time.monotonic(), found)
        return found

    async def _record(self, user: str, *, stale_ok: bool = True) -> dict[str, Any] | None:
        """``user``'s users.info record (cached for TTL_S); when the lookup fails, the last one known if
        ``stale_ok`` (names), else None."""
        key = (current_team() or "", user)
        if key[0] in self.refused_in or not _USER.fullmatch(user):
            return None
        cached = self._users.get(key)
        if cached is not None and time.monotonic() - cached[0] < TTL_S:
            return cached[1]
        pending = self._lookups.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._lookup(key))
            self._lookups[key] = pending
            pending.add_done_callback(lambda _f: self._lookups.pop(key, None))
        found, fresh = await asyncio.shield(pending)
        return found if fresh or stale_ok else None

    async def _lookup(self, key: tuple[str, str]) -> tuple[dict[str, Any] | None, bool]:
        """(the record, whether Slack just answered): a failed lookup gives the last record known, not fresh."""
        found: dict[str, Any] | None = None
        try:
            response = await self.client.users_info(user=key[1])
            record = response.get("user")
            found = record if isinstance(record, dict) else None
        except SlackApiError as exc:
            code = error_code(exc)
            if code in TOKEN_GONE:
                return None, False  # no working token for that workspace (now): nothing learned about the person
            if not transient(exc, code) and code != "user_not_found":
                self.refused_in.add(key[0])
                log.warning("users.info refused (%s): statuses name nobody, and every sender's trust is unknown "
                            "(counted as a guest); add the users:read scope", code)
            elif transient(exc, code):
                return self._known.get(key), False
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:  # RuntimeError: shutting down
            log.warning("users.info failed: %s", type(exc).__name__)
            return self._known.get(key), False  # not cached: the next turn asks again; meanwhile what it was
        if len(self._users) > 4096:
            self._users.clear()
            self._known.clear()
        self._users[key] = (time.monotonic(), found)
        if found is not None:
            self._known[key] = found
        return found, True


def _full_member(record: dict[str, Any], team: str) -> bool:
    """Whether a users.* record is an active, full member of ``team`` (the workspace in scope; "" for the only one)."""
    if record.get("deleted") or record.get("is_bot") or record.get("is_app_user") or record.get("is_stranger"):
        return False
    if record.get("is_restricted") or record.get("is_ultra_restricted"):
        return False
    home = record.get("team_id") or record.get("team")
    return not team or home == team


def _shown(raw: str) -> str | None:
    name = " ".join(_UNSHOWN.sub("", raw).split())[:NAME_MAX]
    return name or None

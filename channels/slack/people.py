"""People's display names (users.info), for what the bot says about them in plain text (the status line).

Looked up off the ack path only, cached for ``TTL_S``; a workspace that refuses the lookup (no
``users:read``) is remembered, and callers say things without names.
"""

from __future__ import annotations

import logging
import re
import time

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient

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
        self.refused = False
        self._names: dict[str, tuple[float, str | None]] = {}

    async def name(self, user: str) -> str | None:
        """``user``'s display name (plain text, short, nothing invisible), or None when it is not known."""
        if self.refused or not _USER.fullmatch(user):
            return None
        cached = self._names.get(user)
        if cached is not None and time.monotonic() - cached[0] < TTL_S:
            return cached[1]
        name: str | None = None
        try:
            response = await self.client.users_info(user=user)
            found = response.get("user") or {}
            profile = found.get("profile") or {}
            raw = profile.get("display_name") or found.get("real_name") or found.get("name")
            name = _shown(raw) if isinstance(raw, str) else None
        except SlackApiError as exc:
            code = error_code(exc)
            if not transient(exc, code) and code != "user_not_found":
                self.refused = True
                log.info("users.info refused (%s): statuses name nobody", code)
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:  # RuntimeError: shutting down
            log.warning("users.info failed: %s", type(exc).__name__)
            return None  # not cached: the next turn asks again
        if len(self._names) > 4096:
            self._names.clear()
        self._names[user] = (time.monotonic(), name)
        return name


def _shown(raw: str) -> str | None:
    name = " ".join(_UNSHOWN.sub("", raw).split())[:NAME_MAX]
    return name or None

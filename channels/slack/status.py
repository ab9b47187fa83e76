"""A turn's thread status line (assistant.threads.setStatus): "thinking…", "running shell_run…".

Slack shows it under the thread while the bot works, and clears it when the bot posts there. A workspace
that refuses it (the app lacks ``assistant:write`` or the feature, a plan without it) is remembered, and
the renderer falls back to the :eyes: reaction for every later turn there.
"""

from __future__ import annotations

import logging

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.api import error_code, transient
from channels.slack.workspaces import TOKEN_GONE, current_team

log = logging.getLogger(__name__)

THINKING = "is thinking…"
LOADING_MESSAGES = ["Thinking…", "Reading the thread…", "Working on it…"]


class ThreadStatus:
    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self.refused_in: set[str] = set()  # workspaces that said no for good: reactions there, from now on

    async def show(self, channel: str, thread_ts: str, status: str) -> bool:
        """Set the thread's status (``""`` clears it); False when it could not be shown."""
        workspace = current_team() or ""
        if workspace in self.refused_in:
            return False
        try:
            await self.client.assistant_threads_setStatus(channel_id=channel, thread_ts=thread_ts, status=status,
                                                          loading_messages=LOADING_MESSAGES if status else None)
        except SlackApiError as exc:
            code = error_code(exc)
            if not transient(exc, code) and code not in TOKEN_GONE:
                self.refused_in.add(workspace)
                log.info("assistant.threads.setStatus refused (%s): progress shows as reactions instead", code)
            return False
        except (aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:  # RuntimeError: the session
            log.warning("assistant.threads.setStatus failed: %s", type(exc).__name__)  # closed (shutting down)
            return False
        return True

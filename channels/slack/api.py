"""Small helpers around slack_sdk's Web API errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import aiohttp
from prometheus_client import Counter
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

log = logging.getLogger(__name__)

SLACK_API_ERRORS = Counter("chatops_slack_api_errors", "Slack Web API calls that failed, by method and error",
                           ["method", "error"])


# Slack errors that say "not now" rather than "never" (HTTP 5xx and 429 count as well).
RETRYABLE_ERRORS = frozenset({"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"})


def transient(exc: SlackApiError, code: str) -> bool:
    """Whether Slack may take the same call later (``code``: ``error_code(exc)``, already counted)."""
    status = getattr(exc.response, "status_code", 200)
    return code in RETRYABLE_ERRORS or status >= 500 or status == 429


def error_code(exc: SlackApiError) -> str:
    """Slack's error code ("not_in_channel"…), or the HTTP status when the answer was not JSON.
    Every failed call passes through here once, so it is also where failures are counted."""
    data = getattr(exc.response, "data", None)
    code = str(data["error"]) if isinstance(data, dict) and data.get("error") else (
        f"HTTP {getattr(exc.response, 'status_code', '?')}")
    method = str(getattr(exc.response, "api_url", "") or "").rstrip("/").rsplit("/", 1)[-1] or "unknown"
    SLACK_API_ERRORS.labels(method=method, error=code).inc()
    return code


# Transport failures of a Web API call (RuntimeError: the session closed while shutting down).
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, RuntimeError)


async def best_effort(client: AsyncWebClient, method: str, **params: Any) -> bool:
    """A call whose failure only costs a nicety (a prompt, a title, a private word): logged, never raised."""
    try:
        await getattr(client, method)(**params)
    except SlackApiError as exc:
        log.warning("%s failed: %s", method, error_code(exc))
        return False
    except TRANSPORT_ERRORS as exc:
        log.warning("%s failed: %s", method, type(exc).__name__)
        return False
    return True


class Later:
    """Calls made after the ack (Slack's API must never delay acknowledging), kept until they end."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def run(self, call: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(call)
        self._running.add(task)
        task.add_done_callback(self._running.discard)


class PrivateReplies:
    """Answers a clicker privately, after the ack."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._later = Later()

    def tell(self, channel: str, user: str, text: str, *, thread_ts: str | None = None) -> None:
        """``text`` for ``user``'s eyes only, in ``channel`` (in the thread ``thread_ts``, when given)."""
        if channel and user:
            self._later.run(best_effort(self.client, "chat_postEphemeral", channel=channel, user=user, text=text,
                                        thread_ts=thread_ts))

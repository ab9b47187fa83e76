"""Small helpers around slack_sdk's Web API errors."""

from __future__ import annotations

from prometheus_client import Counter
from slack_sdk.errors import SlackApiError

SLACK_API_ERRORS = Counter("bot_slack_api_errors", "Slack Web API calls that failed, by method and error",
                           ["method", "error"])


def error_code(exc: SlackApiError) -> str:
    """Slack's error code ("not_in_channel"…), or the HTTP status when the answer was not JSON.
    Every failed call passes through here once, so it is also where failures are counted."""
    data = getattr(exc.response, "data", None)
    code = str(data["error"]) if isinstance(data, dict) and data.get("error") else (
        f"HTTP {getattr(exc.response, 'status_code', '?')}")
    method = str(getattr(exc.response, "api_url", "") or "").rstrip("/").rsplit("/", 1)[-1] or "unknown"
    SLACK_API_ERRORS.labels(method=method, error=code).inc()
    return code

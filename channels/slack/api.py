"""Small helpers around slack_sdk's Web API errors."""

from __future__ import annotations

from slack_sdk.errors import SlackApiError


def error_code(exc: SlackApiError) -> str:
    """Slack's error code ("not_in_channel"…), or the HTTP status when the answer was not JSON."""
    data = getattr(exc.response, "data", None)
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return f"HTTP {getattr(exc.response, 'status_code', '?')}"

"""The Slack adapter (slack-bolt ``AsyncApp``): HTTP mode or Socket Mode."""

from channels.slack.adapter import SlackChannel, SlackConfig

__all__ = ["SlackChannel", "SlackConfig"]

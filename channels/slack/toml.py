"""The ``[slack]`` table of ``bot.toml`` (SPEC §16, §17): what the assistant pane offers when a person opens a new
chat, and the channels the bot listens in (where a message nobody addressed to it still starts a turn).

The bot reads and checks the whole file; this model is the Slack channel's own section of it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_PROMPTS = 4  # Slack shows at most four suggested prompts
DEFAULT_LISTEN_RATE = 6  # unaddressed turns per listening channel a minute
MAX_LISTEN_CHANNELS = 100
# A channel: its id (C… public, G… private), or #name (Slack's names: lower case, at most 80 characters, no spaces,
# no punctuation but - _ .; letters of any script).
LISTEN_CHANNEL = r"^(#[^\sA-Z#<>@,|&'\"`]{1,80}|[CG][A-Z0-9]{2,31})$"
_TITLE_MAX, _MESSAGE_MAX = 75, 2_000

DEFAULT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("What can you do?", "What can you do for me here, and what needs someone's approval?"),
    ("Check a service", "Check whether our services look healthy and tell me what you find."),
    ("Explain an error", "I'll paste an error message next: tell me what it means and how to fix it."),
)

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


class SuggestedPrompt(BaseModel):
    """A button in the assistant pane: its title, and the message it sends."""

    model_config = _STRICT

    title: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=_TITLE_MAX)] = Field(
        description=f"text of 1 to {_TITLE_MAX} characters")
    message: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=_MESSAGE_MAX)] = Field(
        description=f"text of 1 to {_MESSAGE_MAX} characters")


class SlackSection(BaseModel):
    """Slack's settings in bot.toml."""

    model_config = _STRICT

    suggested_prompts: list[SuggestedPrompt] | None = Field(
        None, max_length=MAX_PROMPTS,
        description=f"a list of at most {MAX_PROMPTS} tables with title and message: what a new assistant chat "
                    "offers (default: three general prompts; [] offers none)")
    listen_channels: list[Annotated[str, StringConstraints(pattern=LISTEN_CHANNEL)]] = Field(
        default_factory=list, max_length=MAX_LISTEN_CHANNELS,
        description=f"at most {MAX_LISTEN_CHANNELS} channels, each #name or a channel id (C…, G…): there a message "
                    "that does not mention the bot still starts a turn, whose answer is optional (default: none)")
    listen_rate_per_minute: int = Field(
        DEFAULT_LISTEN_RATE, ge=1, le=600,
        description="unaddressed turns a listening channel starts in a minute, 1 to 600; beyond it, messages are "
                    f"kept as context only (default: {DEFAULT_LISTEN_RATE})")


def prompts_of(section: SlackSection | None) -> tuple[tuple[str, str], ...]:
    """(title, message) pairs: the defaults when there is no [slack] table or no key, none for an empty list."""
    if section is None or section.suggested_prompts is None:
        return DEFAULT_PROMPTS
    return tuple((p.title, p.message) for p in section.suggested_prompts)


def listening_of(section: SlackSection | None) -> tuple[tuple[str, ...], int]:
    """The channels the bot listens in (each once, as configured), and their unaddressed turns per minute."""
    if section is None:
        return (), DEFAULT_LISTEN_RATE
    return tuple(dict.fromkeys(section.listen_channels)), section.listen_rate_per_minute

"""What every ``bot.toml`` table shares: unknown keys refused, values taken as written, and how a rule says no.

A table's error text is built from its field: ``Says`` when the field carries one, else "must be" and the
field's description (which editors also show, through the JSON Schema). A validator raises ``Problem`` for
anything more particular.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from bot.people import is_approver

# What the schema tells editors a person looks like: the requester, a bare id an installed channel claims (Slack's
# U…/W…/S…, the web chat's web) or <channel>:<id>. The check itself asks the installed channels (bot.people).
PERSON = re.compile(r"requester|web|[UWS][A-Z0-9]+|[a-z][a-z0-9_-]*:[A-Za-z0-9._@-]+")


class Table(BaseModel):
    """A table of bot.toml. Strict: ``true`` is not 1 and "5" is not 5; a misspelt key is refused, not ignored
    (it must not quietly drop a limit or an approver)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Says:
    """Annotated metadata: what to say when the field's value is wrong, in place of "must be <description>"."""

    def __init__(self, text: str) -> None:
        self.text = text


class Problem(ValueError):
    """A validator's refusal. ``text`` follows the path of the key (none: the field's own text); ``at``
    continues that path, for a rule checked on the whole table or list but about one key or item."""

    def __init__(self, text: str | None = None, *, at: tuple[str | int, ...] = ()) -> None:
        super().__init__(text or "")
        self.text = text
        self.at = at


def _person(value: str) -> str:
    if not is_approver(value):
        raise Problem("is not a user id, group id, 'requester' or 'web' (or <channel>:<id>, or oncall:<PagerDuty "
                      "schedule id>: capital letters and digits, e.g. oncall:P1AB2CD)")
    return value


Text = Annotated[str, Field(min_length=1)]
# An approver (``approvers``, ``escalate_to``): a person, or oncall:<schedule id> (the PagerDuty rota's people).
Person = Annotated[str, AfterValidator(_person), WithJsonSchema({"type": "string", "pattern": f"^({PERSON.pattern})$"})]


def loopback(host: str) -> bool:
    """Whether a URL's host is this machine (plain http is accepted there: a local provider, tests)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

"""``[[event_sources]]`` (SPEC §17): systems that wake the agent with a delivery to ``POST /events/<name>``.

The secret is never in the file: ``secret_env`` names the environment variable holding the GitHub secret, the
``whsec_…`` key or the bearer token (read by the wiring at start).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints

from bot.config.table import Problem, Says, Table, Text
from core.webhooks.model import EventSource
from core.webhooks.thread_key import MAX_KEY, template_problem

SOURCE_NAME = re.compile(r"^[a-z0-9-]{1,48}$")
# "#name" (a Slack channel's name, looked up when posting) or a channel id (C…, G…).
DESTINATION = re.compile(r"^(#[^\s#,<>]{1,80}|[CG][A-Z0-9]{2,30})$")
MAX_PROMPT = 4000
MAX_RATE = 10_000


def _variable(value: str) -> str:
    if not value.isidentifier() or not value.isascii():
        raise Problem()
    return value


def _template(value: str) -> str:
    problem = template_problem(value)
    if problem is not None:
        raise Problem(problem)
    return value


class EventSourceTable(Table):
    """A system that sends events (a GitHub webhook, a Standard Webhooks sender, Alertmanager or Grafana): each
    delivery becomes a turn of `agent`, answered in `destination`."""

    name: Annotated[str, Says(f"must match {SOURCE_NAME.pattern} (e.g. 'github-ci'); it is the route "
                                 "POST /events/<name>")] = Field(
        pattern=SOURCE_NAME.pattern, description="the source's name: lower-case letters, digits and -, at most 48 "
                                                 "(its route is POST /events/<name>)")
    kind: Literal["github", "standard", "bearer"] = Field(
        description="one of github (X-Hub-Signature-256), standard (Standard Webhooks) or bearer (a token in "
                    "Authorization: Bearer, e.g. Alertmanager or Grafana)")
    secret_env: Annotated[str, AfterValidator(_variable)] = Field(
        description="the name of the environment variable holding the GitHub secret, the whsec_… key or the token "
                    "(e.g. GITHUB_WEBHOOK_SECRET)")
    destination: Annotated[str, Says("must be a Slack channel '#name' or a channel id (C…)")] = Field(
        pattern=DESTINATION.pattern, description="the Slack channel its answers go to: '#name' or a channel id")
    agent: Text | None = Field(None, description="the [[agents]] agent that answers (default: the default agent)")
    prompt: Annotated[str, StringConstraints(min_length=1, max_length=MAX_PROMPT)] | None = Field(
        None, description=f"text put before each event (at most {MAX_PROMPT} characters)")
    events: list[Text] = Field(["*"], min_length=1, description="a list of globs over the event type (GitHub: "
                                                                "'<X-GitHub-Event>.<action>' or the header alone; "
                                                                "Standard Webhooks: the payload's type); default all")
    thread: Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY), AfterValidator(_template)] | None \
        = Field(None, description="a template of {dotted.path} fields of the payload, e.g. "
                                  "'{repository.full_name}#{pull_request.number}': events with the same key answer "
                                  "in one thread (default: each event its own)")
    rate_per_minute: int = Field(60, ge=1, le=MAX_RATE, description=f"a whole number from 1 to {MAX_RATE}: "
                                                                    "deliveries taken per minute (default 60)")
    trust: Annotated[Literal["member", "guest", "external", "bot"], Says(
        "must be one of member, guest, external, bot (an event is never an admin's)")] = Field(
        "external", description="the sender level its turns run at: member, guest, external or bot "
                                "(default external)")

    def source(self, default_agent: str | None) -> EventSource:
        return EventSource(name=self.name, kind=self.kind, secret_env=self.secret_env, destination=self.destination,
                           agent=self.agent or default_agent, prompt=self.prompt, events=tuple(self.events),
                           thread=self.thread, rate_per_minute=self.rate_per_minute, trust=self.trust)

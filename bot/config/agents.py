"""``[[agents]]`` (SPEC §6, §16, §17): named agents with their own instructions, tools, skills and approvers."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from bot.config.table import Person, Problem, Says, Table, Text
from core.agents import DEFAULT_INSTRUCTIONS, Agent
from core.spending import AgentCaps

# One plain path component too: an agent's work folder is $BOT_HOME/work/<name> (bot.tools.shell).
AGENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
# The bot's own secrets live under these names: an agent's key is sent to its base_url, so naming one of them there
# would hand the bot's Slack token, vault keys, the primary's key or the trace exporter's headers to whatever that
# URL is.
OWN_SECRET_PREFIXES = ("SLACK_", "BOT_", "LLM_", "DATABASE_", "OPENAI_", "ANTHROPIC_", "OTEL_")


def _not_blank(text: str) -> str:
    if not text.strip():
        raise Problem()
    return text


def _key_variable(name: str) -> str:
    if not name.isidentifier() or not name.isascii():
        raise Problem()
    if name.upper().startswith(OWN_SECRET_PREFIXES) or name.upper() in _secret_settings():
        raise Problem(f"is {name}, a name of the bot's own settings ({', '.join(p + '*' for p in OWN_SECRET_PREFIXES)}"
                      ", or an installed channel's secret): the agent's key is sent to its base_url, so it must be a "
                      "variable of its own (e.g. OPS_AGENT_API_KEY), never one of the bot's secrets")
    return name


def _secret_settings() -> set[str]:
    """Every secret setting's variable, a channel's installed by its entry point too (its prefix is its own)."""
    from bot.settings import secret_names

    return set(secret_names())


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise Problem()
    return url


class AgentTable(Table):
    """An agent; the first [[agents]] table is the default one, which may hand work to the others."""

    name: Annotated[str, Says(f"must match {AGENT_NAME.pattern}")] = Field(
        pattern=AGENT_NAME.pattern, description="the agent's name: lower-case letters, digits, _ or -")
    instructions: Annotated[str, AfterValidator(_not_blank)] | None = Field(
        None, description="a non-empty string: the agent's system prompt (default BOT_INSTRUCTIONS)")
    tools: list[Text] = Field(["*"], description="a list of tool names or globs it may use (default all)")
    skills: list[Text] = Field(["*"], description="a list of skill names or globs whose skills it may use (default "
                                                  "all; [] for none)")
    approvers: list[Person] = Field([], description="a list of who approves its gated calls: user ids (U…), user "
                                                    "group ids (S…), 'requester' or 'web' (default BOT_APPROVERS)")
    model: Text | None = Field(None, description="the model its calls go to (default LLM_MODEL); its sub-agents "
                                                 "use it unless they have their own")
    max_steps: int | None = Field(None, ge=1, le=200, description="an integer from 1 to 200: the model calls one of "
                                                                  "its turns may make (default MAX_STEPS; as a "
                                                                  "sub-agent SUBAGENT_MAX_STEPS)")
    provider: Literal["openai", "anthropic"] | None = Field(
        None, description="'openai' (OpenAI-compatible) or 'anthropic': another provider for its model (default "
                          "LLM_PROVIDER)")
    base_url: Annotated[str, AfterValidator(_http_url)] | None = Field(
        None, description="an http:// or https:// URL: another endpoint for its model (default LLM_BASE_URL, or the "
                          "provider's own)")
    api_key_env: Annotated[str, AfterValidator(_key_variable)] | None = Field(
        None, description="the name of the environment variable holding its key (never one of the bot's own: "
                          "SLACK_*, BOT_*, LLM_*…); without it, a base_url of its own gets no key")
    # Spending caps (core.spending): per UTC day and month, in tokens or priced by [[prices]].
    daily_tokens: int | None = Field(None, ge=1, description="an integer ≥ 1: the tokens its calls may use per UTC "
                                                             "day (default no cap)")
    monthly_tokens: int | None = Field(None, ge=1, description="an integer ≥ 1: the tokens its calls may use per UTC "
                                                               "month (default no cap)")
    # A finite number: `inf` (TOML has it) meant to say "no cap" would fail every model call of the agent.
    daily_cost: float | None = Field(None, gt=0, allow_inf_nan=False,
                                     description="a number > 0: what its calls may cost per UTC day, priced by "
                                                 "[[prices]] (default no cap)")
    monthly_cost: float | None = Field(None, gt=0, allow_inf_nan=False,
                                       description="a number > 0: what its calls may cost per UTC month, priced by "
                                                   "[[prices]] (default no cap)")

    @model_validator(mode="after")
    def _endpoint_names_model(self) -> AgentTable:
        if (self.provider or self.base_url) and not self.model:
            raise Problem(f"is required with {'provider' if self.provider else 'base_url'}: name the model to call "
                          "there", at=("model",))
        return self

    def agent(self, default_instructions: str | None) -> Agent:
        instructions = self.instructions or default_instructions or DEFAULT_INSTRUCTIONS
        return Agent(name=self.name, instructions=instructions, tools=tuple(self.tools),
                     skills=tuple(self.skills), approvers=tuple(self.approvers), model=self.model,
                     max_steps=self.max_steps)

    def caps(self) -> AgentCaps:
        return AgentCaps(self.daily_tokens, self.monthly_tokens, self.daily_cost, self.monthly_cost)

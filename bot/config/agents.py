"""``[[agents]]`` (SPEC §6, §16, §17): named agents with their own instructions, tools, skills and approvers."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

from bot.config.table import Person, Problem, Says, Table, Text
from core.agents import DEFAULT_INSTRUCTIONS, Agent

# One plain path component too: an agent's work folder is $BOT_HOME/work/<name> (bot.tools.shell).
AGENT_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


def _not_blank(text: str) -> str:
    if not text.strip():
        raise Problem()
    return text


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

    def agent(self, default_instructions: str | None) -> Agent:
        instructions = self.instructions or default_instructions or DEFAULT_INSTRUCTIONS
        return Agent(name=self.name, instructions=instructions, tools=tuple(self.tools),
                     skills=tuple(self.skills), approvers=tuple(self.approvers))

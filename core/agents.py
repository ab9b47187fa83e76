"""Agents: a name, instructions, the tools they may call and the skills they may use."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DEFAULT_INSTRUCTIONS = (
    "You are a helpful chat-ops assistant working in a team chat thread. "
    "Answer concisely. Use tools when they help; say plainly when something failed."
)
DELEGATE_TOOL = "delegate"  # runs another agent as a sub-agent (core.subagents)


@dataclass(frozen=True)
class Agent:
    name: str = "default"
    instructions: str = DEFAULT_INSTRUCTIONS
    tools: tuple[str, ...] = ("*",)
    skills: tuple[str, ...] = ("*",)  # globs over skill names (core.skills): the skills its prompt lists
    approvers: tuple[str, ...] = field(default_factory=tuple)
    # Its own model ([[agents]] model / provider; the wiring builds it: core.model_routing), and its own step limit.
    model: str | None = None
    max_steps: int | None = None


class AgentDirectory:
    """The agents this gateway knows; the first one is the default."""

    def __init__(self, agents: list[Agent]) -> None:
        if not agents:
            raise ValueError("at least one agent is required")
        if len(agents) > 1 and DELEGATE_TOOL not in agents[0].tools:
            # The default agent may hand work to the others (SPEC §16); others only when they name delegate.
            agents = [replace(agents[0], tools=(*agents[0].tools, DELEGATE_TOOL)), *agents[1:]]
        self._agents = {a.name: a for a in agents}
        self.default = agents[0]

    def get(self, name: str | None) -> Agent:
        if name is None:
            return self.default
        return self._agents.get(name, self.default)

    def find(self, name: str) -> Agent | None:
        """The agent of exactly this name (no fallback to the default)."""
        return self._agents.get(name)

    def names(self) -> list[str]:
        return list(self._agents)

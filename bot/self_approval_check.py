"""The setups nobody could approve (``core.self_approval.unsatisfiable``), from the settings and bot.toml: refused
by `bot policies check` and `bot doctor`, and they stop `bot run` with one line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot.settings import Settings
from core.agents import Agent
from core.policies import Policy
from core.self_approval import Deciders, tight_quorums, unsatisfiable


def unsatisfiable_setup(settings: Settings, policies: Sequence[Policy], agents: Iterable[Agent]) -> list[str]:
    deciders = [Deciders(agent.name, agent.approvers or settings.approvers) for agent in agents]
    return unsatisfiable(policies, deciders, admins=settings.admins, default=settings.bot_self_approval)


def self_approval_warnings(settings: Settings, policies: Sequence[Policy]) -> list[str]:
    return tight_quorums(policies, default=settings.bot_self_approval)

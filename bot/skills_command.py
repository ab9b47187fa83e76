"""``bot skills list`` and the doctor's skills check: each skill of SKILLS_DIR (and the built-in one) with its status.

A skill is, for each agent: available; not offered (the agent's ``skills`` globs leave it out); or unavailable, with
why (a tool the agent's ``tools`` list does not admit, a credential not stored for it). A malformed one is named
with its path and line. The running bot judges tools by what each turn is actually offered (a Slack tool only in
Slack, an MCP server's once it has started); this command, which starts nothing, by the agent's ``tools`` list.
"""

from __future__ import annotations

import argparse
import fnmatch

from bot.config.file import load_agents
from bot.errors import BotError
from bot.home import skills_dir_problem
from bot.settings import Settings, load_settings
from bot.skills import BUILTIN_SKILLS
from core.agents import Agent
from core.plugins import Check
from core.skills import Skill, SkillCatalog, SkillRoot, allowed_by, missing_requirements


def catalog_of(settings: Settings) -> SkillCatalog:
    """The skills `bot run` would list: the built-in ones, then SKILLS_DIR's."""
    return SkillCatalog([SkillRoot(BUILTIN_SKILLS, builtin=True), SkillRoot(settings.resolved_skills_dir)])


async def skills_command(args: argparse.Namespace) -> int:
    settings = load_settings()
    if (unusable := skills_dir_problem(settings)) is not None:
        raise BotError(unusable)
    agents = load_agents(settings.bot_config, default_instructions=settings.bot_instructions)
    if args.agent is not None:
        agents = [agent for agent in agents if agent.name == args.agent]
        if not agents:
            raise BotError(f"there is no agent named {args.agent!r} in {settings.bot_config}")
    catalog = catalog_of(settings)
    skills, problems = catalog.skills(), catalog.problems()
    stored = await _stored_credentials(agents) if any(s.credentials for s in skills.values()) else None
    print(f"skills folder: {settings.resolved_skills_dir}"
          + ("" if settings.resolved_skills_dir.is_dir() else " (missing: no operator skills)"))
    for name, skill in sorted(skills.items()):
        where = "built-in" if skill.builtin else str(skill.path)
        print(f"{name} ({where})")
        for agent in agents:
            print(f"  {agent.name}: {_status(skill, agent, stored)}")
    for problem in problems:
        print(f"malformed: {problem}")
    if not skills and not problems:
        print("no skills")
    return 0


def _status(skill: Skill, agent: Agent, stored: dict[str, set[str]] | None) -> str:
    if not allowed_by(agent.skills, skill.name):
        return "not offered (the agent's `skills` globs leave it out)"
    names = stored.get(agent.name, set()) if stored is not None else set()
    reasons = missing_requirements(
        skill, lambda tool: any(fnmatch.fnmatchcase(tool, pattern) for pattern in agent.tools), names.__contains__)
    reasons = [reason.replace("this agent does not have here", "its `tools` do not include") for reason in reasons]
    if stored is None and skill.credentials:
        reasons.append("its credentials were not checked (the database could not be read)")
    return "available" if not reasons else "unavailable: " + "; ".join(reasons)


async def _stored_credentials(agents: list[Agent]) -> dict[str, set[str]] | None:
    """Each agent's stored credential names, or None when the database cannot be read (said, not fatal)."""
    from bot.operator import _core

    try:
        async with _core() as core:
            return {agent.name: await core.credentials.stored_names(agent.name) for agent in agents}
    except BotError:
        return None


def doctor_checks(settings: Settings) -> list[Check]:
    """SKILLS_DIR usable, and each malformed skill file by path and line (the bot starts without them)."""
    if (problem := skills_dir_problem(settings)) is not None:
        return [Check("skills", False, problem, "set SKILLS_DIR to a folder of its own: $BOT_HOME/skills (the "
                                                "default) or one outside BOT_HOME and its work folders")]
    catalog = catalog_of(settings)
    skills, problems = catalog.skills(), catalog.problems()
    operator = sum(1 for skill in skills.values() if not skill.builtin)
    detail = f"{operator} skill(s) in {settings.resolved_skills_dir}, and {len(skills) - operator} built-in"
    if not problems:
        return [Check("skills", True, detail)]
    return [Check("skills", True, f"{detail}; left out, malformed: " + "; ".join(str(p) for p in problems),
                  "correct each file named (front matter between '---' lines with name = the folder's name and a "
                  "description); `bot skills list` shows every skill's status", warning=True)]

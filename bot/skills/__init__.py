"""The skills shipped with the bot (``builtin/<name>/SKILL.md``, package data), listed beside the operator's
SKILLS_DIR.

An operator's folder of the same name is refused (core.skills.SkillCatalog), so what the bot says of itself stays
what this version does."""

from __future__ import annotations

from pathlib import Path

BUILTIN_SKILLS = Path(__file__).resolve().parent / "builtin"  # a plain folder: no __pycache__ beside the skills

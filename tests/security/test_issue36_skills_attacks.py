"""Issue 36 (skills), attacked from outside: each test is a finding that failed before its fix. tests/test_skills.py
holds what the feature promises; this file what an attacker tried against it. The attacker writes the skills
folder (a careless or hostile runbook author), or names files in it, or is the text a model reads."""

from __future__ import annotations

import time
from pathlib import Path

from core.skills import SkillCatalog, SkillRoot
from tests.test_skills import skill


def test_costly_front_matter_in_many_skills_does_not_stall_the_bot(tmp_path: Path) -> None:
    """Finding: the catalog runs on the event loop, and each SKILL.md's front matter was parsed three times by the
    pure-Python YAML parser. 16 KiB of plain words (within every cap) cost ~70 ms, so 500 such skills stalled every
    conversation for ~35 s at start and again each time their author touched them (every 2 s if they like). Now
    libyaml parses them, twice: ~1 ms each."""
    for i in range(100):
        skill(tmp_path, f"s{i}", f"name: s{i}\ndescription: d\nnotes: " + "word " * 3200 + "\n")
    found = SkillCatalog([SkillRoot(tmp_path)])
    started = time.perf_counter()
    found.refresh(force=True)
    took = time.perf_counter() - started
    assert len(found.skills()) == 100, found.problems()[:1]
    assert took < 2.0, f"100 skills took {took:.1f} s to read"

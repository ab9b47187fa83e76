"""The skill catalog (SPEC §17): ``<name>/SKILL.md`` files in the open Agent Skills format, read from the skills
folders and read again when they change, with no restart.

A SKILL.md opens with YAML front matter between two ``---`` lines: ``name`` (the folder's name, ``[a-z0-9-]``, at
most 64 characters), ``description`` (at most 1,024 characters), and optionally ``requires`` with ``tools`` and
``credentials`` (lists of names). Other keys of the format (``license``, ``metadata``…) are allowed and ignored.

Whoever writes the folder may be careless or hostile, and the bot must start anyway: a skill that cannot be read
is left out with a problem naming its path and line (``bot doctor``, ``bot skills list``). The front matter is
read no further than ``FRONT_MATTER_MAX_BYTES``, and before PyYAML builds anything its events are checked: no
anchors or aliases (the "billion laughs"), no nesting deeper than ``MAX_NESTING``, no more than ``MAX_EVENTS``;
only then the safe loader builds the values (never an object of a Python class). The catalog runs on the event
loop, so libyaml parses when PyYAML has it: the pure-Python parser takes ~25 ms per pass over 16 KiB of plain
words, and 500 such skills (every cap kept) would stall every conversation for half a minute at each change.

Changes are noticed by looking (no thread, no watcher): at most once every ``min_interval_s``, the folders'
entries and each SKILL.md's size and times are compared with what was read, and only what changed is read again.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.display import visible
from core.skill_files import UnreadableFile, read_inside
from core.stored_secrets import NAME as CREDENTIAL_NAME

log = logging.getLogger(__name__)

SKILL_FILE = "SKILL.md"
NAME = re.compile(r"[a-z0-9-]{1,64}")
DESCRIPTION_MAX_CHARS = 1024
TOOL_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_REQUIREMENTS = 32  # tools, and credentials, one skill may name
SKILL_FILE_MAX_BYTES = 256 * 1024  # what skill_read returns at most; a larger SKILL.md is malformed
FRONT_MATTER_MAX_BYTES = 16 * 1024
MAX_NESTING = 4
MAX_EVENTS = 2_000
MAX_SKILLS = 500  # folders read per skills folder; the rest are named as a problem
MAX_ENTRIES = 4 * MAX_SKILLS  # names looked at in a skills folder (files and hidden ones too): millions would stall
# libyaml's parser (about a hundred times faster), with the same safe constructor; the pure-Python one otherwise.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    root: Path  # the skills folder it was found in; its files are root/name/...
    tools: tuple[str, ...] = ()  # requires.tools
    credentials: tuple[str, ...] = ()  # requires.credentials
    builtin: bool = False  # shipped with the bot (a folder of the package), not the operator's

    @property
    def path(self) -> Path:
        return self.root / self.name / SKILL_FILE


@dataclass(frozen=True)
class SkillProblem:
    """Why a skill was left out: the file (or folder), the line of the front matter when known, and what to fix.
    Shown in terminals and logs with every invisible character marked: a folder's name is anyone's choice, and
    may hold escape sequences, line breaks or bytes that are not UTF-8."""

    path: Path
    line: int | None
    text: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return visible(f"{where}: {self.text}".replace("\n", "⟦LF⟧"))


@dataclass(frozen=True)
class SkillRoot:
    """A folder of skills: the operator's (SKILLS_DIR) or the package's built-in ones."""

    path: Path
    builtin: bool = False


def allowed_by(patterns: Iterable[str], name: str) -> bool:
    """Whether an agent's ``skills`` globs admit the skill ``name``."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def missing_requirements(skill: Skill, has_tool: Callable[[str], bool], has_credential: Callable[[str], bool]
                         ) -> list[str]:
    """Why an agent cannot use ``skill`` now, one reason per requirement it lacks (empty: it can)."""
    reasons = [f"needs the tool {tool}, which this agent does not have here" for tool in skill.tools
               if not has_tool(tool)]
    reasons += [f"needs the credential {name}, which is not stored for this agent" for name in skill.credentials
                if not has_credential(name)]
    return reasons


# -- reading one SKILL.md ---------------------------------------------------------------------------------------------


class _Malformed(Exception):
    def __init__(self, text: str, line: int | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.line = line


def parse_skill(root: SkillRoot, name: str) -> Skill:
    """The skill in ``root.path/name``; raises _Malformed (text and line) when it cannot be used."""
    if not NAME.fullmatch(name):
        raise _Malformed("the folder's name is not a skill name (lower-case letters, digits and '-', at most 64)")
    try:
        head = read_inside(root.path, name, [SKILL_FILE], max_bytes=SKILL_FILE_MAX_BYTES)
    except UnreadableFile as exc:
        raise _Malformed(str(exc)) from None
    matter = _front_matter(head)
    values, lines = _load(matter)
    return _skill(root, name, values, lines)


def _front_matter(data: bytes) -> str:
    """The YAML between the first line ``---`` and the next, as text (line 1 of the file is the first ``---``)."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    first, _, rest = data.partition(b"\n")
    if first.rstrip(b"\r") != b"---":
        raise _Malformed("SKILL.md must begin with a line '---' opening the front matter (name, description)", 1)
    end = -1
    at = 0
    while at <= min(len(rest), FRONT_MATTER_MAX_BYTES):
        newline = rest.find(b"\n", at)
        line = rest[at:] if newline < 0 else rest[at:newline]
        if line.rstrip(b"\r") == b"---":
            end = at
            break
        if newline < 0:
            break
        at = newline + 1
    if end < 0:
        if len(rest) > FRONT_MATTER_MAX_BYTES:
            raise _Malformed(f"the front matter is not closed by a line '---' within {FRONT_MATTER_MAX_BYTES:,} "
                             "bytes", 1)
        raise _Malformed("the front matter is not closed by a line '---'", 1)
    if end > FRONT_MATTER_MAX_BYTES:
        raise _Malformed(f"the front matter is longer than {FRONT_MATTER_MAX_BYTES:,} bytes", 1)
    raw = rest[:end]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Malformed("the front matter is not UTF-8 text", 2 + raw[:exc.start].count(b"\n")) from None


def _load(text: str) -> tuple[dict[str, Any], dict[str, int]]:
    """The front matter's values, and the file line of each top-level key (and of ``requires.<key>``)."""
    _check_events(text)
    loader = _LOADER(text)
    try:  # composed once: the values are built from the same nodes that give the lines
        node = loader.get_single_node()
        values = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _Malformed(f"the front matter is not valid YAML: {_yaml_problem(exc)}", _yaml_line(exc)) from None
    finally:
        loader.dispose()
    if not isinstance(values, dict) or not isinstance(node, yaml.MappingNode):
        raise _Malformed("the front matter must be a mapping of keys (name: …, description: …)", 2)
    lines: dict[str, int] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            lines[key.value] = key.start_mark.line + 2
            if key.value == "requires" and isinstance(value, yaml.MappingNode):
                for sub, _ in value.value:
                    if isinstance(sub, yaml.ScalarNode):
                        lines[f"requires.{sub.value}"] = sub.start_mark.line + 2
    return values, lines


def _check_events(text: str) -> None:
    """Refuse, before anything is built, what makes a small text costly: anchors and aliases (one alias can stand
    for a million nodes), deep nesting, and a flood of nodes."""
    depth = count = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            count += 1
            line = event.start_mark.line + 2 if event.start_mark is not None else None
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
                raise _Malformed("YAML anchors and aliases (& and *) are not allowed in a skill's front matter", line)
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise _Malformed(f"the front matter is nested more than {MAX_NESTING} levels deep", line)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if count > MAX_EVENTS:
                raise _Malformed(f"the front matter holds more than {MAX_EVENTS:,} YAML nodes", line)
    except yaml.YAMLError as exc:
        raise _Malformed(f"the front matter is not valid YAML: {_yaml_problem(exc)}", _yaml_line(exc)) from None


def _yaml_line(exc: yaml.YAMLError) -> int | None:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return mark.line + 2 if mark is not None else None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return str(getattr(exc, "problem", None) or getattr(exc, "context", None) or type(exc).__name__)


def _skill(root: SkillRoot, folder: str, values: dict[str, Any], lines: dict[str, int]) -> Skill:
    name = values.get("name")
    if name is None:
        raise _Malformed("`name` is missing: it must be the folder's name", 2)
    if not isinstance(name, str):
        raise _Malformed("`name` must be a string (the folder's name)", lines.get("name"))
    if name != folder:
        raise _Malformed(f"`name` is {name[:80]!r} but the folder is {folder!r}: they must be the same",
                         lines.get("name"))
    description = values.get("description")
    if description is None:
        raise _Malformed("`description` is missing: say in a sentence what the skill is for and when to use it", 2)
    if not isinstance(description, str) or not description.strip():
        raise _Malformed("`description` must be a non-empty string", lines.get("description"))
    if len(description) > DESCRIPTION_MAX_CHARS:
        raise _Malformed(f"`description` is {len(description):,} characters; at most {DESCRIPTION_MAX_CHARS:,}",
                         lines.get("description"))
    tools, credentials = _requirements(values.get("requires"), lines)
    return Skill(name=name, description=description, root=root.path, tools=tools, credentials=credentials,
                 builtin=root.builtin)


def _requirements(requires: object, lines: dict[str, int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if requires is None:
        return (), ()
    if not isinstance(requires, dict):
        raise _Malformed("`requires` must be a mapping with `tools` and/or `credentials`", lines.get("requires"))
    unknown = sorted(str(key) for key in requires if key not in ("tools", "credentials"))
    if unknown:  # a misspelt key must not drop a requirement unseen
        raise _Malformed(f"`requires` may hold only `tools` and `credentials`, not {unknown[0][:60]!r}",
                         lines.get(f"requires.{unknown[0]}", lines.get("requires")))
    found: list[tuple[str, ...]] = []
    for key, pattern, what in (("tools", TOOL_NAME, "tool names"), ("credentials", CREDENTIAL_NAME,
                                                                    "credential names such as github.token")):
        items = requires.get(key)
        line = lines.get(f"requires.{key}", lines.get("requires"))
        if items is None:
            found.append(())
            continue
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise _Malformed(f"`requires.{key}` must be a list of {what}", line)
        if len(items) > MAX_REQUIREMENTS:
            raise _Malformed(f"`requires.{key}` names more than {MAX_REQUIREMENTS}", line)
        bad = [item for item in items if not pattern.fullmatch(item)]
        if bad:
            raise _Malformed(f"`requires.{key}`: {bad[0][:80]!r} is not one of the {what}", line)
        found.append(tuple(dict.fromkeys(items)))
    return found[0], found[1]


# -- the catalog ------------------------------------------------------------------------------------------------------


@dataclass
class _Read:
    signature: tuple[int, ...]
    skill: Skill | None
    problem: SkillProblem | None


@dataclass
class SkillCatalog:
    """Every usable skill of ``roots`` (built-in ones first: an operator's folder of the same name is refused, so
    what the bot says of itself stays true), with the problems of those left out; looked at again at most once
    every ``min_interval_s`` (``monotonic`` is the clock), and only changed SKILL.md files are read again."""

    roots: Sequence[SkillRoot]
    min_interval_s: float = 2.0
    monotonic: Callable[[], float] = time.monotonic
    _read: dict[Path, _Read] = field(default_factory=dict, repr=False)
    _skills: dict[str, Skill] = field(default_factory=dict, repr=False)
    _problems: list[SkillProblem] = field(default_factory=list, repr=False)
    _looked_at: float | None = field(default=None, repr=False)

    def skills(self) -> dict[str, Skill]:
        """The usable skills by name, as the folders hold them now (within ``min_interval_s``)."""
        self.refresh()
        return dict(self._skills)

    def get(self, name: str) -> Skill | None:
        self.refresh()
        return self._skills.get(name)

    def problems(self) -> list[SkillProblem]:
        """Why each skill left out was left out (path and line)."""
        self.refresh()
        return list(self._problems)

    def refresh(self, *, force: bool = False) -> None:
        now = self.monotonic()
        if not force and self._looked_at is not None and now - self._looked_at < self.min_interval_s:
            return
        self._looked_at = now
        skills: dict[str, Skill] = {}
        problems: list[SkillProblem] = []
        seen: set[Path] = set()
        for root in self.roots:
            names, more = _folder_names(root.path)
            if more is not None:
                problems.append(SkillProblem(root.path, None, more))
            for name in names:
                folder = root.path / name
                seen.add(folder)
                read = self._read_one(root, name)
                if read.problem is not None:
                    problems.append(read.problem)
                elif read.skill is not None and read.skill.name in skills:
                    problems.append(SkillProblem(read.skill.path, None, f"{name} is the name of a built-in skill, "
                                                                        "which is kept: rename this folder"))
                elif read.skill is not None:
                    skills[read.skill.name] = read.skill
        for gone in set(self._read) - seen:
            del self._read[gone]
        logged = {str(p) for p in self._problems}  # only what is new: an author toggling one file must not repeat all
        for problem in problems:
            if str(problem) not in logged:
                log.warning("skill left out: %s", problem)
        self._skills, self._problems = skills, problems

    def _read_one(self, root: SkillRoot, name: str) -> _Read:
        folder = root.path / name
        signature = _signature(folder)
        cached = self._read.get(folder)
        if cached is not None and cached.signature == signature:
            return cached
        try:
            read = _Read(signature, parse_skill(root, name), None)
        except _Malformed as exc:
            # lexists: False for a folder the bot may not enter (Path.exists raises PermissionError there)
            path = folder if exc.line is None and not os.path.lexists(folder / SKILL_FILE) else folder / SKILL_FILE
            read = _Read(signature, None, SkillProblem(path, exc.line, exc.text))
        self._read[folder] = read
        return read


def _folder_names(root: Path) -> tuple[list[str], str | None]:
    """The names in ``root`` that may be skills: folders (or links, judged when read), not hidden; sorted, at most
    MAX_SKILLS; and why some were left out, if any were. No more than MAX_ENTRIES names are looked at, whatever they
    are: the folder is listed every few seconds on the event loop. A missing folder holds none."""
    names: list[str] = []
    looked = 0
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                looked += 1
                if looked > MAX_ENTRIES:
                    return (sorted(names)[:MAX_SKILLS], f"holds more than {MAX_ENTRIES:,} entries: only the skills "
                            f"among the first {MAX_ENTRIES:,} looked at are read; remove what is not a skill")
                if not entry.name.startswith(".") and (entry.is_symlink() or entry.is_dir(follow_symlinks=False)):
                    names.append(entry.name)
    except OSError:
        return [], None
    if len(names) > MAX_SKILLS:
        return sorted(names)[:MAX_SKILLS], (f"holds more than {MAX_SKILLS} folders: only the first {MAX_SKILLS} by "
                                            "name are read")
    return sorted(names), None


def _signature(folder: Path) -> tuple[int, ...]:
    """What changes when the folder or its SKILL.md changes (a link re-pointed, a file written or replaced)."""
    parts: list[int] = []
    for path, follow in ((folder, False), (folder, True), (folder / SKILL_FILE, False), (folder / SKILL_FILE, True)):
        try:
            info = os.stat(path, follow_symlinks=follow)
        except OSError:
            parts += [-1] * 5
            continue
        parts += [info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, stat.S_IFMT(info.st_mode)]
    return tuple(parts)

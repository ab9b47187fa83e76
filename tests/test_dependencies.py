"""What the package needs is written down: every third-party module the code imports comes from a distribution
pyproject.toml declares (not one that only happens to arrive with another), and each lock file under
requirements/ pins a version of every requirement it should hold that the requirement allows (a pyproject
edit without a re-lock fails here)."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"core", "bot", "channels"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Where the lock files are used: CPython 3.11 on Linux (requirements/update resolves for that).
LOCKED_FOR = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
              "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
              "platform_python_implementation": "CPython"}
# What each lock file holds: the runtime dependencies and these extras (requirements/update).
LOCKS = {"run.txt": ("postgres", "anthropic", "otel"),
         "test.txt": ("postgres", "anthropic", "otel", "test", "dev")}


@functools.cache  # parsing every file takes a second: once per process
def imported_modules() -> tuple[tuple[str, Path], ...]:
    """The top-level name of every absolute import in the package's code, with the file that makes it."""
    return tuple(_imports())


def _imports() -> Iterator[tuple[str, Path]]:
    for package in sorted(FIRST_PARTY):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        yield alias.name.split(".")[0], path
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    yield node.module.split(".")[0], path


def requirements_of(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """The runtime dependencies and those of ``extras`` (a self-reference such as ``chatops-gateway[test]``
    followed into its extras), as they apply where the lock files are used."""
    found: list[Requirement] = []
    pending, seen = [None, *extras], set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        lines = PROJECT["dependencies"] if extra is None else PROJECT["optional-dependencies"][extra]
        for line in lines:
            requirement = Requirement(line)
            if canonicalize_name(requirement.name) == canonicalize_name(PROJECT["name"]):
                pending += sorted(requirement.extras)
            elif requirement.marker is None or requirement.marker.evaluate(LOCKED_FOR | {"extra": extra or ""}):
                found.append(requirement)
    return found


PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)")


def pins(lock: str) -> dict[str, str]:
    """``name==version`` lines of a lock file, by canonical name."""
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    return {canonicalize_name(m["name"]): m["version"] for m in map(PIN.match, lines) if m}


def undeclared_imports(declared: set[str]) -> dict[str, str]:
    """Each third-party module the code imports that no distribution in ``declared`` provides, and why."""
    providers = packages_distributions()
    undeclared: dict[str, str] = {}
    for module, path in imported_modules():
        if module in sys.stdlib_module_names or module in FIRST_PARTY:
            continue
        distributions = {canonicalize_name(d) for d in providers.get(module, [])}
        if not distributions & declared:
            undeclared.setdefault(module, f"{module} (imported by {path.relative_to(ROOT)}; installed from "
                                          f"{', '.join(sorted(distributions)) or 'nothing'})")
    return undeclared


def declared_for_the_package() -> set[str]:
    """What the package's code may import: the runtime dependencies and the extras the image installs (not the
    test, dev or bench tools)."""
    return {canonicalize_name(r.name) for r in requirements_of(LOCKS["run.txt"])}


def test_every_imported_third_party_module_comes_from_a_declared_distribution() -> None:
    undeclared = undeclared_imports(declared_for_the_package())
    assert not undeclared, "declare these in pyproject.toml: " + "; ".join(undeclared.values())


def test_a_module_that_arrives_only_through_another_package_is_caught() -> None:
    # yarl comes with aiohttp anyway: undeclared, the scan names it all the same.
    undeclared = undeclared_imports(declared_for_the_package() - {"yarl"})
    assert list(undeclared) == ["yarl"] and "installed from yarl" in undeclared["yarl"]


@pytest.mark.parametrize(("lock", "extras"), LOCKS.items())
def test_each_lock_pins_what_pyproject_asks_for(lock: str, extras: tuple[str, ...]) -> None:
    pinned = pins(lock)
    problems = []
    for requirement in requirements_of(extras):
        version = pinned.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name} is not in it")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}=={version} is outside {requirement.specifier}")
    assert not problems, f"requirements/{lock} is stale (run requirements/update): " + "; ".join(problems)


@pytest.mark.parametrize("lock", LOCKS)
def test_every_pin_carries_its_hashes(lock: str) -> None:
    # pip's hash-checking mode (on as soon as one pin has a hash) refuses a file where any pin has none.
    lines = (ROOT / "requirements" / lock).read_text().splitlines()
    unhashed = [line.split()[0] for line, following in zip(lines, [*lines[1:], ""], strict=True)
                if PIN.match(line) and not (line.endswith("\\") and "--hash=sha256:" in following)]
    assert not unhashed and len(pins(lock)) > 50, unhashed

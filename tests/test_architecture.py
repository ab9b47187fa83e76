"""Layering (SPEC §1: core knows no channel and no bot wiring) and the committed Slack manifests."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from channels.slack.manifest import BOT_EVENTS, BOT_SCOPES, build_manifest, render_manifest

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                names.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.add(node.module)
    return names


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}"
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in forbidden or name in forbidden or name.startswith(tuple(f"{f}." for f in forbidden)):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


def test_import_walker_sees_relative_and_absolute() -> None:
    sample = ROOT / "core" / "store" / "conversations.py"
    names = imported_modules(sample)
    assert "core.store.tables" in names and "sqlalchemy" in names


def test_core_imports_neither_channels_nor_bot() -> None:
    assert violations("core", ("channels", "bot")) == []


def test_channels_do_not_import_bot() -> None:
    assert violations("channels", ("bot",)) == []


def test_violation_detector_can_fail() -> None:
    assert violations("bot", ("core",)) != []  # bot does use core: the check does find imports


# The services behind the Gateway: a channel reaches them only through core.gateway (and reads values:
# core.model, core.views, core.events, core.errors, core.ports, core.text, core.display, core.replies).
CORE_SERVICES = ("core.dispatcher", "core.approvals", "core.credentials", "core.schedules", "core.turns",
                 "core.controls", "core.runner", "core.commands", "core.delivery", "core.leasing", "core.feedback",
                 "core.budget", "core.policies", "core.context_window", "core.connections", "core.subagents",
                 "core.approval_edits")


def test_channels_call_core_only_through_the_gateway() -> None:
    assert violations("channels", CORE_SERVICES) == []


def test_service_detector_can_fail() -> None:
    found = violations("bot", CORE_SERVICES)  # the wiring builds the services: the check sees it
    assert "bot/app.py imports core.dispatcher" in found and "bot/app.py imports core.schedules.jobs" in found


@pytest.mark.parametrize("mode", ["http", "socket"])
def test_committed_manifest_matches_code(mode: str) -> None:
    committed = (MANIFESTS / f"{mode}-mode.json").read_text(encoding="utf-8")
    assert committed == render_manifest(mode)  # type: ignore[arg-type]


def test_committed_distribution_manifest_matches_code() -> None:
    committed = (MANIFESTS / "distribution.json").read_text(encoding="utf-8")
    assert committed == render_manifest("http", distribution=True)


def test_cli_prints_socket_manifest() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bot", "manifest", "--mode", "socket"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads((MANIFESTS / "socket-mode.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("mode", ["http", "socket"])
def test_manifest_events_and_modes(mode: str) -> None:
    manifest = build_manifest(mode)  # type: ignore[arg-type]
    settings = manifest["settings"]
    events = settings["event_subscriptions"]["bot_events"]
    assert set(events) == {"app_mention", "message.channels", "message.groups", "message.im", "message.mpim",
                           "assistant_thread_started", "assistant_thread_context_changed", "agent_session_stopped"}
    features = manifest["features"]
    assert features["assistant_view"]["assistant_description"]
    assert features["shortcuts"] == [{"name": "Stop this turn", "type": "message", "callback_id": "stop_turn",
                                      "description": "Stop the bot's work in this message's thread"}]
    assert settings["socket_mode_enabled"] is (mode == "socket")
    has_url = "request_url" in settings["event_subscriptions"]
    assert has_url is (mode == "http")
    assert ("url" in manifest["features"]["slash_commands"][0]) is (mode == "http")


def test_scopes_cover_events() -> None:
    needs = {"app_mention": "app_mentions:read", "message.channels": "channels:history",
             "message.groups": "groups:history", "message.im": "im:history", "message.mpim": "mpim:history",
             "assistant_thread_started": "assistant:write", "assistant_thread_context_changed": "assistant:write",
             "agent_session_stopped": "assistant:write"}
    assert {needs[e] for e in BOT_EVENTS} <= set(BOT_SCOPES)
    assert "chat:write" in BOT_SCOPES


def test_no_table_row_crosses_into_channels_or_bot() -> None:
    """Rows stay in core (its stores and services): channels and the bot get frozen views and value types.
    Neither imports the tables, and no public function of a core module they import returns a row."""
    import re

    used: set[str] = set()
    importers = ("channels", "bot")
    imports_tables = []
    for folder in importers:
        for path in sorted((ROOT / folder).rglob("*.py")):
            names = imported_modules(path)
            imports_tables += [f"{path.relative_to(ROOT)}" for n in names if n == "core.store.tables"]
            used |= {n for n in names if n.startswith("core.") and not n.startswith("core.store")}
    assert imports_tables == []
    returns_rows = []
    for module in sorted(used):
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_") \
                    and node.returns is not None and re.search(r"\b\w+Row\b", ast.unparse(node.returns)):
                returns_rows.append(f"{module}.{node.name} -> {ast.unparse(node.returns)}")
    assert len(used) > 10  # the walk did find what they import
    assert returns_rows == []

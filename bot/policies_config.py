"""``[[policies]]`` in ``bot.toml`` (SPEC §16): approval rules, checked strictly at start."""

from __future__ import annotations

import fnmatch
import math
import re
from pathlib import Path
from typing import Any

from bot.config_file import read_config, strings
from bot.errors import SettingsError
from bot.people import is_person
from core.policies import HTTP_TOOL, NOTIFY_CHOICES, TRUST_LEVELS, Policy, PolicyAction

_KEYS = {"tool", "match", "action", "approvers", "quorum", "notify", "remind_after_s", "escalate_to", "timeout_s",
         "trust", "headers", "body"}
_ASKING_KEYS = {"approvers", "quorum", "notify", "remind_after_s", "escalate_to", "timeout_s"}
MAX_QUORUM = 20
MAX_WAIT_S = 7 * 24 * 3600  # a week: longer is surely a slip (a value in ms)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # no header holds these (bot/tools/http.py refuses them)


def load_policies(path: Path) -> list[Policy]:
    data = read_config(path)
    if "policies" not in data:
        return []
    entries = data["policies"]
    if not isinstance(entries, list):
        raise SettingsError(f"{path}: [[policies]] must be an array of tables")
    return [_policy(f"{path}: policies[{index}]", index + 1, entry) for index, entry in enumerate(entries)]


def _policy(where: str, number: int, entry: Any) -> Policy:
    if not isinstance(entry, dict):
        raise SettingsError(f"{where} must be a table")
    unknown = set(entry) - _KEYS
    if unknown:
        raise SettingsError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    tool = entry.get("tool")
    if not isinstance(tool, str) or not tool.strip():
        raise SettingsError(f"{where}.tool must be a tool name or a glob such as 'shell_*'")
    match = entry.get("match")
    if match is not None and (not isinstance(match, str) or not match):
        raise SettingsError(f"{where}.match must be a non-empty glob over the call's text")
    try:
        action = PolicyAction(entry.get("action", "ask"))
    except ValueError:
        raise SettingsError(f"{where}.action must be one of ask, allow, deny") from None
    asking = sorted(set(entry) & _ASKING_KEYS)
    if action is not PolicyAction.ASK and asking:
        raise SettingsError(f"{where}: {', '.join(asking)} only apply to rules that ask (action = 'ask')")
    approvers = tuple(_people(where, "approvers", entry.get("approvers", [])))
    escalate_to = tuple(_people(where, "escalate_to", entry.get("escalate_to", [])))
    quorum = entry.get("quorum", 1)
    if type(quorum) is not int or not 1 <= quorum <= MAX_QUORUM:
        raise SettingsError(f"{where}.quorum must be a whole number from 1 to {MAX_QUORUM}")
    # Admins may vote too, but a quorum should not need them: each named entry is one person (a group: many).
    groups = any(a.rpartition(":")[2].startswith("S") for a in approvers)  # "S1" or "slack:S1"
    if quorum > 1 and approvers and not groups and quorum > len(set(approvers)):
        raise SettingsError(f"{where}.quorum is {quorum}, but only {len(set(approvers))} approvers are named: "
                            "it could never be reached")
    notify = tuple(strings(where, "notify", entry.get("notify", ["thread"])))
    if not notify or any(n not in NOTIFY_CHOICES for n in notify):
        raise SettingsError(f"{where}.notify must list {' and/or '.join(NOTIFY_CHOICES)}")
    trust = tuple(strings(where, "trust", entry.get("trust", [])))
    if not trust and "trust" in entry:
        raise SettingsError(f"{where}.trust is empty: list the sender levels it applies to, or remove it")
    if any(t not in TRUST_LEVELS for t in trust):
        raise SettingsError(f"{where}.trust must list levels among {', '.join(TRUST_LEVELS)}")
    headers = _header_globs(where, entry.get("headers"))
    body = entry.get("body")
    if body is not None and (not isinstance(body, str) or not body):
        raise SettingsError(f"{where}.body must be a non-empty glob over the request body, e.g. '{{\"q\": *}}'")
    if (headers or body is not None) and not fnmatch.fnmatchcase(HTTP_TOOL, tool.strip()):
        raise SettingsError(f"{where}: headers and body apply only to http_request calls, and tool {tool!r} "
                            "does not match it")
    remind_after_s = _seconds(where, "remind_after_s", entry.get("remind_after_s"))
    timeout_s = _seconds(where, "timeout_s", entry.get("timeout_s"))
    if remind_after_s is not None and timeout_s is not None and remind_after_s >= timeout_s:
        raise SettingsError(f"{where}.remind_after_s ({remind_after_s:g}) must be below timeout_s ({timeout_s:g}): "
                            "the request would expire first")
    if escalate_to and remind_after_s is None:
        raise SettingsError(f"{where}.escalate_to needs remind_after_s: they join the approvers at the reminder")
    return Policy(tool=tool.strip(), number=number, match=match, action=action, approvers=approvers,
                  quorum=quorum, notify=tuple(dict.fromkeys(notify)), escalate_to=escalate_to,
                  remind_after_s=remind_after_s,
                  timeout_s=timeout_s, trust=trust, headers=headers, body=body)


def _header_globs(where: str, value: Any) -> tuple[str, ...]:
    """``headers``: globs over one header's ``Name: value`` (core.policies matches names in any case)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SettingsError(f"{where}.headers must be a list of globs over one header's 'Name: value', "
                            "e.g. [\"Accept: *\"]")
    if not value:
        raise SettingsError(f"{where}.headers is empty: list the headers the rule covers (e.g. \"Accept: *\"), "
                            "or remove it")
    for glob in value:
        name, colon, _ = glob.partition(":")
        if not colon or not name.strip():
            raise SettingsError(f"{where}.headers: {glob!r} is not 'Name: value' (a glob for each, e.g. "
                                "\"Accept: *\" or \"X-Request-Id: *\")")
        if _CONTROL.search(glob):
            raise SettingsError(f"{where}.headers: {glob!r} holds a line break or another control character, "
                                "which no header can")
    return tuple(value)


def _people(where: str, key: str, value: Any) -> list[str]:
    people = strings(where, key, value)
    for person in people:
        if not is_person(person):
            raise SettingsError(f"{where}.{key}: {person!r} is not a user id, group id, 'requester', 'web' "
                                "or <channel>:<id>")
    return people


def _seconds(where: str, key: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_WAIT_S:
        raise SettingsError(f"{where}.{key} must be a number of seconds above 0 and at most {MAX_WAIT_S}")
    return float(value)

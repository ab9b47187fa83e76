"""Approval policies (SPEC §16 ``[[policies]]``): which tool calls run, which are refused, and which ask whom.

Rules are read in order and the first that matches a call decides it; with none, the tool's built-in risk
does (gated tools ask, safe ones run). A rule matches on the tool's name (a name or a glob), optionally on
the call's canonical text (``core.tools.canonical_text``) and on the sender's trust level. For
``shell_run`` an ``allow`` rule matches only a plain simple command (``core.shell_syntax``), so a glob
such as ``echo allowed-*`` never lets ``echo allowed-2; rm x`` through; a ``deny`` rule is checked against
every simple command inside a compound line.
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass
from typing import Any

from yarl import URL

from core.shell_syntax import command_variants, simple_command
from core.tools import Risk, canonical_text

SHELL_TOOL = "shell_run"
# Arguments that hand a call a secret: an allow rule never lets such a call run unasked (its text does not
# show them, and a person approving the call sees them on the card).
SECRET_ARGUMENTS = ("credential", "credentials", "connection")
NOTIFY_CHOICES = ("thread", "dm")
TRUST_LEVELS = ("admin", "member", "guest", "external", "bot")


class PolicyAction(enum.StrEnum):
    ASK = "ask"
    ALLOW = "allow"
    DENY = "deny"


@dataclass(frozen=True)
class Policy:
    """One ``[[policies]]`` rule. ``number``: its place in the file, from 1 (what a ruling names)."""

    tool: str
    number: int = 1
    match: str | None = None
    action: PolicyAction = PolicyAction.ASK
    approvers: tuple[str, ...] = ()  # empty: the agent's (or BOT_APPROVERS)
    quorum: int = 1
    notify: tuple[str, ...] = ("thread",)
    remind_after_s: float | None = None
    escalate_to: tuple[str, ...] = ()
    timeout_s: float | None = None  # None: APPROVAL_TIMEOUT_S
    trust: tuple[str, ...] = ()  # empty: every sender

    def describe(self) -> str:
        where = f" matching {self.match!r}" if self.match is not None else ""
        who = f" from {', '.join(self.trust)} senders" if self.trust else ""
        return f"rule {self.number} ({self.action} {self.tool!r}{where}{who})"


@dataclass(frozen=True)
class Ruling:
    """How a call is decided: ``action`` ask/allow/deny, by ``policy`` (None: the tool's built-in risk)."""

    action: PolicyAction
    policy: Policy | None
    why: str


class PolicyBook:
    def __init__(self, policies: list[Policy] | tuple[Policy, ...] = ()) -> None:
        self.policies = tuple(policies)

    def __bool__(self) -> bool:
        return bool(self.policies)

    def rule(self, tool: str, args: dict[str, Any], *, risk: Risk, trust: str | None = None) -> Ruling:
        """The ruling on one call. ``trust``: the sender's level (None when unknown: only rules that name no
        trust level apply)."""
        texts = policy_texts(tool, args)
        notes: list[str] = []
        for policy in self.policies:
            if not fnmatch.fnmatchcase(tool, policy.tool) or (policy.trust and trust not in policy.trust):
                continue
            matched, how = _matches(policy, tool, texts, args)
            if matched:
                return Ruling(policy.action, policy, "; ".join([*notes, f"{policy.describe()} decides: {how}"]))
            if how:
                notes.append(f"{policy.describe()} does not apply: {how}")
        action = PolicyAction.ASK if risk is Risk.GATED else PolicyAction.ALLOW
        verb = "asks" if action is PolicyAction.ASK else "runs"
        return Ruling(action, None, "; ".join([*notes, f"no rule matches: {tool} is {risk.value}, so it {verb}"]))


def policy_texts(tool: str, args: dict[str, Any]) -> tuple[str, ...]:
    """The call's canonical text, and the same as it will act when that differs: an ``http_request`` URL as
    it is sent (host lowercased, default port dropped, ``..`` and escapes resolved), a ``message_send``
    channel name lowercased (as Slack reads it), whole numbers written as such (``7.0`` → ``7``)."""
    args = _whole_numbers(args)
    texts = [canonical_text(tool, args)]
    if tool == "http_request" and isinstance(args.get("url"), str):
        try:
            sent = str(URL(args["url"]))
        except (ValueError, TypeError):
            sent = args["url"]
        texts.append(canonical_text(tool, {**args, "url": sent}))
    if tool == "message_send" and isinstance(args.get("channel"), str):
        texts.append(canonical_text(tool, {**args, "channel": args["channel"].lower()}))
    return tuple(dict.fromkeys(texts))


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _matches(policy: Policy, tool: str, texts: tuple[str, ...], args: dict[str, Any]) -> tuple[bool, str]:
    """Whether the rule's ``match`` covers the call, and how (or, for a refused match, why not). ``texts``:
    the call's text as written first, then as it acts (``policy_texts``). A deny rule matches if any of
    them does; an allow rule only if all of them do."""
    text = texts[0]
    if policy.action is PolicyAction.ALLOW and any(args.get(name) for name in SECRET_ARGUMENTS):
        hit = policy.match is None or all(fnmatch.fnmatchcase(t, policy.match) for t in texts)
        return False, "the call hands a credential to the tool, which an allow rule never lets run unasked" \
            if hit else ""
    if policy.match is None:
        return True, "it covers every call of the tool"
    if tool != SHELL_TOOL:
        if policy.action is PolicyAction.ALLOW:
            hit = all(fnmatch.fnmatchcase(t, policy.match) for t in texts)
        else:
            hit = any(fnmatch.fnmatchcase(t, policy.match) for t in texts)
        return (True, f"{text!r} matches") if hit else (False, "")
    if policy.action is PolicyAction.ALLOW:
        if not simple_command(text):
            hit = fnmatch.fnmatchcase(text, policy.match)
            # Only worth saying when the glob would have matched: it is why this call still asks.
            return False, ("the command is not one plain command (operators, redirections, substitutions, "
                           "expansions, a pattern for a program, or several lines), which an allow rule never "
                           "matches") if hit else ""
        return (True, f"{text!r} matches") if fnmatch.fnmatchcase(text, policy.match) else (False, "")
    for variant in command_variants(text):
        if fnmatch.fnmatchcase(variant, policy.match):
            return True, f"{variant!r} matches" if variant == text.strip() else f"the command {variant!r} in it matches"
    return False, ""

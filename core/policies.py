"""Approval policies (SPEC §16 ``[[policies]]``): which tool calls run, which are refused, and which ask whom.

Rules are read in order and the first that matches a call decides it; with none, the tool's built-in risk
does (gated tools ask, safe ones run). A rule matches on the tool's name (a name or a glob), optionally on
the call's canonical text (``core.tools.canonical_text``) and on the sender's trust level. For
``shell_run`` an ``allow`` rule matches only a plain simple command (``core.shell_syntax``), so a glob
such as ``echo allowed-*`` never lets ``echo allowed-2; rm x`` through; a ``deny`` rule is checked against
every simple command inside a compound line.

``http_request``'s text is ``METHOD URL``; what else it sends is covered by a rule's ``headers`` (globs over one
header's ``Name: value``, names in any case) and ``body`` (a glob). For an ``allow`` rule they are what it
permits: a call carrying a header or a body the rule does not name is not run unasked. For ``deny`` and ``ask``
rules they narrow the calls the rule matches (``headers = ["Cookie: *"]``: calls that carry a cookie). An
``allow`` rule whose text matches a call it will not run (a compound command, a credential, unnamed headers or
body) leaves it to a later ``deny`` or ``ask`` rule, never to a later ``allow`` rule: with none, it is asked.
"""

from __future__ import annotations

import enum
import fnmatch
from dataclasses import dataclass
from typing import Any

from yarl import URL

from core.shell_syntax import command_variants, simple_command
from core.tools import Risk, canonical_call, canonical_text

SHELL_TOOL = "shell_run"
# The one tool whose matched text leaves out what it sends besides the method and URL: headers and a body. (Every
# other tool's text is all its arguments.)
HTTP_TOOL = "http_request"
# Arguments that hand a call a secret: an allow rule never lets such a call run unasked (its text does not
# show them, and a person approving the call sees them on the card).
SECRET_ARGUMENTS = ("credential", "credentials", "connection")
NOTIFY_CHOICES = ("thread", "dm")
TRUST_LEVELS = ("admin", "member", "guest", "external", "bot")
DURING_FREEZE = ("refuse", "ask")  # a rule's during_freeze (core.freeze_gate)


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
    headers: tuple[str, ...] = ()  # globs over one header's "Name: value" (http_request); empty: names none
    body: str | None = None  # a glob over the request body (http_request); None: names none
    # Offers Always allow / Allow in this thread on the rule's requests (quorum 1 only), each grant lasting this long
    # and covering later calls under this same rule (core.grants); None: the rule's requests record no grant.
    grant_ttl_s: float | None = None
    during_freeze: str = "refuse"  # DURING_FREEZE: during a change freeze its calls are refused, or asked (admins)
    self_approval: bool | None = None  # may a sender of the turn approve it (None: BOT_SELF_APPROVAL)
    step_up: bool = False  # an approval counts once the approver confirms it with a passkey (core.passkeys)

    def describe(self) -> str:
        where = f" matching {self.match!r}" if self.match is not None else ""
        if self.headers:
            where += f" with headers {', '.join(repr(h) for h in self.headers)}"
        if self.body is not None:
            where += f" with body {self.body!r}"
        who = f" from {', '.join(self.trust)} senders" if self.trust else ""
        return f"rule {self.number} ({self.action} {self.tool!r}{where}{who})"


@dataclass(frozen=True)
class Payload:
    """What an ``http_request`` call sends besides ``METHOD URL``. ``headers``: (name, value) pairs, None when
    they are not a table of names and values (no allow rule covers them); ``body``: None when there is none."""

    headers: tuple[tuple[str, str], ...] | None = ()
    body: str | None = None

    @classmethod
    def of(cls, tool: str, args: dict[str, Any]) -> Payload:
        if tool != HTTP_TOOL:
            return cls()
        raw_headers, raw_body = args.get("headers"), args.get("body")
        headers: tuple[tuple[str, str], ...] | None = ()
        if isinstance(raw_headers, dict):
            headers = tuple((str(name), str(value)) for name, value in raw_headers.items())
        elif raw_headers:
            headers = None
        body = None if raw_body is None or raw_body == "" else \
            raw_body if isinstance(raw_body, str) else canonical_call({"body": raw_body})
        return cls(headers, body)


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
        payload = Payload.of(tool, args)
        notes: list[str] = []
        declined = False  # an allow rule's text matched a call it will not run
        for policy in self.policies:
            if not fnmatch.fnmatchcase(tool, policy.tool) or (policy.trust and trust not in policy.trust):
                continue
            if declined and policy.action is PolicyAction.ALLOW:
                continue  # the first allow rule that matched turned it down: a looser one later does not run it
            matched, how = _matches(policy, tool, texts, args, payload)
            if matched:
                return Ruling(policy.action, policy, "; ".join([*notes, f"{policy.describe()} decides: {how}"]))
            if how:
                notes.append(f"{policy.describe()} does not apply: {how}")
                declined = declined or policy.action is PolicyAction.ALLOW
        if declined and risk is not Risk.GATED:
            return Ruling(PolicyAction.ASK, None, "; ".join([*notes, "no other rule decides it, so it asks"]))
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


def _matches(policy: Policy, tool: str, texts: tuple[str, ...], args: dict[str, Any],
             payload: Payload) -> tuple[bool, str]:
    """Whether the rule covers the call, and how (or, for an allow rule whose text matches a call it will not
    run, why not)."""
    if policy.action is not PolicyAction.ALLOW:
        carried = _carried(policy, payload)
        if carried is None:
            return False, ""
        matched, how = _text_matches(policy, tool, texts, args)
        if matched and carried:
            how = carried if policy.match is None else f"{how}, and {carried}"
        return matched, how
    matched, how = _text_matches(policy, tool, texts, args)
    if matched and (uncovered := _uncovered(policy, payload)):
        return False, uncovered
    return matched, how


def _text_matches(policy: Policy, tool: str, texts: tuple[str, ...], args: dict[str, Any]) -> tuple[bool, str]:
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


def _header_matches(glob: str, name: str, value: str, *, every: bool) -> bool:
    """Whether one header is one the glob ``Name: value`` names. Names are matched in lower case (HTTP reads them
    in any case), the value as written and as a server reads it (spaces around it dropped): an allow rule
    (``every``) needs both to match, a deny or ask rule either."""
    name_glob, _, value_glob = glob.partition(":")
    if not fnmatch.fnmatchcase(name.lower(), name_glob.strip().lower()):
        return False
    value_glob = value_glob.strip(" \t")
    forms = (fnmatch.fnmatchcase(form, value_glob) for form in (value, value.strip(" \t")))
    return all(forms) if every else any(forms)


def _uncovered(policy: Policy, payload: Payload) -> str:
    """What an http_request call carries that an allow rule does not name ("" for nothing): it is not run unasked."""
    if payload.headers is None:
        return "the call's headers are not a table of names and values"
    why = "(an allow rule covers only the headers and body it names)"
    for name, value in payload.headers:
        if not any(_header_matches(glob, name, value, every=True) for glob in policy.headers):
            # The name only: a header's value may be a secret (a cookie), and this text is shown and logged.
            return f"the call carries a header {name!r}, which the rule does not name {why}"
    if payload.body is not None:
        if policy.body is None:
            return f"the call carries a body, which the rule does not name {why}"
        if not fnmatch.fnmatchcase(payload.body, policy.body):
            return f"the call's body does not match the rule's body {policy.body!r} {why}"
    return ""


def _carried(policy: Policy, payload: Payload) -> str | None:
    """Whether a deny or ask rule's ``headers`` and ``body`` hold for the call (each that it names must): a
    header matching one of its globs, a body matching its glob. None: they do not; "": it names neither; else
    what the call carries that they name. Unreadable headers count as matching (refused or asked, not let by)."""
    found: list[str] = []
    if policy.headers:
        if payload.headers is None:
            found.append("the call's headers are not a table of names and values")
        else:
            hit = next((glob for glob in policy.headers for name, value in payload.headers
                        if _header_matches(glob, name, value, every=False)), None)
            if hit is None:
                return None
            found.append(f"the call carries a header matching {hit!r}")
    if policy.body is not None:
        if payload.body is None or not fnmatch.fnmatchcase(payload.body, policy.body):
            return None
        found.append(f"its body matches {policy.body!r}")
    return ", and ".join(found)

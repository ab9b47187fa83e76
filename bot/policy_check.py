"""``bot policies check TOOL TEXT [--header 'Name: value']… [--body TEXT]``: which ``[[policies]]`` rule decides a
call, and why (a dry run); and the warning (there, in ``bot doctor`` and at start) about ``shell_run`` allow
rules whose glob admits flags that make a well-known program load a file."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable
from typing import Any

from bot.config.file import load_config
from bot.errors import BotError, SettingsError
from bot.self_approval_check import self_approval_warnings, unsatisfiable_setup
from bot.settings import load_settings
from bot.tools.http import header_problem
from core.grant_keys import grants_cover
from core.grants import lasting
from core.policies import SHELL_TOOL, Policy, PolicyAction, PolicyBook
from core.shell_syntax import simple_command
from core.tools import Risk

# The built-in tools' risk (a plugin's is its own: pass --risk).
BUILTIN_RISK = {"shell_run": Risk.GATED, "http_request": Risk.GATED, "message_send": Risk.GATED,
                "schedule_create": Risk.GATED, "time_now": Risk.SAFE, "schedule_list": Risk.SAFE,
                "schedule_cancel": Risk.SAFE, "credential_request": Risk.SAFE}


# Flags that make a program load a file (a config, manifests, values, plugins, a program to run): an earlier,
# approved command may have left one in the work folder, and an allow rule would then run it unasked. "Global"
# flags count only right after the program's name (before its subcommand); the others anywhere. Not a complete
# list: a warning for the common ways in, never a guarantee.
LOADING_FLAGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # program: (anywhere, global only)
    "kubectl": (("--kubeconfig", "-f", "--filename", "-k", "--kustomize"), ()),
    # after the subcommand: programs to run (grep -O, fetch/ls-remote/clone --upload-pack or -u, push
    # --receive-pack/--exec) and a template or config for a new repository (clone)
    "git": (("-O", "--open-files-in-pager", "--upload-pack", "-u", "--receive-pack", "--exec", "--template",
             "--config"),
            ("-c", "--config-env", "--exec-path", "-C", "--git-dir", "--work-tree")),
    "helm": (("--kubeconfig", "-f", "--values", "--post-renderer", "--repository-config", "--registry-config"), ()),
    "npm": (("--userconfig", "--globalconfig", "--prefix", "--script-shell"), ()),
    "terraform": (("-var-file", "-plugin-dir"), ("-chdir",)),
}
_CLASS = re.compile(r"\[!?\]?[^\]]*\]")  # a glob's character class, as fnmatch reads it


def loading_flags(policy: Policy) -> tuple[str, tuple[str, ...]] | None:
    """For a ``shell_run`` allow rule whose glob admits any of a well-known program's file-loading flags: the
    program and those flags, in LOADING_FLAGS' order (global ones last). A ``*`` matches any words, so every
    ``*`` after the program's name admits them."""
    if policy.action is not PolicyAction.ALLOW or policy.match is None \
            or not fnmatch.fnmatchcase(SHELL_TOOL, policy.tool):
        return None
    # A character class or a "?" stands for one character the glob admits: one it admits takes its place, so
    # "kubectl get [a-z]*" is read as "kubectl get a*" (and admits "kubectl get a --kubeconfig=x").
    plain = _CLASS.sub(lambda found: _admitted(found.group()), policy.match.strip()).replace("?", "a")
    head, _, rest = plain.partition(" ")
    if head.endswith("*"):  # "git*": the star takes the space and whatever follows
        head, rest = head[:-1], f"*{rest}"
    program = head.rsplit("/", 1)[-1]
    if program not in LOADING_FLAGS or "*" not in rest:
        return None
    anywhere, global_only = LOADING_FLAGS[program]
    found = [flag for flag in anywhere if _admits(policy.match, head, rest, flag, first=False)]
    found += [flag for flag in global_only if _admits(policy.match, head, rest, flag, first=True)]
    found = list(dict.fromkeys(found))
    return (program, tuple(found)) if found else None


def _admitted(char_class: str) -> str:
    """One character ``char_class`` (``[a-z]``, ``[!0-9]``) matches, preferring a letter; itself when none does."""
    return next((c for c in "abcdefghijklmnopqrstuvwxyz0123456789-_./=" if fnmatch.fnmatchcase(c, char_class)),
                char_class)


def _admits(glob: str, head: str, rest: str, flag: str, *, first: bool) -> bool:
    """Whether the glob matches a plain command carrying ``flag`` as a word in place of one of its ``*`` (only
    the first thing after the program's name, with ``first``)."""
    stars = [i for i, c in enumerate(rest) if c == "*"]
    for at in stars[:1] if first else stars:
        if first and rest[:at].strip():
            return False
        words = rest[:at].replace("*", "") + f" {flag} x " + rest[at + 1:].replace("*", "")
        candidate = f"{head} {' '.join(words.split())}"
        if simple_command(candidate) and fnmatch.fnmatchcase(candidate, glob.strip()):  # as the rule would match
            return True
    return False


def flag_warnings(policies: Iterable[Policy]) -> list[str]:
    """One line per allow rule that would run a well-known program with a file-loading flag unasked, and per rule
    whose grant_ttl_s offers nothing (a quorum: a grant stands for one person's decision, never several)."""
    lines = []
    for policy in policies:
        if policy.grant_ttl_s is not None and policy.quorum > 1:
            lines.append(f"{policy.describe()} sets grant_ttl_s, but its quorum is {policy.quorum}: its requests "
                         "offer no grant (a grant stands for one person's decision), so grant_ttl_s does nothing")
        found = loading_flags(policy)
        if found is not None:
            program, flags = found
            lines.append(f"{policy.describe()} also lets {program} run unasked with {', '.join(flags)}, which load "
                         "a file that an earlier, approved command may have left in the work folder: allow the exact "
                         "commands instead, or put a deny rule for those flags before it")
    return lines


def grants_offered(policy: Policy | None) -> str:
    """What a request asked under ``policy`` (None: no rule) offers besides Approve and Deny (core.grants)."""
    if not grants_cover(policy):
        return "none (Always allow and Allow in this thread need grant_ttl_s and quorum 1 on a rule)"
    lasting_for = f"each for {lasting(policy.grant_ttl_s)}" if policy is not None and policy.grant_ttl_s else "for good"
    return f"Always allow (this channel) and Allow in this thread, {lasting_for}"


def call_arguments(tool: str, text: str) -> dict[str, Any]:
    """The arguments whose canonical text is ``text`` (core.tools.canonical_text, read backwards)."""
    if tool == "shell_run":
        return {"command": text}
    if tool == "http_request":
        method, _, url = text.strip().partition(" ")
        if not url:
            raise BotError("for http_request, TEXT is 'METHOD URL', e.g. 'GET https://api.example.com/health'")
        return {"method": method.upper(), "url": url.strip()}
    if tool == "message_send":
        channel, _, body = text.strip().partition(" ")
        return {"channel": channel, "text": body}
    try:
        args = json.loads(text)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise BotError(f"for {tool}, TEXT is its arguments as a JSON object, e.g. '{{\"name\": \"x\"}}'")
    return args


def with_payload(tool: str, args: dict[str, Any], headers: list[str], body: str | None) -> dict[str, Any]:
    """``args`` with the headers (each ``Name: value``) and body an http_request call would send."""
    if not headers and body is None:
        return args
    if tool != "http_request":
        raise BotError("--header and --body are what an http_request call sends; other tools have neither")
    table: dict[str, str] = {}
    for line in headers:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise BotError(f"--header {line!r}: write it as 'Name: value', e.g. 'Accept: application/json'")
        table[name.strip()] = value.strip()
    if (problem := header_problem(table)) is not None:
        raise BotError(f"--header: {problem}")
    return {**args, **({"headers": table} if table else {}), **({"body": body} if body is not None else {})}


def check_command(tool: str, text: str, risk: str | None, headers: list[str] | None = None,
                  body: str | None = None) -> int:
    args = with_payload(tool, call_arguments(tool, text), headers or [], body)
    settings = load_settings()
    toml = load_config(settings.bot_config)
    book = PolicyBook(toml.policy_list())
    assumed = ""
    if risk is not None:
        level = Risk(risk)
    elif tool in BUILTIN_RISK:
        level = BUILTIN_RISK[tool]
    else:
        level, assumed = Risk.GATED, f" ({tool} is not a built-in tool: taken as gated; pass --risk safe if not)"
    ruling = book.rule(tool, args, risk=level)
    print(f"{ruling.action.upper()}: {ruling.why}{assumed}")
    policy = ruling.policy
    if ruling.action is PolicyAction.ASK:
        who = ", ".join(policy.approvers) if policy is not None and policy.approvers else \
            "the agent's approvers (or BOT_APPROVERS)"
        print(f"  asks: {who}; quorum {policy.quorum if policy else 1}; "
              f"notify {', '.join(policy.notify) if policy else 'thread'}; timeout "
              f"{f'{policy.timeout_s:g} s' if policy and policy.timeout_s else 'APPROVAL_TIMEOUT_S'}")
        print(f"  grants: {grants_offered(policy)}")
    if not book.policies:
        print(f"  ({settings.bot_config} has no [[policies]])")
    for line in [*flag_warnings(book.policies), *self_approval_warnings(settings, book.policies)]:
        print(f"warning: {line}")
    if stuck := unsatisfiable_setup(settings, book.policies, toml.agent_list(settings.bot_instructions)):
        raise SettingsError("; ".join(stuck))  # `bot run` refuses to start with it
    return 0

"""``bot policies check TOOL TEXT [--header 'Name: value']… [--body TEXT]``: which ``[[policies]]`` rule decides a
call, and why (a dry run)."""

from __future__ import annotations

import json
from typing import Any

from bot.errors import BotError
from bot.policies_config import load_policies
from bot.settings import load_settings
from bot.tools.http import header_problem
from core.policies import PolicyAction, PolicyBook
from core.tools import Risk

# The built-in tools' risk (a plugin's is its own: pass --risk).
BUILTIN_RISK = {"shell_run": Risk.GATED, "http_request": Risk.GATED, "message_send": Risk.GATED,
                "schedule_create": Risk.GATED, "time_now": Risk.SAFE, "schedule_list": Risk.SAFE,
                "schedule_cancel": Risk.SAFE, "credential_request": Risk.SAFE}


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
    book = PolicyBook(load_policies(settings.bot_config))
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
    if not book.policies:
        print(f"  ({settings.bot_config} has no [[policies]])")
    return 0

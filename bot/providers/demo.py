"""The offline demo agent: deterministic, no network, understands a few plain phrases (SPEC §6)."""

from __future__ import annotations

import json
import re
from itertools import count

from core.providers import ChatMessage, Completion, CompletionRequest, ToolCall

HELP = (
    "I'm the demo agent: no language model is configured, so I only understand a few phrases — "
    "\"what time is it\", \"run `uptime`\", \"I need a token for github\", "
    "\"every 5 minutes post 'hi' to #ops\". To talk to a real model, set LLM_BASE_URL, LLM_API_KEY "
    "and LLM_MODEL (any OpenAI-compatible endpoint) and restart."
)

_RUN = re.compile(r"\brun\s+`([^`]+)`", re.IGNORECASE)
_TOKEN = re.compile(r"\bneed (?:a |an )?(?:token|credential|secret|key) for ([A-Za-z][\w.-]{0,40})", re.IGNORECASE)
_EVERY = re.compile(r"\bevery (\d+) (second|minute|hour)s?\b.*?\bpost\s+['\"‘“](.+?)['\"’”]\s+to\s+(#[\w-]+|C\w+)",
                    re.IGNORECASE)
_TIME = re.compile(r"\b(what time|time is it|the time|current time|date today)\b", re.IGNORECASE)


class DemoProvider:
    name = "demo"

    def __init__(self) -> None:
        self._ids = count(1)

    async def complete(self, request: CompletionRequest) -> Completion:
        last = request.messages[-1] if request.messages else ChatMessage("user", "")
        if last.role == "tool":
            return Completion(content=self._after_tool(request.messages, last))
        text = last.content if last.role == "user" else ""
        tools = {t["function"]["name"] for t in request.tools}
        for wanted, args, reason in self._intents(text):
            if wanted in tools:
                return Completion(content="", tool_calls=(self._call(wanted, args),))
            return Completion(content=f"I would use the `{wanted}` tool for that ({reason}), "
                                      "but it isn't available to me here.")
        return Completion(content=f"You said: {text.strip()[:500]}\n\n{HELP}" if text.strip() else HELP)

    @staticmethod
    def _after_tool(messages: list[ChatMessage], result: ChatMessage) -> str:
        called = next((c.name for m in reversed(messages) for c in m.tool_calls if c.id == result.tool_call_id), "")
        if result.content.startswith("error:"):
            return f"That didn't work — {result.content.removeprefix('error:').strip()}"
        if called == "time_now":
            return f"It is {result.content}."
        return f"Done. `{called or 'the tool'}` said:\n```\n{result.content}\n```"

    def _call(self, name: str, args: dict[str, object]) -> ToolCall:
        return ToolCall(id=f"demo-{next(self._ids)}", name=name, arguments=json.dumps(args))

    @staticmethod
    def _intents(text: str) -> list[tuple[str, dict[str, object], str]]:
        found: list[tuple[str, dict[str, object], str]] = []
        if m := _EVERY.search(text):
            seconds = int(m.group(1)) * {"second": 1, "minute": 60, "hour": 3600}[m.group(2).lower()]
            found.append(("schedule_create",
                          {"prompt": f"Say '{m.group(3)}'", "every_seconds": seconds, "destination": m.group(4)},
                          "to schedule it"))
        elif m := _RUN.search(text):
            found.append(("shell_run", {"command": m.group(1)}, "to run a command"))
        elif m := _TOKEN.search(text):
            name = m.group(1).lower().rstrip(".")
            found.append(("credential_request",
                          {"name": f"{name}.token", "reason": f"to call {name} on your behalf"},
                          "to ask for a secret"))
        elif _TIME.search(text):
            found.append(("time_now", {}, "to read the clock"))
        return found

"""Core's requests in the Messages API's terms, and its answers (whole or streamed) back in core's.

Core speaks in OpenAI's shapes: tools are ``{"type": "function", "function": {...}}`` specs, an assistant's
calls ride on its message and each result is a message of role ``tool``. Anthropic wants tools with an
``input_schema``, ``tool_use`` blocks in the assistant's content, the results as ``tool_result`` blocks in
the next user message (first in it), and strictly alternating roles: adjacent messages of one role are
merged. The stable prefix (the instructions, the tool list) is marked for prompt caching.
"""

from __future__ import annotations

import json
import re
from typing import Any

from core.errors import ProviderError
from core.providers import ChatMessage, Completion, CompletionRequest, ToolCall
from core.text import clean_text

CACHED = {"type": "ephemeral"}
_DATA_URI = re.compile(r"data:(image/(?:png|jpeg|gif|webp));base64,(.*)", re.DOTALL)  # what the API takes
_BAD_ID = re.compile(r"[^A-Za-z0-9_-]")


def body(model: str, max_tokens: int, request: CompletionRequest) -> dict[str, Any]:
    """The keyword arguments of ``messages.create`` for ``request``."""
    if request.max_output_tokens is not None:
        max_tokens = min(max_tokens, request.max_output_tokens)
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": messages(request.messages)}
    if request.instructions.strip():
        out["system"] = [{"type": "text", "text": request.instructions, "cache_control": CACHED}]
    if request.tools:
        out["tools"] = tools(request.tools)
    return out


def tools(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style function specs as Anthropic tools; the last one closes the cached prefix."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        function = spec.get("function", spec) if isinstance(spec, dict) else {}
        tool: dict[str, Any] = {
            "name": function.get("name", ""),
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            tool["description"] = function["description"]
        out.append(tool)
    if out:
        out[-1] = {**out[-1], "cache_control": CACHED}
    return out


def messages(history: list[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation with alternating roles, starting with the user's."""
    out: list[dict[str, Any]] = []
    for m in history:
        role = "assistant" if m.role == "assistant" else "user"  # a tool's result goes back as the user's
        blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for message in out:  # a user message's tool results come first in it (the API's rule)
        if message["role"] == "user":
            message["content"].sort(key=lambda block: block["type"] != "tool_result")
    if not out or out[0]["role"] != "user":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": "(the conversation so far)"}]})
    return out


def _blocks(m: ChatMessage) -> list[dict[str, Any]]:
    if m.role == "tool":
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": tool_id(m.tool_call_id or "")}
        if m.content:
            result["content"] = m.content
        return [result]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content.strip() else []
    if m.role == "assistant":
        blocks += [{"type": "tool_use", "id": tool_id(c.id), "name": c.name, "input": _input(c.arguments)}
                   for c in m.tool_calls]
        return blocks
    blocks += [image for url in m.images if (image := _image(url)) is not None]
    return blocks or [{"type": "text", "text": "(empty message)"}]


def tool_id(ident: str) -> str:
    """A call id as the API takes it (letters, digits, ``_`` and ``-``): the same for a call and its result."""
    return _BAD_ID.sub("_", ident) or "call"


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments (JSON text) as the object ``tool_use.input`` must be."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _image(url: str) -> dict[str, Any] | None:
    if url.startswith("data:"):
        match = _DATA_URI.fullmatch(url)
        if match is None:
            return None  # not a base64 image: nothing the API takes
        return {"type": "image", "source": {"type": "base64", "media_type": match[1], "data": match[2]}}
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    return None


def usage_total(usage: Any) -> int | None:
    """Every token a call counted: input (cache writes and reads included) and output."""
    total = 0
    for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"):
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            total += value
    return total if 0 < total < 10**7 else None  # zero or absurd: estimated instead (as for OpenAI)


def usage_split(usage: Any) -> tuple[int | None, int | None]:
    """(input, output) tokens: the input with cache writes and reads, as ``usage_total`` counts them."""
    def count(names: tuple[str, ...]) -> int | None:
        total = 0
        for name in names:
            value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                total += value
        return total if total < 10**7 else None

    if usage is None:
        return None, None
    return (count(("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")),
            count(("output_tokens",)))


def completion(message: Any) -> Completion:
    """A whole ``Message`` in core's terms."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in getattr(message, "content", None) or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(clean_text(block.text or ""))
        elif kind == "tool_use":
            calls.append(ToolCall(id=clean_text(block.id or "") or f"call_{len(calls) + 1}",
                                  name=clean_text(block.name or ""), arguments=json.dumps(block.input or {})))
    usage = getattr(message, "usage", None)
    input_tokens, output_tokens = usage_split(usage)
    return Completion(content="".join(texts), tool_calls=tuple(calls), usage=usage_total(usage),
                      input_tokens=input_tokens, output_tokens=output_tokens)


class StreamedMessage:
    """A streamed message put together from its events: text as it arrives, each ``tool_use`` input from its
    ``input_json_delta`` pieces, the usage from ``message_start`` and ``message_delta``."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.finished = False
        self._calls: dict[int, dict[str, Any]] = {}  # a block's index → its call
        self._usage: dict[str, int] = {}

    def add(self, event: Any) -> str:
        """Take one event; returns its text, repaired (may be empty)."""
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self._take_usage(getattr(event.message, "usage", None))
        elif kind == "content_block_start":
            block = event.content_block
            if block.type == "tool_use":
                start = block.input if isinstance(block.input, dict) and block.input else None
                self._calls[event.index] = {"id": block.id or "", "name": block.name or "", "json": "",
                                            "start": start}
            elif block.type == "text" and block.text:
                return self._text(block.text)
        elif kind == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":
                return self._text(delta.text)
            if delta.type == "input_json_delta" and event.index in self._calls:
                self._calls[event.index]["json"] += delta.partial_json or ""
        elif kind == "message_delta":
            self._take_usage(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.finished = True
        return ""

    def _text(self, text: str | None) -> str:
        cleaned = clean_text(text or "")
        if cleaned:
            self.text.append(cleaned)
        return cleaned

    def _take_usage(self, usage: Any) -> None:
        """Figures as they come: ``message_delta``'s are cumulative, so a later one replaces an earlier."""
        for name in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"):
            value = getattr(usage, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self._usage[name] = max(value, self._usage.get(name, 0))

    def completion(self) -> Completion:
        if not self.finished:
            raise ProviderError("network", "the model's answer broke off before its end", retryable=True)
        calls = tuple(
            ToolCall(id=clean_text(c["id"]) or f"call_{n}", name=clean_text(c["name"]),
                     arguments=c["json"] or (json.dumps(c["start"]) if c["start"] else "{}"))
            for n, (_, c) in enumerate(sorted(self._calls.items()), 1))
        input_tokens, output_tokens = usage_split(self._usage)
        return Completion(content="".join(self.text), tool_calls=calls, usage=usage_total(self._usage),
                          input_tokens=input_tokens, output_tokens=output_tokens)

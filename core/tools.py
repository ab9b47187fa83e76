"""Tool registry: name, JSON-schema parameters, risk, and an async function."""

from __future__ import annotations

import asyncio
import enum
import fnmatch
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from core.errors import CoreError, SchemaCheckError, ToolError
from core.model import EVENT_PREFIX, SessionInfo
from core.text import clean_text, text_problem, tree_problem
from core.tool_schema import ArgumentSchema, schema_problem

log = logging.getLogger(__name__)


class Risk(enum.StrEnum):
    SAFE = "safe"
    GATED = "gated"


# What a sub-agent is told wherever a person would be asked (approvals, credentials, connections, budgets).
SUBAGENT_CANNOT_ASK = "sub-agents cannot ask people; return to the parent"


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call it serves."""

    session_id: str
    turn_id: int
    agent: str
    sender: str | None
    place: str | None = None  # where the conversation lives (grants are scoped to it)
    call_id: str = ""
    interactive: bool = True  # False where nobody can be asked
    preapproved: tuple[tuple[str, str], ...] = ()  # (tool, subject) that need no approval here
    trust: str | None = None  # the sender's trust level (admin, member, guest, external, bot), when known
    subagent: bool = False  # a sub-agent's call (core.subagents): it never asks anyone, it returns to its parent
    # A person approved this very call (GateDecision.asked). False: it runs unasked (an allow rule, a grant, a
    # firing's preapproval, a safe tool), so a tool must not load what earlier calls left (shell_run: a fresh HOME).
    asked: bool = False
    # Everyone whose words the turn took (TurnInfo.senders, steered ones added): a tool that reads on someone's
    # behalf checks each of them (e.g. that every one of them may see what it reads).
    senders: tuple[str, ...] = ()
    # Nobody addressed the bot (a listening turn, TurnInfo.answer_optional): nobody asked it to act for them, so a tool
    # that reads or acts on someone's behalf does so only where the turn answers.
    unaddressed: bool = False
    session: SessionInfo | None = None  # the conversation's, for the events a call emits (core.events.ToolEnded)
    # After a pause inside an allowed call (a connection's consent): why it may no longer go on (a change freeze
    # began meanwhile), None when it may. Set by the runner from its gate; None: nothing to check.
    goes_on: Callable[[], Awaitable[str | None]] | None = None

    @property
    def requester(self) -> str | None:
        """Who asked for this turn, as approvals and credential requests name them: nobody for an event's turn
        (its sender is the event source, not a person: only named approvers decide what it asks for)."""
        return None if self.sender is None or self.sender.startswith(EVENT_PREFIX) else self.sender


ToolFunction = Callable[[ToolContext, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    risk: Risk
    function: ToolFunction
    timeout_s: float = 60.0
    # The argument that names what a call is about (e.g. message_send's channel): a firing's
    # preapproved destination is matched on it. Grants never use it: they cover the exact call.
    pattern_arg: str | None = None
    # For a call a crash left without a result: finish it if that is safe (e.g. keep waiting for a
    # parked request); None (or returning None) records it as interrupted.
    recover: Callable[[ToolContext, dict[str, Any]], Awaitable[str | None]] | None = None
    # Offered only to agents that name it exactly: a glob such as "*" does not hand it out (delegate).
    explicit: bool = False
    # Calls of one model step may run together (each its own result, stored in call order): delegate.
    concurrent: bool = False
    # The parameters compiled once: validation resolves no reference and bounds its patterns (core.tool_schema).
    schema: ArgumentSchema = field(init=False, repr=False, compare=False)
    # A problem with the arguments the schema cannot say in plain words (e.g. a channel name's rules): refused as a
    # ToolError for the model, before anyone is asked.
    check: Callable[[dict[str, Any]], str | None] | None = None
    # Checks the call against the world before anyone is asked (raises ToolError): what cannot run is never put
    # on an approval card.
    precheck: Callable[[ToolContext, dict[str, Any]], Awaitable[None]] | None = None
    # Whether it is offered in this turn at all (e.g. only where its channel's workspace is in scope and the
    # token it would use has what it needs); None: wherever its agent allows it.
    offered: Callable[[ToolContext], Awaitable[bool]] | None = None
    # Its result may carry text nobody in the conversation wrote (a page, a command's output, another channel's
    # messages, an MCP server's answer, a skill's file): what the conversation keeps for later after it (a memory) is
    # a person's to allow (core.outside_text). False only for a result that is the bot's own state (the clock, memory).
    outside_text: bool = True
    # A safe tool whose call needs a person's approval all the same here (e.g. remember once the conversation holds
    # text from outside it): the gate meets that call as a gated one. None: never.
    gated_when: Callable[[ToolContext, dict[str, Any]], Awaitable[bool]] | None = None
    # Every call sends a credential whatever its arguments say (an MCP server's token, the requester's own connection,
    # the credentials a stdio server was started with): an approver never edits such a call (core.approval_edits).
    sends_credential: bool = False
    # Whether an approver may Edit its call. False where what the call makes stands in the asker's name (a schedule,
    # whose firings run as its creator; a memory, saved as its writer's): an edit would make them its author.
    editable: bool = True

    def __post_init__(self) -> None:
        problem = schema_problem(self.parameters)
        if problem is not None:
            raise CoreError(f"tool {self.name!r} cannot have this schema: {problem}")
        object.__setattr__(self, "schema", ArgumentSchema(self.parameters))

    def spec(self) -> dict[str, Any]:
        """The OpenAI-style function description the model sees."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def parse_arguments(self, raw: str | dict[str, Any] | None) -> dict[str, Any]:
        """Decode and validate the model's arguments; raise ToolError with a message the model can use."""
        if raw is None or raw == "":
            args: Any = {}
        elif isinstance(raw, dict):
            args = raw
        else:
            try:
                args = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ToolError(f"arguments for {self.name} are not valid JSON: {exc.msg}") from exc
            except RecursionError as exc:  # thousands of nested brackets: refused like any bad argument
                raise ToolError(f"arguments for {self.name} are nested too deeply") from exc
            except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit on reading one)
                raise ToolError(f"arguments for {self.name} hold a number too large to read") from exc
        if not isinstance(args, dict):
            raise ToolError(f"arguments for {self.name} must be a JSON object")
        # Refused, not repaired: a repaired command is not the one written, and a NUL or a lone
        # surrogate could never be stored (grants, cards) nor run.
        try:
            problem = tree_problem(args)
        except RecursionError as exc:
            raise ToolError(f"arguments for {self.name} are nested too deeply") from exc
        if problem is not None:
            raise ToolError(f"arguments for {self.name} contain {problem}")
        try:
            error = self.schema.first_error(args)
        except SchemaCheckError as exc:
            raise ToolError(f"arguments for {self.name} could not be checked: {exc}") from exc
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolError(f"invalid arguments for {self.name} ({where}): {error.message}")
        problem = self.check(args) if self.check is not None else None
        if problem is not None:
            raise ToolError(f"invalid arguments for {self.name}: {problem}")
        return args


@dataclass
class ToolRegistry:
    _tools: dict[str, Tool] = field(default_factory=dict)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise CoreError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def allowed(self, patterns: Iterable[str]) -> list[Tool]:
        """Tools whose names match an allowlist entry (exact names or globs such as ``schedule_*``)."""
        pats = list(patterns)
        return [t for name, t in sorted(self._tools.items())
                if any(name == p if t.explicit else fnmatch.fnmatchcase(name, p) for p in pats)]


def canonical_call(args: dict[str, Any]) -> str:
    """Every argument of a call as compact JSON with sorted keys: two calls are the same call only
    when these are equal (what an "Always allow" grant is keyed by)."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_text(tool_name: str, args: dict[str, Any]) -> str:
    """The call as a person reads it and as policies match it (SPEC §16): ``shell_run`` → the
    command; ``http_request`` → ``METHOD URL``; ``message_send`` → ``#channel text``; any other
    tool → its arguments as compact JSON. Only the exact call (``canonical_call``) identifies it."""
    if tool_name == "shell_run" and isinstance(args.get("command"), str):
        return str(args["command"])
    if tool_name == "http_request" and isinstance(args.get("url"), str):
        return f"{str(args.get('method') or '').upper()} {args['url']}".strip()
    if tool_name == "message_send" and isinstance(args.get("channel"), str):
        channel = str(args["channel"])
        return f"{channel if channel.startswith('#') else '#' + channel} {args.get('text') or ''}".rstrip()
    return canonical_call(args)


CANONICAL_KEYS = {"shell_run": ("command",), "http_request": ("method", "url"), "message_send": ("channel", "text")}
DESTINATION_TOOL = "schedule_destination"  # what a schedule's destination approval is filed (and granted) under


@dataclass(frozen=True)
class GateDecision:
    """Whether a gated call may run; when not, ``result`` is what the model is told instead."""

    allowed: bool
    result: str = ""
    request_id: int | None = None
    already_started: bool = False  # approved before a crash and begun: never run it twice
    asked: bool = False  # a person approved this very call; False: it runs without anyone being asked
    # An approver changed the call before approving it (issue 40.3): what runs instead, and who changed it.
    arguments: dict[str, Any] | None = None
    edited_by: str | None = None


class ToolGate(Protocol):
    async def authorize(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision:
        """Decide (possibly asking a person, possibly waiting) whether this gated call may run."""
        ...

    async def recover(self, ctx: ToolContext, tool: Tool, args: dict[str, Any]) -> GateDecision | None:
        """For a call a crash left without result: its approval's state, or None if it never had one."""
        ...

    async def started(self, decision: GateDecision) -> None:
        """Record that an approved call begins to run (before it runs)."""
        ...

    async def ask_together(self, ctx: ToolContext, calls: Sequence[tuple[str, Tool, dict[str, Any]]],
                           batch: str) -> None:
        """Before one model step's calls run (``calls``: each call id, its tool as called, its arguments): those
        that will need a person are asked together, on one card (``batch``); each then waits in ``authorize``."""
        ...

    async def forget(self, ctx: ToolContext, call_ids: Sequence[str]) -> None:
        """The step ended: whatever ``ask_together`` kept for calls it never reached is let go. A person's stop
        cancels those requests; after a shutdown they stay (a restart finds them, or they expire)."""
        ...

    async def goes_on(self, ctx: ToolContext, tool: Tool, args: dict[str, Any], request_id: int | None
                      ) -> str | None:
        """After a pause inside an allowed call: why it may no longer go on (told to the model), None if it may."""
        ...


async def run_tool(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> str:
    """Run one call with the tool's timeout; every failure becomes a ToolError for the model. What
    it returns or says is repaired text (e.g. a shell's output may hold NUL bytes), fit to store."""
    try:
        async with asyncio.timeout(tool.timeout_s):
            return clean_text(await tool.function(ctx, args))
    except TimeoutError as exc:
        raise ToolError(f"{tool.name} timed out after {tool.timeout_s:g} s") from exc
    except ToolError as exc:
        if text_problem(str(exc)) is None:
            raise
        raise ToolError(clean_text(str(exc))) from exc
    except Exception as exc:
        raise ToolError(clean_text(f"{tool.name} failed: {type(exc).__name__}: {exc}")) from exc


async def precheck_call(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> None:
    """The tool's own check of a call before anyone is asked (``Tool.precheck``), with its timeout: every failure is a
    ToolError for the model, as when it runs."""
    if tool.precheck is None:
        return
    try:
        async with asyncio.timeout(tool.timeout_s):
            await tool.precheck(ctx, args)
    except TimeoutError as exc:
        raise ToolError(f"{tool.name} could not be checked within {tool.timeout_s:g} s") from exc
    except ToolError as exc:
        raise ToolError(clean_text(str(exc))) from exc
    except Exception as exc:
        raise ToolError(clean_text(f"{tool.name} could not be checked: {type(exc).__name__}: {exc}")) from exc


async def as_called(tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> Tool:
    """``tool`` as this call meets the gate: gated when its ``gated_when`` says so here, or cannot say (fail closed:
    a person is asked rather than nobody)."""
    if tool.risk is Risk.GATED or tool.gated_when is None:
        return tool
    try:
        async with asyncio.timeout(tool.timeout_s):
            gated = await tool.gated_when(ctx, args)
    except Exception as exc:
        log.warning("whether %s needs approval here could not be told (%s): it does", tool.name, type(exc).__name__)
        gated = True
    return replace(tool, risk=Risk.GATED) if gated else tool


async def offered_in(tool: Tool, ctx: ToolContext) -> bool:
    """Whether the tool is offered in this turn (``Tool.offered``); a check that fails offers it not (logged)."""
    if tool.offered is None:
        return True
    try:
        return await tool.offered(ctx)
    except Exception as exc:
        log.warning("tool %s not offered: checking whether it could be failed (%s)", tool.name, type(exc).__name__)
        return False

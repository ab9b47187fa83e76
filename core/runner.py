"""The agent runner: one turn = model calls and tool calls until a final answer."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from sqlmodel import Session

from core.agents import Agent
from core.answer_stream import AnswerStream, Emit
from core.budget import ThreadBudget
from core.chat_history import merge_user_runs, to_chat, turn_start
from core.clock import Clock
from core.context_window import ContextWindow, estimate, request_tokens
from core.errors import BudgetExhausted, ModelsFailed, ProviderError, StepLimitReached, ToolError
from core.events import EventBus, ToolEnded, ToolOutcome
from core.listening import LISTENING_NOTE, NO_REPLY, NO_REPLY_SPEC
from core.model import TurnInfo, thread_of
from core.model_routing import Model, ModelRouter, SessionModels, switches_on
from core.providers import (
    CallObserver,
    ChatMessage,
    Completion,
    CompletionRequest,
    Provider,
    RetryPolicy,
    TextStream,
    ToolCall,
    complete_with_retries,
)
from core.redaction import Redactor
from core.spending import SpendingCaps
from core.store import ConversationStore
from core.store.summaries import SummaryStore
from core.store.usage import Count
from core.text import clean_text
from core.tools import (
    GateDecision,
    Risk,
    Tool,
    ToolContext,
    ToolGate,
    ToolRegistry,
    as_called,
    offered_in,
    precheck_call,
    run_tool,
)
from core.tracing import CURRENT, NO_TRACING, Span, Tracer
from core.trust import SenderTrust, Trust, least_trusted

log = logging.getLogger(__name__)

# The model answering the run in this task: the context window's summary of a thread is written by it too (a session
# on the fallback model never asks its failed primary for one).
_ANSWERING: ContextVar[Model | None] = ContextVar("answering_model", default=None)
# Whose step a summary is made in (the call and its agent): it is a model call, counted like the step's own.
_COUNTED: ContextVar[tuple[ToolContext, str] | None] = ContextVar("counted_step", default=None)

Steer = Callable[[], Awaitable[list[ChatMessage]]]


class PromptSection(Protocol):
    """A part of a turn's system prompt after the agent's instructions (pinned memories, the skill list).

    It is written for this turn (its agent, trust and whether it is a sub-agent's) and bounded by its own cap:
    the context window never cuts the system prompt, so the section must keep itself small. "" adds nothing."""

    async def render(self, agent: Agent, ctx: ToolContext) -> str: ...

SECRET_IN_ARGUMENTS = ("error: the arguments of `{tool}` contain the value of a secret, so it did not run; "
                       "never write a secret's value: name it instead (shell_run: credentials=[name]; "
                       "http_request: credential=name)")
INTERRUPTED_RESULT = "error: interrupted — unknown whether it completed; do not assume it ran"


@dataclass(frozen=True)
class RunnerLimits:
    max_steps: int = 25
    history_messages: int = 200
    tool_result_max_chars: int = 16_000
    context_tokens: int = 32_000  # LLM_CONTEXT_TOKENS: what one model request may hold


class AgentRunner:
    def __init__(
        self,
        store: ConversationStore,
        provider: Provider,
        tools: ToolRegistry,
        clock: Clock,
        *,
        limits: RunnerLimits = RunnerLimits(),
        retry: RetryPolicy = RetryPolicy(),
        gate: ToolGate | None = None,
        redactor: Redactor | None = None,
        budget: ThreadBudget | None = None,
        resumable: Callable[[ToolContext], Awaitable[bool]] | None = None,
        trust: SenderTrust | None = None,
        sections: Sequence[PromptSection] = (),
        tracer: Tracer = NO_TRACING,
        models: ModelRouter | None = None,
        events: EventBus | None = None,
        spending: SpendingCaps | None = None,
    ) -> None:
        self.store = store
        self.provider = provider  # the primary model's
        # Which model answers each call: an agent's own, the primary, or the fallback once a session switched.
        self.models = models or ModelRouter(Model(provider, str(getattr(provider, "model", provider.name))))
        self._sessions: dict[int, SessionModels] = {}  # top-level turn id → its models, shared with its sub-agents
        self._unsaved: dict[int, SessionModels] = {}  # turn id → a switch its final answer's commit must carry
        self._uncounted: dict[int, Count] = {}  # turn id → its final answer's call, counted in the turn end's commit
        self.tools = tools
        self.clock = clock
        self.limits = limits
        self.retry = retry
        self.gate = gate
        self.redactor = redactor
        self.budget = budget  # THREAD_TOKEN_BUDGET: counted per model call, parks the turn when used up
        # Whether a call a crash left without result was parked for consent and never went on (it runs again:
        # waits on, or goes on once; core.connections).
        self.resumable = resumable
        self.trust = trust  # senders' levels: a turn runs at the least trusted of everyone whose words it took
        self.sections = tuple(sections)
        self.tracer = tracer  # invoke_agent, chat and execute_tool spans (core.tracing)
        self.events = events  # ToolEnded, for each call's outcome
        self.spending = spending  # each call counted per day, agent and person; caps checked first (core.spending)
        self.window = ContextWindow(limits.context_tokens, SummaryStore(store.db) if store is not None else None,
                                    self._summarise, mask=self.redact)

    async def run(
        self,
        turn: TurnInfo,
        agent: Agent,
        *,
        images: tuple[str, ...] = (),
        steer: Steer | None = None,
        transcript: Sequence[Any] | None = None,
        save_answer: bool = True,
        on_text: Emit | None = None,
        on_tool: Callable[[str], None] | None = None,
        secrets: object = None,
        parent: ToolContext | None = None,
        max_steps: int | None = None,
    ) -> str:
        """Answer the turn; every message is saved as soon as it exists (the final answer too, unless
        ``save_answer`` is False). Returns the final text ("" when a turn whose answer is optional stays silent:
        core.listening).

        With ``save_answer=False`` the final answer (the assistant message without tool calls) is left
        to the caller, which stores it with the turn's end in one transaction (core.turns).

        ``steer`` is asked after each batch of tool calls, before the next model call, for messages
        that arrived meanwhile (already saved to the transcript); ``images`` go with the turn's input.
        ``on_text`` gets the answer's text as the model writes it, masked (if the provider streams);
        ``on_tool`` the name of each tool as it starts to run.

        ``parent``: this is a sub-agent's turn (core.subagents) for that call: it acts for the parent's
        sender at the parent's trust, and asks nobody. ``max_steps`` replaces the limit's (SUBAGENT_MAX_STEPS);
        otherwise the agent's own ([[agents]] ``max_steps``), else MAX_STEPS.

        With ``save_answer=False`` a switch to the fallback model that the final answer must carry is the caller's to
        store with it (``unsaved_switch``).
        """
        # Another process may have stored a secret since the last turn: the masks are brought up to date
        # while the model is first asked, and before anything is redacted.
        # ``secrets``: their fingerprint, read where the turn was taken (then this costs no query).
        checking = asyncio.ensure_future(self.redactor.check(secrets)) if self.redactor is not None else None
        models = await self._models_of(turn, parent)
        # A turn's span joins the trace its first message began at intake, after a restart too (then it also links
        # to that first span); a sub-agent's is a child of the call that delegated to it.
        first = turn.trace_context if parent is None else None
        answering = self.models.answering(models, agent.name, parent.agent if parent is not None else None)
        try:
            with self.tracer.span(f"invoke_agent {agent.name}", {
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name,
                    "gen_ai.conversation.id": turn.session.id, "gen_ai.provider.name": answering.provider.name,
                    "gen_ai.request.model": answering.name or None, "chatops.turn.id": turn.id,
                    "chatops.turn.resumed": turn.resumed or None},
                    parent=first if parent is None else CURRENT, links=(first,) if first and turn.resumed else ()):
                return await self._run(turn, agent, images, steer, transcript, checking, save_answer, on_text,
                                       on_tool, parent=parent,
                                       max_steps=max_steps or agent.max_steps or self.limits.max_steps, models=models)
        except BaseException:
            # Never cut short: what the turn's failure says is redacted next, with masks that must be current.
            if checking is not None:
                await asyncio.wait([checking])
                if not checking.cancelled():
                    checking.exception()  # retrieved here; a failed check already failed the turn or will
            raise
        finally:
            if parent is None:
                self._sessions.pop(turn.id, None)

    async def _models_of(self, turn: TurnInfo, parent: ToolContext | None) -> SessionModels:
        """Where this run's calls go: a turn's own (its session's stored choice), or, for a sub-agent, its parent
        turn's (shared: a switch in either holds for both)."""
        if parent is None:
            models = self._sessions[turn.id] = self.models.start(turn.session)
            return models
        shared = self._sessions.get(parent.turn_id)
        if shared is not None:
            return shared
        thread = await self.store.get_session(parent.session_id)  # not begun in this runner: as stored
        return self.models.start(thread if thread is not None else turn.session)

    def uncounted(self, turn_id: int) -> Count | None:
        """The final answer's model call, for the commit that ends the turn to count (one write, not two)."""
        return self._uncounted.pop(turn_id, None)

    def still_uncounted(self, turn_id: int, count: Count | None) -> None:
        """``count`` (from ``uncounted``) was not stored: the commit that was to carry it failed. ``count_alone``
        counts it (only for a failed write: a cancelled one may have committed, and a call is never counted twice)."""
        if count is not None:
            self._uncounted[turn_id] = count

    async def count_alone(self, turn_id: int) -> None:
        """A final call the turn's end did not count (it was not stored): counted on its own, the call was made."""
        count = self._uncounted.pop(turn_id, None)
        if count is not None:
            try:
                await self._write_alone(count)
            except Exception:  # never in place of what ended the turn
                log.exception("could not count a model call of turn %s", turn_id)

    def unsaved_switch(self, turn_id: int) -> SessionModels | None:
        """A switch to the fallback model that the turn's final answer (stored by the caller) must carry in its
        commit: ``ModelRouter.unstored`` is the write, ``ModelRouter.stored`` follows the commit."""
        return self._unsaved.pop(turn_id, None)

    async def _run(self, turn: TurnInfo, agent: Agent, images: tuple[str, ...], steer: Steer | None,
                   transcript: Sequence[Any] | None, checking: asyncio.Future[None] | None,
                   save_answer: bool, on_text: Emit | None, on_tool: Callable[[str], None] | None, *,
                   parent: ToolContext | None, max_steps: int, models: SessionModels) -> str:
        session_id = turn.session.id
        # Everyone whose words the model reads (earlier askers in the thread too): a tool that reads on someone's
        # behalf must be theirs to read, or an earlier asker reads through the next one's turn.
        everyone = await self._everyone(turn) if parent is None else ()
        ctx = ToolContext(session_id=session_id, turn_id=turn.id, agent=agent.name, sender=turn.sender,
                          place=turn.session.place, preapproved=turn.session.preapproved,
                          trust=await self._trust_of(turn, everyone) if parent is None else parent.trust,
                          senders=everyone, unaddressed=turn.answer_optional, session=turn.session)
        if parent is not None:  # a sub-agent: the parent's sender, place and trust; nobody to ask
            # Credentials and grants stay the parent agent's: delegating never borrows another agent's.
            ctx = replace(ctx, agent=parent.agent, sender=parent.sender, place=parent.place, interactive=False,
                          subagent=True, senders=parent.senders, unaddressed=parent.unaddressed)
        allowed = [t for t in self.tools.allowed(agent.tools) if await offered_in(t, ctx)]
        specs = [t.spec() for t in allowed]
        allowed_names = {t.name for t in allowed}
        # Read where the turn was taken, in the same transaction, unless the caller did not.
        rows = transcript if transcript is not None else await self.store.transcript(session_id,
                                                                                     self.limits.history_messages)
        history = await self._close_dangling_calls(to_chat(rows, turn.asked), allowed_names, ctx, checking)
        # A turn nobody asked for may end silently (core.listening): offered ``no_reply``, and told so.
        optional = turn.answer_optional and parent is None
        instructions = await self._instructions(agent, ctx, optional)
        offered = [*specs, NO_REPLY_SPEC] if optional else specs
        # This turn's messages begin here (resumed or not): older ones are left out first to fit the context window,
        # and its newest question (``asked``) never.
        keep_from, tight = turn_start(rows, turn.id, history), False
        if images and history and history[-1].role == "user":  # on the question, which keeps them
            at = next((i for i in range(len(history) - 1, keep_from - 1, -1) if history[i].asked), len(history) - 1)
            history[at] = replace(history[at], images=images)
        # Nothing of the live text leaves before the masks are current (the check started above).
        live = None if on_text is None else AnswerStream(on_text, self.redactor, checking)
        for _step in range(max_steps):
            if self.spending is not None:  # a spending cap reached: parked for an admin's Continue, or ended
                try:
                    await self.spending.before_call(ctx, agent.name)
                except BudgetExhausted:
                    if not optional:
                        raise
                    # Nobody asked for this turn: it ends silent, or a listening channel hears of the cap per message.
                    log.info("turn %s (unaddressed) ended silent at a spending cap", turn.id)
                    if self.models.unstored(models) is not None:
                        self._unsaved[turn.id] = models
                    return ""
            if self.budget is not None:  # used up: parked until Continue (or ended by Stop), before any call
                await self.budget.before_call(ctx)
            _ANSWERING.set(self.models.answering(models, agent.name, parent.agent if parent else None))
            _COUNTED.set((ctx, agent.name))
            room = self.window.room(instructions, offered, tight=tight)
            messages = merge_user_runs(await self.window.fit(session_id, history, room, keep_from=keep_from))
            request = CompletionRequest(instructions=instructions, messages=messages, tools=offered)
            unspent = None  # the call's count, written with the step it wrote (one write, not two)
            try:
                reply = await self._complete(models, agent.name, parent, turn, request, live)
                unspent = await self._spend(ctx, agent.name, self.models.answering(
                    models, agent.name, parent.agent if parent else None), request, reply)
                if checking is not None:
                    await checking
            except ProviderError as exc:
                if exc.kind == "context_overflow" and not tight:  # its count is not ours: once, tighter
                    log.warning("the model said the request was too long; fitting it into half the room")
                    tight = True
                    if live is not None:
                        live.restart()
                    continue
                if live is not None:
                    live.close()
                raise
            except BaseException:
                if live is not None:
                    live.close()
                try:  # the call was made: it counts, whatever failed after it
                    await self._write_alone(unspent)
                except Exception:  # never in place of what failed
                    log.exception("could not count a model call of turn %s", turn.id)
                raise
            if live is not None:
                live.finish(final=not reply.tool_calls)
            silence = optional and any(call.name == NO_REPLY for call in reply.tool_calls)
            if (silence or (not reply.tool_calls and not save_answer)) and self.models.unstored(models) is not None:
                self._unsaved[turn.id] = models  # the caller's commit of the turn's end carries the switch
            if silence:
                await self._write_alone(unspent)
                return ""  # silence, whatever else the reply said or called: nothing of it is stored or run
            # The model may repeat a secret it saw: masked before it is stored, posted or shown. A
            # call whose arguments hold one never runs (see _call_tool): it would put the secret on
            # an approval card, in a grant or in a command line.
            content = await self.redact(reply.content)
            recorded, holds_secret = [], set()
            for call in reply.tool_calls:
                shown, masked = await self._masked_arguments(call.arguments)
                recorded.append(replace(call, arguments=masked))
                if masked != shown:
                    holds_secret.add(call.id)
            if not reply.tool_calls and not save_answer:
                if isinstance(unspent, Count):  # counted in the commit that ends the turn (the caller's)
                    self._uncounted[turn.id] = unspent
                else:
                    await self._write_alone(unspent)
                return content
            await self.store.add_message(
                session_id,
                role="assistant",
                content=content,
                turn_id=turn.id,
                now=self.clock.now(),
                tool_calls=[c.as_dict() for c in recorded],
                # A switch to the fallback is stored with the step it wrote; so is the call's count.
                then=_joined(self.models.unstored(models), unspent),
            )
            self.models.stored(models)
            history.append(ChatMessage("assistant", content, tuple(recorded)))
            if not reply.tool_calls:
                return content
            # Calls that may run together (sub-agents) start at once; the others run in order. Results are
            # stored in call order; a stop cancels whatever still runs (a sub-agent, or one waiting for a slot).
            # The step's calls that will need a person are asked on one card before the first one runs.
            batched = await self._ask_together(reply.tool_calls, holds_secret, allowed_names, ctx, turn.id)
            together = {call.id: asyncio.ensure_future(self._call_tool(call, allowed_names, ctx, on_tool))
                        for call in reply.tool_calls if call.id not in holds_secret and self._concurrent(call.name)}
            try:
                for call in reply.tool_calls:
                    result = (self._refuse_secret(call, ctx) if call.id in holds_secret
                              else await together[call.id] if call.id in together
                              else await self._call_tool(call, allowed_names, ctx, on_tool))
                    await self.store.add_message(
                        session_id, role="tool", content=result, turn_id=turn.id,
                        now=self.clock.now(), tool_call_id=call.id,
                    )
                    history.append(ChatMessage("tool", result, tool_call_id=call.id))
            finally:
                if batched and self.gate is not None:
                    await self.gate.forget(ctx, batched)
                await _cancel_all(together.values())
            if steer is not None:
                steered = await steer()
                history.extend(steered)
                joined = tuple(sender for message in steered for sender in message.senders)
                if joined:  # their words are the model's from this step on
                    ctx = replace(ctx, senders=tuple(dict.fromkeys((*ctx.senders, *joined))))
                if joined and self.trust is not None:
                    joining = await self.trust.of_senders(turn.session.channel, joined, turn.session.place)
                    ctx = replace(ctx, trust=least_trusted([Trust(ctx.trust or Trust.MEMBER), joining]))
        raise StepLimitReached(
            f"I used all {max_steps} steps without finishing. "
            "Ask me to continue, or raise MAX_STEPS."
        )

    async def _spend(self, ctx: ToolContext, agent: str, model: Model, request: CompletionRequest,
                     reply: Completion) -> Callable[[Session], None] | None:
        """Count the call: the write of its usage row (by the agent that ran it and the model that answered) and of
        the thread's budget, for the transaction of the step it wrote. Without spending caps wired, only the budget,
        written now (None returned)."""
        thread = thread_of(ctx.session_id) if self.budget is not None and self.budget.enabled else None
        if self.spending is not None:
            return self.spending.count(ctx, agent, model.name, reply, estimated_input=request_tokens(request),
                                       estimated_output=estimate(reply.content), thread=thread)
        if self.budget is not None:
            await self.budget.spend(ctx.session_id, reply.usage if reply.usage is not None else
                                    request_tokens(request) + estimate(reply.content))
        return None

    async def _write_alone(self, write: Callable[[Session], None] | None) -> None:
        """A call's count that no step's write carries (the final answer is the caller's to store)."""
        if write is not None:
            await self.store.db.run_write(write)

    async def _complete(self, models: SessionModels, agent: str, parent: ToolContext | None, turn: TurnInfo,
                        request: CompletionRequest, live: AnswerStream | None) -> Completion:
        """One model call (with its retries) to the model answering this session; when it fails for good, the
        same call once more to the fallback, which answers the session from then on."""
        parent_agent = parent.agent if parent is not None else None
        model = self.models.answering(models, agent, parent_agent)
        try:
            return await self._chat(model, request, live, observe=self.models.observer(turn.session, model))
        except ProviderError as exc:
            if self.models.fallback is None or not switches_on(exc):
                raise
            if model is self.models.fallback:
                raise ModelsFailed(models.primary_failure or "it failed earlier in this thread",
                                   await self.models.reason(exc), exc) from exc
            # (Already switched by another run of this thread meanwhile, a sub-agent beside this one: it goes on too.)
            await self.models.switch(models, model, exc)
            if live is not None:
                live.restart()  # what the failed model wrote is not the answer
            return await self._complete(models, agent, parent, turn, request, live)

    async def _instructions(self, agent: Agent, ctx: ToolContext, optional: bool) -> str:
        """The system prompt: the agent's instructions, then each section written for this turn."""
        parts = [agent.instructions + LISTENING_NOTE if optional else agent.instructions]
        for section in self.sections:
            # Written from files or rows others wrote (a skill's description): masked like everything the model reads.
            text = await self.redact(await section.render(agent, ctx))
            if text:
                parts.append(text)
        return "\n\n".join(parts)

    def _concurrent(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and tool.concurrent

    async def _everyone(self, turn: TurnInfo) -> tuple[str, ...]:
        """Everyone whose words the model reads: this turn's senders first, then every earlier one in the
        conversation (a guest's request stays in the history when a member says "go"), each once."""
        everyone = turn.everyone
        if everyone is None:  # not read with the turn's start (a resumed turn): one query
            everyone = (*(turn.senders or (turn.sender,)), *await self.store.conversation_senders(turn.session.id))
        return tuple(dict.fromkeys(s for s in (*(turn.senders or (turn.sender,)), *everyone) if s is not None))

    async def _trust_of(self, turn: TurnInfo, everyone: tuple[str, ...]) -> Trust | None:
        """The least-trusted level among ``everyone`` whose words the model reads."""
        if self.trust is None:
            return None
        return await self.trust.of_turn(turn.session, everyone or (turn.sender,))

    async def _chat(self, model: Model, request: CompletionRequest, on_text: TextStream | None = None,
                    observe: CallObserver | None = None) -> Completion:
        """One model call (retried as ``self.retry`` says) in a ``chat <model>`` span, with its token usage."""
        with self.tracer.span(f"chat {model.name}" if model.name else "chat", {
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": model.provider.name,
                "gen_ai.request.model": model.name or None, "gen_ai.request.max_tokens": request.max_output_tokens},
                client=True) as span:
            try:
                reply = await complete_with_retries(model.provider, request, self.retry, on_text=on_text,
                                                    observe=observe)
            except ProviderError as exc:
                span.fail(exc.kind)  # the kind, never the text (it may quote the request)
                raise
            span.set("gen_ai.usage.input_tokens", reply.input_tokens)
            span.set("gen_ai.usage.output_tokens", reply.output_tokens)
            if self.tracer.content:
                await self._record_messages(span, request, reply)
            return reply

    async def _record_messages(self, span: Span, request: CompletionRequest, reply: Completion) -> None:
        """The request's and the answer's text on the span (only when content capture is on): each part masked
        by itself, before it is put into JSON (escaping could hide a secret from the masks)."""
        async def parts(message: ChatMessage) -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = [{"type": "text", "content": await self.redact(message.content)}] \
                if message.content else []
            if message.role == "tool":
                found = [{"type": "tool_call_response", "id": message.tool_call_id,
                          "response": await self.redact(message.content)}]
            for call in message.tool_calls:
                found.append({"type": "tool_call", "id": call.id, "name": call.name,
                              "arguments": await self.redact(call.arguments)})
            return found

        span.set("gen_ai.system_instructions",
                 json.dumps([{"type": "text", "content": await self.redact(request.instructions)}], ensure_ascii=False))
        span.set("gen_ai.input.messages", json.dumps(
            [{"role": m.role, "parts": await parts(m)} for m in request.messages], ensure_ascii=False))
        answer = ChatMessage("assistant", reply.content, reply.tool_calls)
        span.set("gen_ai.output.messages", json.dumps([{"role": "assistant", "parts": await parts(answer)}],
                                                      ensure_ascii=False))

    async def _call_tool(self, call: ToolCall, allowed: set[str], ctx: ToolContext,
                         on_tool: Callable[[str], None] | None = None) -> str:
        """The call's result (masked), in an ``execute_tool <tool>`` span that also holds its approval's wait."""
        # A name the model made up is not a tool's: it names no span (it could carry anything).
        name = call.name if call.name in allowed and self.tools.get(call.name) is not None else "_OTHER"
        with self.tracer.span(f"execute_tool {name}", {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": call.id if _ID.fullmatch(call.id) else None}) as span:
            result = await self._tool_result(call, allowed, ctx, on_tool)
            if result.startswith("error:"):
                span.fail("tool_error")
            if self.tracer.content:
                span.set("gen_ai.tool.call.arguments", await self.redact(call.arguments))
                span.set("gen_ai.tool.call.result", await self.redact(result))
            return result

    async def _tool_result(self, call: ToolCall, allowed: set[str], ctx: ToolContext,
                           on_tool: Callable[[str], None] | None) -> str:
        tool = self.tools.get(call.name)
        if tool is None or call.name not in allowed:
            self._ended(ctx, call.name if tool is not None else None, ToolOutcome.REFUSED)
            return f"error: there is no tool named {call.name!r} available to you"
        ctx = replace(ctx, call_id=call.id, asked=False)
        try:
            args = tool.parse_arguments(call.arguments)
            await precheck_call(tool, ctx, args)  # what cannot run is refused before anyone is asked about it
            tool = await as_called(tool, ctx, args)  # a safe call that needs a person here (remember after a page)
            if self.gate is not None:  # every call: approval policies may refuse or ask about safe tools too
                decision = await self.gate.authorize(ctx, tool, args)
                if not decision.allowed:
                    self._ended(ctx, call.name, ToolOutcome.DENIED)
                    return await self.redact(decision.result)
                args, note = await self._edited(tool, ctx, args, decision)
                await self.gate.started(decision)  # the decision is on record before the tool runs
                ctx = replace(ctx, asked=decision.asked,  # whether a person approved this very call
                              goes_on=partial(self.gate.goes_on, ctx, tool, args, decision.request_id))
            elif tool.risk is Risk.GATED:
                raise ToolError(f"{tool.name} needs a person's approval, and nobody can approve here")
            else:
                note = ""
            if on_tool is not None:
                on_tool(tool.name)
            return note + await self._execute(tool, ctx, args)
        except ToolError as exc:  # e.g. a schema error quoting the model's arguments
            self._ended(ctx, call.name, ToolOutcome.REFUSED)
            return await self.redact(f"error: {exc}")

    async def _ask_together(self, calls: Sequence[ToolCall], holds_secret: set[str], allowed: set[str],
                            ctx: ToolContext, turn_id: int) -> list[str]:
        """Before a step's calls run in order, the gate asks about those that will need a person on one card
        (issue 40.3); returns the call ids it was shown. Calls that run together (delegate), that hold a secret or
        that are refused anyway (unknown tool, bad arguments, a failed check) are left to be handled as ever."""
        if self.gate is None or len(calls) < 2 or len({call.id for call in calls}) != len(calls):
            return []
        prepared: list[tuple[str, Tool, dict[str, Any]]] = []
        for call in calls:
            tool = self.tools.get(call.name)
            if tool is None or call.name not in allowed or call.id in holds_secret or tool.concurrent:
                continue
            called = replace(ctx, call_id=call.id, asked=False)
            try:
                args = tool.parse_arguments(call.arguments)
                await precheck_call(tool, called, args)
                prepared.append((call.id, await as_called(tool, called, args), args))
            except ToolError:
                continue  # refused with its reason when the runner reaches it
        if len(prepared) < 2:
            return []
        await self.gate.ask_together(ctx, prepared, f"{turn_id}:{uuid.uuid4().hex[:16]}")
        return [call_id for call_id, _tool, _args in prepared]

    async def _edited(self, tool: Tool, ctx: ToolContext, args: dict[str, Any],
                      decision: GateDecision) -> tuple[dict[str, Any], str]:
        """The arguments that run (an approver's edit, checked again by the tool's schema and its own check, or the
        model's), and what the model is told before the result when an approver changed the call."""
        if decision.arguments is None:
            return args, ""
        edited = tool.parse_arguments(decision.arguments)
        await precheck_call(tool, ctx, edited)
        shown = await self.redact(json.dumps(edited, ensure_ascii=False))
        return edited, (f"note: an approver ({decision.edited_by or 'someone'}) changed this call before approving "
                        f"it; it ran with these arguments instead of yours: {shown}\n")

    async def _execute(self, tool: Tool, ctx: ToolContext, args: dict[str, Any]) -> str:
        log.info("tool %s called (session %s, turn %s)", tool.name, ctx.session_id, ctx.turn_id)
        outcome = ToolOutcome.OK
        try:
            result = await run_tool(tool, ctx, args)
        except ToolError as exc:
            result, outcome = f"error: {exc}", ToolOutcome.ERROR
        self._ended(ctx, tool.name, outcome)
        # Before anything else sees it (model, transcript, channels): no stored secret in it.
        return _truncate(await self.redact(result), self.limits.tool_result_max_chars)

    def _refuse_secret(self, call: ToolCall, ctx: ToolContext) -> str:
        self._ended(ctx, call.name if self.tools.get(call.name) is not None else None, ToolOutcome.REFUSED)
        return SECRET_IN_ARGUMENTS.format(tool=call.name)

    def _ended(self, ctx: ToolContext, tool: str | None, outcome: ToolOutcome) -> None:
        if self.events is not None and ctx.session is not None:
            self.events.emit(ToolEnded(ctx.session, ctx.turn_id, tool, outcome))

    async def _masked_arguments(self, raw: str) -> tuple[str, str]:
        """The arguments as they will be read (decoded JSON re-serialised, so that ``\u0073``-style
        escapes cannot hide a secret from the masks), and the same masked."""
        try:
            # Lone surrogates the JSON escaped come back raw: repaired so the transcript stays
            # storable and sendable (the call itself is refused when its arguments are parsed).
            shown = clean_text(json.dumps(json.loads(raw), ensure_ascii=False))
        except (ValueError, TypeError):
            shown = raw  # not JSON: refused when parsed, and masked as written
        return shown, await self.redact(shown)

    async def redact(self, text: str) -> str:
        """``text`` with every secret the redactor knows masked."""
        return await self.redactor.redact(text) if self.redactor is not None else text

    async def _summarise(self, messages: list[ChatMessage]) -> str:
        """One model call, no tools: a summary of what the context window left out (masked)."""
        request = CompletionRequest(instructions="You summarise chat-ops threads briefly and factually.",
                                    messages=messages)
        model = _ANSWERING.get() or self.models.primary
        reply = await self._chat(model, request)
        counted = _COUNTED.get()
        if self.spending is not None and counted is not None:  # caps and `bot usage` see it (not the thread budget)
            ctx, agent = counted
            await self._write_alone(self.spending.count(ctx, agent, model.name, reply,
                                                        estimated_input=request_tokens(request),
                                                        estimated_output=estimate(reply.content), thread=None))
        return await self.redact(reply.content)

    async def _close_dangling_calls(
        self, history: list[ChatMessage], allowed: set[str], ctx: ToolContext, checking: asyncio.Future[None] | None
    ) -> list[ChatMessage]:
        """A crash can leave tool calls without results. One still waiting for its approval waits
        again (its buttons keep working); one approved but never begun runs now; anything else is
        recorded as interrupted and never re-run."""
        answered = {m.tool_call_id for m in history if m.role == "tool"}
        closed: list[ChatMessage] = []
        for message in history:
            closed.append(message)
            for call in message.tool_calls:
                if call.id not in answered:
                    if checking is not None:
                        await checking  # a recovered call's result is redacted
                    result = await self._recover_call(call, allowed, replace(ctx, call_id=call.id))
                    await self.store.add_message(
                        ctx.session_id, role="tool", content=result, turn_id=ctx.turn_id,
                        now=self.clock.now(), tool_call_id=call.id,
                    )
                    closed.append(ChatMessage("tool", result, tool_call_id=call.id))
        return closed

    async def _recover_call(self, call: ToolCall, allowed: set[str], ctx: ToolContext) -> str:
        tool = self.tools.get(call.name)
        if tool is None or call.name not in allowed:
            return INTERRUPTED_RESULT
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolError:
            return INTERRUPTED_RESULT
        if tool.recover is not None:
            try:
                recovered = await tool.recover(ctx, args)
            except ToolError as exc:
                return await self.redact(f"error: {exc}")
            return await self.redact(recovered) if recovered is not None else INTERRUPTED_RESULT
        if self.gate is None:
            return INTERRUPTED_RESULT
        decision = await self.gate.recover(ctx, tool, args)  # a safe tool too: a policy may have asked
        ctx = replace(ctx, asked=decision is not None and decision.asked, goes_on=partial(
            self.gate.goes_on, ctx, tool, args, decision.request_id if decision is not None else None))
        parked = self.resumable is not None and await self.resumable(ctx)
        note = ""
        if decision is not None and decision.allowed:
            try:
                args, note = await self._edited(tool, ctx, args, decision)  # an approver's edit, stored first
            except ToolError as exc:
                return await self.redact(f"error: {exc}")
        if parked and (decision is None or decision.already_started):
            return note + await self._execute(tool, ctx, args)  # it sent nothing yet: it waited for consent
        if decision is None or decision.already_started:
            return INTERRUPTED_RESULT
        if not decision.allowed:
            self._ended(ctx, tool.name, ToolOutcome.DENIED)
            return await self.redact(decision.result)
        await self.gate.started(decision)
        return note + await self._execute(tool, ctx, args)


def _joined(*writes: Callable[[Session], None] | None) -> Callable[[Session], None] | None:
    """The writes given, in order, as one (for one transaction); None when there are none."""
    given = [w for w in writes if w is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def work(s: Session) -> None:
        for write in given:
            write(s)

    return work


async def _cancel_all(tasks: Iterable[asyncio.Future[str]]) -> None:
    """Cancel what still runs and wait until it has ended (a sub-agent records how it ended)."""
    tasks = list(tasks)
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in tasks:  # retrieved, so none is logged as "never retrieved"; the turn's own error goes on
        if not task.cancelled():
            task.exception()


_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # a tool call id as providers write them; anything else is left out


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[truncated: {len(text) - limit} more characters]"

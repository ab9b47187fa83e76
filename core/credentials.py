"""Credentials (SPEC §8): the agent asks, a person provides, the value is sealed and used per call.

The plaintext exists only while a value is being sealed, and while a tool call that needs it runs:
it is never stored unsealed, never logged, never sent to a channel or a model. Any stored value
that shows up in a tool's output or the model's text — or a form derived from it — is replaced by
``[redacted:<name>]`` (core.redaction) before anything else sees it.

Stored values (names, hosts, opening one) are core.stored_secrets; one-time links, core.credential_links.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.clock import Clock
from core.errors import InvalidInput, ToolError, VaultError
from core.events import CredentialRequested, CredentialResolved, EventBus
from core.hosts import parse_hosts
from core.model import CredentialRequestInfo, CredentialStatus
from core.redaction import Redactor
from core.requests import PersonRequests, why_nobody_is_asked
from core.sealed_values import bind_legacy_credentials
from core.store import CredentialStore
from core.store.tables import CredentialRequestRow, SecretRow
from core.stored_secrets import NAME, CredentialUse, env_name, hosts_of, how_to_use, open_secret, preferred
from core.tools import SUBAGENT_CANNOT_ASK, Risk, Tool, ToolContext
from core.trust import NOT_ALLOWED
from core.vault import ROW_AAD, KeyRing, row_context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProvideResult:
    stored: bool
    message: str
    field_error: str | None = None  # shown next to the input: the request stays open
    request: CredentialRequestInfo | None = None
    field: str = "value"  # the input the field error belongs to: "value" or "hosts"


def _not_granted(name: str, agent: str) -> str:
    return (f"a shared credential named {name} exists but is not granted to agent {agent}; an admin can grant "
            f"it: bot credentials set {name} --scope shared --agent {agent} (this stores its value again: give "
            f"its --host options again too). Nobody was asked; continue without it.")


class CredentialService:
    def __init__(
        self, store: CredentialStore, keys: KeyRing, bus: EventBus, clock: Clock, policy: ApprovalPolicy,
        agents: AgentDirectory, *, timeout_s: float = 1800, max_bytes: int = 16_384, poll_s: float = 2.0,
        on_secret: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self.policy = policy
        self.agents = agents
        self.timeout = timedelta(seconds=timeout_s)
        self.max_bytes = max_bytes
        self.on_secret = on_secret  # e.g. the log filter learning a value to mask
        self.requests = PersonRequests("credential request", store.requests, bus, clock, poll_s=poll_s,
                                       end=self._end, resolved=lambda request: CredentialResolved(request.session,
                                                                                                  request))
        # Other stored secrets masked with these (connections' tokens): (label, value) loaders.
        self.also_masked: list[Callable[[], Awaitable[list[tuple[str, str]]]]] = []
        # The masks in effect: a cache of the stored values, told to ``on_secret`` as it learns them.
        self.redactor = Redactor(self.known_values, self.store.fingerprint, sink=on_secret)

    # -- the tool -------------------------------------------------------------------------------

    def tool(self) -> Tool:
        return Tool(
            name="credential_request",
            description=("Ask a person for a secret you need (an API token, a password). If it is already stored "
                         "and granted to you, you are told at once. You never see the value: tools get it "
                         "(http_request through its credential argument; shell_run when you list the name in its "
                         "credentials argument, as the environment variable NAME upper-cased with . and - as _, "
                         "unless the credential is limited to some hosts)."),
            parameters={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": NAME.pattern, "description": "e.g. github.token"},
                    "reason": {"type": "string", "minLength": 1, "maxLength": 500},
                    "scope": {"type": "string", "enum": ["agent", "shared"], "default": "agent"},
                },
                "required": ["name", "reason"],
                "additionalProperties": False,
            },
            risk=Risk.SAFE,  # always granted: asking is harmless, a person decides whether to answer
            function=self._request,
            timeout_s=self.timeout.total_seconds() + 60,
            recover=self._recover,
        )

    async def _request(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        name, scope = str(args["name"]), str(args.get("scope") or "agent")
        if usable := await self.store.usable(ctx.agent, name):
            return f"{name} is already stored and granted to you; use it ({how_to_use(preferred(usable))})."
        # A request only ever adds a value: one for a shared name that exists would replace the
        # operator's value (and its hosts) for every agent granted it, and an agent-scoped copy
        # would shadow it for this agent (its own value is preferred). Nobody is asked.
        if await self.store.stored(name, "shared", "") is not None:
            raise ToolError(_not_granted(name, ctx.agent))
        if (why := await why_nobody_is_asked(ctx, self.policy.trust, "request", f"credential:{name}")) is not None:
            raise ToolError({
                "subagent": f"{name} is not stored, and {SUBAGENT_CANNOT_ASK} (they can ask for it)",
                "restricted": f"asking people for {name} is {NOT_ALLOWED} ({ctx.trust}); nobody was asked; continue "
                              "without it",
                "not interactive": f"{name} is not stored and nobody can be asked for it here"}[why])
        now = self.clock.now()
        request = await self.store.park(CredentialRequestRow(
            session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.call_id, name=name,
            reason=str(args["reason"]), scope=scope, agent=ctx.agent, requester=ctx.requester,
            status=CredentialStatus.PENDING, created_at=now, expires_at=now + self.timeout,
        ))
        log.info("credential %s requested (request %s, session %s)", name, request.id, ctx.session_id)
        self.requests.announce(CredentialRequested(request.session, request))
        return await self._result(await self.requests.wait(request, ctx.turn_id))

    async def _recover(self, ctx: ToolContext, _args: dict[str, Any]) -> str | None:
        request = await self.store.for_call(ctx.session_id, ctx.call_id)
        if request is None or request.turn_id != ctx.turn_id:
            return None  # another turn's request (one failed after restarts), or a reused call id
        if request.status == CredentialStatus.PENDING:
            request = await self.requests.wait(request, ctx.turn_id)  # its Provide button works after a restart
        return await self._result(request)

    async def _result(self, request: CredentialRequestInfo) -> str:
        name = request.name
        if request.status == CredentialStatus.EXPIRED:
            raise ToolError(f"nobody provided {name} in time; continue without it")
        # Provided; or cancelled because a value was stored meanwhile (by another request, an operator).
        usable = await self.store.usable(request.agent, name)
        if usable or request.status == CredentialStatus.PROVIDED:
            how = f" ({how_to_use(preferred(usable))})" if usable else ""
            return f"{name} is now stored and granted to you; use it{how}."
        if request.scope == "shared" and await self.store.stored(name, "shared", "") is not None:
            raise ToolError(_not_granted(name, request.agent))
        raise ToolError(f"the request for {name} was cancelled; continue without it")

    async def _end(self, request_id: int, status: str, _reason: str | None
                   ) -> tuple[bool, CredentialRequestInfo | None]:
        return await self.store.settle(request_id, status, self.clock.now())

    # -- providing ------------------------------------------------------------------------------

    def validate(self, value: str) -> str | None:
        """Why a submitted value cannot be stored (shown next to the field), or None."""
        if not value.strip():
            return "Enter the value."
        if len(value.encode()) > self.max_bytes:
            return f"The value is longer than {self.max_bytes} bytes."
        stripped = value.strip()
        if stripped.startswith("-----BEGIN") and "\n" not in stripped:
            return "This looks like a PEM key whose line breaks were lost: paste it with its original line breaks."
        return None

    async def may_provide(self, user: str, request: CredentialRequestInfo) -> bool:
        """``user`` is a person of the request's channel: the form is offered only there, and the gateway
        refuses other channels' answers to it (``Gateway.provide``)."""
        agent = self.agents.get(request.agent)
        return await self.policy.may_decide(user, request.requester, agent.approvers, channel=request.session.channel)

    async def refusal(self, request: CredentialRequestInfo | None, by: str, *, operator: bool = False) -> str | None:
        """Why ``by`` cannot provide a value for ``request`` now, in the order a person is told (None: they may)."""
        if request is None:
            return "That credential request does not exist."
        if not operator and (why := await self.policy.untrusted(by, request.session, "provide",
                                                                 f"credential_request:{request.id}")) is not None:
            return why
        if not operator and not await self.may_provide(by, request):
            return "You can't provide this credential: you are not one of its approvers."
        if request.settled:
            return f"Already settled: {request.summary()}."
        return None

    async def provide(self, request_id: int, value: str, by: str, *, operator: bool = False,
                      hosts: object = None) -> ProvideResult:
        """``hosts``: where the value may be sent (see :func:`parse_hosts`); None: anywhere."""
        request = await self.store.get(request_id)
        if (refused := await self.refusal(request, by, operator=operator)) is not None:
            return ProvideResult(False, refused, request=request)
        assert request is not None
        problem = self.validate(value)
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request)
        allowed, problem = parse_hosts(hosts, secret=value)
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request, field="hosts")
        value = value.strip("\n") if value.strip().startswith("-----BEGIN") else value.strip()
        now = self.clock.now()
        secret = SecretRow(name=request.name, scope=request.scope,
                           agent=request.agent if request.scope == "agent" else "", key_id="", ciphertext="",
                           hosts=json.dumps(allowed) if allowed else None, created_by=by, created_at=now,
                           updated_at=now)
        outcome, settled = await self.store.provide(request_id, secret, seal=self._sealer(value), by=by, now=now)
        if outcome in ("expired", "exists") and settled is not None:
            self.requests.settled_here(settled)  # settled by this refusal: the waiter and the card learn it now
        if outcome == "expired":
            return ProvideResult(False, f"Too late: the request for {request.name} expired at "
                                        f"{request.expires_at:%Y-%m-%d %H:%M:%S} UTC; nothing was stored.",
                                 request=settled)
        if outcome == "exists":
            log.info("credential %s: request %s answered after a value was stored; not replaced",
                     request.name, request_id)
            return ProvideResult(False, (
                f"{request.name} ({request.scope} scope) was stored meanwhile, so your value was not stored and "
                f"the stored one was not replaced. Only an operator replaces a credential: "
                f"bot credentials set {request.name} --scope {request.scope} --agent {request.agent}"),
                request=settled)
        if outcome != "stored":
            return ProvideResult(False, f"Already settled: {settled.summary() if settled else 'gone'}.",
                                 request=settled)
        assert settled is not None
        self.redactor.learn(request.name, value)
        log.info("credential %s stored by %s (request %s)", request.name, by, request_id)
        self.requests.settled_here(settled)
        return ProvideResult(True, f"{settled.name} stored, sealed with key {self.keys.current!r}.", request=settled)

    async def get(self, request_id: int) -> CredentialRequestInfo | None:
        return await self.requests.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.requests.record_announcement(request_id, where)

    async def recent(self, session_id: str) -> list[CredentialRequestInfo]:
        return await self.requests.recent(session_id)

    async def expire_overdue(self) -> int:
        return await self.requests.expire_overdue()

    # -- use ------------------------------------------------------------------------------------

    async def env_for(self, ctx: ToolContext, names: list[str]) -> dict[str, str]:
        """The credentials a call names (and only those), as environment variables, opened for this call
        only. Each must be stored and granted to the agent, else nothing is opened (SPEC §16)."""
        rows: list[SecretRow] = []
        for name in dict.fromkeys(names):
            if not NAME.match(name):
                raise ToolError(f"{name!r} is not a credential name (names match {NAME.pattern})")
            found = await self.store.usable(ctx.agent, name)
            if not found:
                raise ToolError(f"no credential named {name!r} is stored and granted to you "
                                "(ask for it with credential_request)")
            rows.append(preferred(found))
        for row in rows:
            # A command could send the value anywhere: a credential limited to hosts goes only where
            # http_request can hold it to them.
            if (hosts := hosts_of(row)) is not None:
                raise ToolError(f"credential {row.name} may only be sent to {', '.join(hosts)}, so it is not "
                                f"given to shell_run, where a command could send it anywhere; use http_request "
                                f"with credential={row.name!r} (it is sent only to those hosts)")
        variables = [env_name(row.name) for row in rows]
        if len(set(variables)) < len(variables):
            raise ToolError("two of those credentials become the same environment variable; name only one")
        env = {variable: self._open(row) for variable, row in zip(variables, rows, strict=True)}
        await self.store.touch([r.id for r in rows if r.id is not None], self.clock.now())
        return env

    async def stored_names(self, agent: str) -> set[str]:
        """The names of the credentials stored for ``agent`` (its own, and shared ones granted to it): what a
        skill's ``requires.credentials`` is checked against (core.skill_access). Nothing is opened."""
        return {row.name for row in await self.store.usable(agent)}

    async def headers_for(self, ctx: ToolContext, name: str) -> CredentialUse:
        """The headers a credential adds to one request, and where it may be sent."""
        rows = await self.store.usable(ctx.agent, name)
        if not rows:
            raise ToolError(f"no credential named {name!r} is stored and granted to you "
                            "(ask for it with credential_request)")
        row = preferred(rows)
        await self.store.touch([row.id] if row.id is not None else [], self.clock.now())
        value = self._open(row)
        hosts = hosts_of(row)
        allowed = None if hosts is None else tuple(hosts)
        # A value that already names its header ("X-Api-Key: abc") is used as given; else a bearer token.
        header, sep, rest = value.partition(":")
        if sep and re.fullmatch(r"[A-Za-z0-9-]{1,64}", header) and "\n" not in value:
            return CredentialUse({header: rest.strip()}, allowed)
        return CredentialUse({"Authorization": f"Bearer {value}"}, allowed)

    async def redact(self, text: str) -> str:
        """Replace every stored secret value, and its derived forms, with ``[redacted:<name>]``."""
        return await self.redactor.redact(text)

    async def known_values(self) -> list[tuple[str, str]]:
        """Every stored (name, value), for the masks. Only the process's own memory sees them."""
        values = []
        for row in await self.store.all_secrets():
            try:
                values.append((row.name, self._open(row)))
            except VaultError as exc:
                log.warning("%s", exc)
        for load in self.also_masked:
            values += await load()
        return values

    def _open(self, row: SecretRow) -> str:
        return open_secret(self.keys, row)

    def _sealer(self, value: str) -> Callable[[SecretRow], None]:
        """Seals ``value`` into a row once the row has its id (the id is part of the associated data)."""
        def seal(row: SecretRow) -> None:
            assert row.id is not None
            sealed = self.keys.seal(value, context=row_context(row.name, row.scope, row.agent, row.id))
            row.key_id, row.ciphertext, row.aad_version = sealed.key_id, sealed.blob, ROW_AAD

        return seal

    # -- operators ------------------------------------------------------------------------------

    async def set_secret(self, name: str, value: str, *, scope: str, agent: str, by: str,
                         hosts: object = None) -> str:
        """Store (or replace) a value; ``hosts`` limits where it may be sent. Returns the key id."""
        if not NAME.match(name):
            raise InvalidInput(f"credential names match {NAME.pattern}")
        if scope not in ("agent", "shared"):
            raise InvalidInput("scope is agent or shared")
        problem = self.validate(value)
        if problem is not None:
            raise InvalidInput(problem)
        allowed, problem = parse_hosts(hosts, secret=value)
        if problem is not None:
            raise InvalidInput(problem)
        now = self.clock.now()
        row = await self.store.save_secret(
            SecretRow(name=name, scope=scope, agent=agent if scope == "agent" else "", key_id="", ciphertext="",
                      hosts=json.dumps(allowed) if allowed else None, created_by=by, created_at=now,
                      updated_at=now),
            seal=self._sealer(value), grant=agent, by=by, now=now)
        self.redactor.learn(name, value)
        return row.key_id

    async def upgrade_legacy(self) -> int:
        """Bind rows sealed before revision 0007 to their row (at start; core.sealed_values)."""
        return await bind_legacy_credentials(self.store, self.keys, self.clock)

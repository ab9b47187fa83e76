"""Credentials (SPEC §8): the agent asks, a person provides, the value is sealed and used per call.

The plaintext exists only while a value is being sealed, and while a tool call that needs it runs:
it is never stored unsealed, never logged, never sent to a channel or a model. Any stored value
that shows up in a tool's output is replaced by ``[redacted:<name>]`` before anything else sees it.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import jwt

from core.agents import AgentDirectory
from core.approvals import ApprovalPolicy
from core.clock import Clock
from core.errors import InvalidInput
from core.events import CredentialRequested, CredentialResolved, EventBus
from core.model import CredentialRequestInfo, CredentialStatus
from core.parking import Waiters
from core.store import CredentialStore
from core.store.tables import CredentialRequestRow, SecretRow
from core.tools import Risk, Tool, ToolContext, ToolError
from core.vault import KeyRing, Sealed, VaultError

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
LINK_MAX_AGE = timedelta(minutes=15)
_LINK_AUDIENCE = "credential-link"


def env_name(name: str) -> str:
    """``github.token`` → ``GITHUB_TOKEN`` (SPEC §2)."""
    return re.sub(r"[.-]", "_", name).upper()


@dataclass(frozen=True)
class ProvideResult:
    stored: bool
    message: str
    field_error: str | None = None  # shown next to the input: the request stays open
    request: CredentialRequestInfo | None = None


class CredentialService:
    def __init__(
        self, store: CredentialStore, keys: KeyRing, bus: EventBus, clock: Clock, policy: ApprovalPolicy,
        agents: AgentDirectory, *, timeout_s: float = 1800, max_bytes: int = 16_384, poll_s: float = 2.0,
        on_secret: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.keys = keys
        self.bus = bus
        self.clock = clock
        self.policy = policy
        self.agents = agents
        self.timeout = timedelta(seconds=timeout_s)
        self.max_bytes = max_bytes
        self.on_secret = on_secret  # e.g. the log filter learning a value to mask
        self._waiters = Waiters(clock, poll_s)

    # -- the tool -------------------------------------------------------------------------------

    def tool(self) -> Tool:
        return Tool(
            name="credential_request",
            description=("Ask a person for a secret you need (an API token, a password). If it is already stored "
                         "and granted to you, you are told at once. You never see the value: tools get it "
                         "(shell_run as the environment variable NAME upper-cased with . and - as _, "
                         "http_request through its credential argument)."),
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
        if await self.store.usable(ctx.agent, name):
            return f"{name} is already stored and granted to you; use it ({self._how(name)})."
        if not ctx.interactive:
            raise ToolError(f"{name} is not stored and nobody can be asked for it here")
        now = self.clock.now()
        request = await self.store.park(CredentialRequestRow(
            session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.call_id, name=name,
            reason=str(args["reason"]), scope=scope, agent=ctx.agent, requester=ctx.sender,
            status=CredentialStatus.PENDING, created_at=now, expires_at=now + self.timeout,
        ))
        log.info("credential %s requested (request %s, session %s)", name, request.id, ctx.session_id)
        self.bus.emit(CredentialRequested(request.session, request))
        return self._result(await self._wait(request))

    async def _recover(self, ctx: ToolContext, _args: dict[str, Any]) -> str | None:
        request = await self.store.for_call(ctx.session_id, ctx.call_id)
        if request is None:
            return None
        if request.status == CredentialStatus.PENDING:
            request = await self._wait(request)  # its Provide button keeps working after a restart
        return self._result(request)

    def _result(self, request: CredentialRequestInfo) -> str:
        if request.status == CredentialStatus.PROVIDED:
            return f"{request.name} is now stored and granted to you; use it ({self._how(request.name)})."
        if request.status == CredentialStatus.EXPIRED:
            raise ToolError(f"nobody provided {request.name} in time; continue without it")
        raise ToolError(f"the request for {request.name} was cancelled; continue without it")

    @staticmethod
    def _how(name: str) -> str:
        return f"shell_run sees ${env_name(name)}; http_request takes credential={name!r}"

    async def _wait(self, request: CredentialRequestInfo) -> CredentialRequestInfo:
        async def expire(request_id: int) -> CredentialRequestInfo:
            return await self._settle(request_id, CredentialStatus.EXPIRED)

        async def cancel(request_id: int) -> object:
            return await self._settle(request_id, CredentialStatus.CANCELLED)

        return await self._waiters.wait(
            request, load=self.store.get, expire=expire, cancel=cancel,
            settled_elsewhere=lambda current: self.bus.emit(CredentialResolved(current.session, current)),
        )

    async def _settle(self, request_id: int, status: str) -> CredentialRequestInfo:
        won, request = await self.store.settle(request_id, status, self.clock.now())
        assert request is not None
        if won:
            self._announce_settled(request)
        return request

    def _announce_settled(self, request: CredentialRequestInfo) -> None:
        self._waiters.wake(request.id)
        self.bus.emit(CredentialResolved(request.session, request))

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
        agent = self.agents.get(request.agent)
        return await self.policy.may_decide(user, request.requester, agent.approvers)

    async def provide(self, request_id: int, value: str, by: str, *, operator: bool = False) -> ProvideResult:
        request = await self.store.get(request_id)
        if request is None:
            return ProvideResult(False, "That credential request does not exist.")
        if not operator and not await self.may_provide(by, request):
            return ProvideResult(False, "You can't provide this credential: you are not one of its approvers.",
                                 request=request)
        if request.settled:
            return ProvideResult(False, f"Already settled: {request.summary()}.", request=request)
        problem = self.validate(value)
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request)
        value = value.strip("\n") if value.strip().startswith("-----BEGIN") else value.strip()
        sealed = self.keys.seal(value, context=request.name)
        now = self.clock.now()
        secret = SecretRow(name=request.name, scope=request.scope,
                           agent=request.agent if request.scope == "agent" else "", key_id=sealed.key_id,
                           ciphertext=sealed.blob, created_by=by, created_at=now, updated_at=now)
        won, settled = await self.store.provide(request_id, secret, by=by, now=now)
        if not won:
            return ProvideResult(False, f"Already settled: {settled.summary() if settled else 'gone'}.",
                                 request=settled)
        assert settled is not None
        if self.on_secret is not None:
            self.on_secret(value)
        log.info("credential %s stored by %s (request %s)", request.name, by, request_id)
        self._announce_settled(settled)
        return ProvideResult(True, f"{settled.name} stored, sealed with key {sealed.key_id!r}.", request=settled)

    async def get(self, request_id: int) -> CredentialRequestInfo | None:
        return await self.store.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, Any]) -> None:
        await self.store.record_announcement(request_id, where)

    async def recent(self, session_id: str) -> list[CredentialRequestInfo]:
        return await self.store.recent(session_id)

    async def expire_overdue(self) -> int:
        overdue = await self.store.pending(due_before=self.clock.now())
        for request in overdue:
            await self._settle(request.id, CredentialStatus.EXPIRED)
        return len(overdue)

    # -- one-time links (where no modal can be shown) -------------------------------------------

    async def create_link(self, request_id: int) -> str:
        request = await self.store.get(request_id)
        if request is None or request.settled:
            raise InvalidInput("that credential request is not open")
        jti = secrets.token_urlsafe(16)
        expires = min(self.clock.now() + LINK_MAX_AGE, request.expires_at)
        await self.store.add_link(jti, request_id, expires)
        return jwt.encode({"jti": jti, "rid": request_id, "exp": expires, "aud": _LINK_AUDIENCE},
                          self.keys.derive("credential-links"), algorithm="HS256")

    async def check_link(self, token: str) -> tuple[CredentialRequestInfo | None, str]:
        """The request a link opens, or None and why not (expired, used, unknown)."""
        try:
            claims = jwt.decode(token, self.keys.derive("credential-links"), algorithms=["HS256"],
                                audience=_LINK_AUDIENCE, options={"require": ["exp", "jti", "aud"]})
        except jwt.ExpiredSignatureError:
            return None, "This link has expired. Ask the bot for a new one."
        except jwt.InvalidTokenError:
            return None, "This link is not valid."
        link = await self.store.link(str(claims["jti"]))
        if link is None or link.request_id != claims.get("rid"):
            return None, "This link is not valid."
        if link.used_at is not None:
            return None, "This link has already been used."
        request = await self.store.get(link.request_id)
        if request is None or request.settled:
            return None, f"This request is closed: {request.summary() if request else 'gone'}."
        return request, ""

    async def provide_via_link(self, token: str, value: str) -> ProvideResult:
        request, why = await self.check_link(token)
        if request is None:
            return ProvideResult(False, why)
        problem = self.validate(value)
        if problem is not None:
            return ProvideResult(False, problem, field_error=problem, request=request)
        claims = jwt.decode(token, options={"verify_signature": False})
        if not await self.store.burn(str(claims["jti"]), self.clock.now()):
            return ProvideResult(False, "This link has already been used.")
        # Whoever holds the link was chosen to answer: it is the approval.
        return await self.provide(request.id, value, by="one-time link", operator=True)

    # -- use ------------------------------------------------------------------------------------

    async def env_for(self, ctx: ToolContext) -> dict[str, str]:
        """Every credential the agent may use, as environment variables, opened for this call only."""
        rows = await self.store.usable(ctx.agent)
        env = {env_name(row.name): self._open(row) for row in rows}
        await self.store.touch([r.id for r in rows if r.id is not None], self.clock.now())
        return env

    async def headers_for(self, ctx: ToolContext, name: str) -> dict[str, str]:
        rows = await self.store.usable(ctx.agent, name)
        if not rows:
            raise ToolError(f"no credential named {name!r} is stored and granted to you "
                            "(ask for it with credential_request)")
        await self.store.touch([r.id for r in rows if r.id is not None], self.clock.now())
        value = self._open(rows[0])
        # A value that already names its header ("X-Api-Key: abc") is used as given; else a bearer token.
        header, sep, rest = value.partition(":")
        if sep and re.fullmatch(r"[A-Za-z0-9-]{1,64}", header) and "\n" not in value:
            return {header: rest.strip()}
        return {"Authorization": f"Bearer {value}"}

    async def redact(self, text: str) -> str:
        """Replace every stored secret value in ``text`` with ``[redacted:<name>]``."""
        if not text:
            return text
        for row in await self.store.all_secrets():
            try:
                value = self._open(row)
            except VaultError:
                continue
            if len(value) >= 4 and value in text:
                text = text.replace(value, f"[redacted:{row.name}]")
        return text

    async def known_values(self) -> list[str]:
        """Every stored value (for the log filter at start). Only the process's own memory sees them."""
        values = []
        for row in await self.store.all_secrets():
            try:
                values.append(self._open(row))
            except VaultError as exc:
                log.warning("%s", exc)
        return values

    def _open(self, row: SecretRow) -> str:
        return self.keys.open(Sealed(row.key_id, row.ciphertext), context=row.name)

    # -- operators ------------------------------------------------------------------------------

    async def set_secret(self, name: str, value: str, *, scope: str, agent: str, by: str) -> str:
        if not NAME.match(name):
            raise InvalidInput(f"credential names match {NAME.pattern}")
        if scope not in ("agent", "shared"):
            raise InvalidInput("scope is agent or shared")
        problem = self.validate(value)
        if problem is not None:
            raise InvalidInput(problem)
        sealed = self.keys.seal(value, context=name)
        now = self.clock.now()
        await self.store.save_secret(
            SecretRow(name=name, scope=scope, agent=agent if scope == "agent" else "", key_id=sealed.key_id,
                      ciphertext=sealed.blob, created_by=by, created_at=now, updated_at=now),
            grant=agent, by=by, now=now)
        return sealed.key_id

    async def rotate(self, progress: Callable[[str], None]) -> tuple[int, int]:
        """Re-seal every secret not under the current key, one at a time. Returns (re-sealed, already current).
        Safe to interrupt: each secret is committed on its own, and a second run finds nothing to do."""
        moved = current = 0
        for row in await self.store.all_secrets():
            if row.key_id == self.keys.current:
                current += 1
                continue
            sealed = self.keys.seal(self._open(row), context=row.name)
            assert row.id is not None
            if await self.store.reseal(row.id, expected_key=row.key_id, key_id=sealed.key_id,
                                       ciphertext=sealed.blob, now=self.clock.now()):
                moved += 1
                progress(f"re-sealed {row.name} ({row.scope}{': ' + row.agent if row.agent else ''}) "
                         f"from key {row.key_id!r} to {sealed.key_id!r}")
        return moved, current

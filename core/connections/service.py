"""Connections (SPEC §16): tokens the agent acts through, and calls that pause until someone connects.

A call that needs a connection gets its bearer token here (refreshed first when it has expired). When
there is none, it expired past refresh, or it lacks a scope, the call parks (``waiting_connection``) on a
request in the database, exactly like approvals and credentials (core.parking), until someone completes
consent (core.connections.consent), the request expires (CONNECTION_TIMEOUT_S), or the turn is stopped.
The call that parked goes on once: ``mark_resumed`` is a conditional update, so a restart, another
replica or a second callback never runs it twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import timedelta

from core.approval_policy import ApprovalPolicy
from core.clock import Clock
from core.connections.spec import ConnectionSpec, OAuthClient, TokenSet
from core.errors import InvalidInput, NotFound, OAuthError, ToolError, VaultError
from core.events import ConnectionRequested, ConnectionResolved, EventBus
from core.model import ConnectionGap, ConnectionRequestInfo, ConnectionStatus, thread_of
from core.requests import PersonRequests, why_nobody_is_asked
from core.store.connection_tables import ConnectionRequestRow, ConnectionRow
from core.store.connections import ConnectionStore
from core.store.schedules import firing_schedule
from core.stored_secrets import CredentialUse
from core.tools import SUBAGENT_CANNOT_ASK, ToolContext
from core.trust import NOT_ALLOWED
from core.vault import KeyRing, Sealed
from core.views import ConnectionView

log = logging.getLogger(__name__)
EXPIRY_SKEW = timedelta(seconds=30)  # a token this close to its expiry is refreshed before use
REFRESH_RACE = timedelta(seconds=3)  # how long a refused refresh waits for another replica's new tokens
REFRESH_CLAIM = timedelta(seconds=20)  # one replica refreshes an account at a time, for at most this long


def seal_context(name: str, owner: str, row_id: int) -> str:
    """What a connection's sealed tokens are bound to: they open only in their own row."""
    return f"conn|{name}|{owner}|{row_id}"


def connection_label(row: ConnectionRow) -> str:
    """How errors and operators name a connected account (never its tokens)."""
    return f"connection {row.name!r} ({row.owner or 'shared'})"


class ConnectionService:
    def __init__(self, specs: dict[str, ConnectionSpec], store: ConnectionStore, keys: KeyRing,
                 client: OAuthClient, bus: EventBus, clock: Clock, policy: ApprovalPolicy, *,
                 timeout_s: float = 1800, poll_s: float = 2.0,
                 learn: Callable[[str, str], None] | None = None) -> None:
        self.specs = specs
        self.store = store
        self.keys = keys
        self.client = client
        self.bus = bus
        self.clock = clock
        self.policy = policy
        self.timeout = timedelta(seconds=timeout_s)
        self.learn = learn  # the masks learn every token as it is stored
        self.requests = PersonRequests("connection request", store.requests, bus, clock, poll_s=poll_s,
                                       end=self._end, resolved=lambda request: ConnectionResolved(request.session,
                                                                                                  request))
        # One refresh at a time per account in this process (a rotating refresh token works once);
        # across replicas the loser finds the winner's tokens (``_refresh``).
        self._refreshing: dict[tuple[str, str], asyncio.Lock] = {}
        self._taught: set[str] = set()

    def spec(self, name: str) -> ConnectionSpec:
        spec = self.specs.get(name)
        if spec is None:
            known = ", ".join(sorted(self.specs)) or "none"
            raise ToolError(f"no connection named {name!r} is configured (bot.toml [[connections]]; known: {known})")
        return spec

    def holds_accounts(self, user: str, channel: str | None) -> bool:
        """Whether ``user`` of ``channel`` may have personal accounts here. They are stored under the bare id (the
        rows record no channel), so a person whose bare id another channel claims (a plug-in channel's "U1", the
        shape of Slack's U1) has none: they would act through, list and disconnect the other channel's person's
        accounts. ``channel`` None: not known (a conversation without its session row), compared by id alone."""
        claimed, _ident = self.policy.people.owner(user)
        return channel is None or claimed is None or claimed == channel

    @staticmethod
    def owner_for(spec: ConnectionSpec, person: str | None) -> str:
        return "" if spec.owner == "shared" else (person or "")

    # -- using one ------------------------------------------------------------------------------

    async def use(self, ctx: ToolContext, name: str, *, need_scopes: tuple[str, ...] = (),
                  rejected: str | None = None) -> CredentialUse:
        """The header a call sends and the hosts it may go to. ``need_scopes``: the resource said these are
        missing (403 insufficient_scope). ``rejected``: the resource answered 401 to this token, so it is
        refreshed once. A gap parks the call until someone connects (or fails it, when nobody can)."""
        spec = self.spec(name)
        owner = self.owner_for(spec, ctx.sender)
        if spec.owner == "user" and not owner:
            raise ToolError(f"{name} connects each person's own account, and this turn has no person to act as")
        if spec.owner == "user":
            if not self.holds_accounts(owner, await self.store.session_channel(thread_of(ctx.session_id))):
                raise ToolError(f"{name} connects each person's own account, and on this channel {owner} names "
                                "another channel's person (accounts are kept by bare id); continue without it")
            await self._alone(ctx, name, owner)
        waited = await self._resume_parked(ctx, spec)
        if waited is not None:
            await _still_goes_on(ctx)
        row = await self.store.get(name, owner)
        gap, token = await self._check(spec, row, need_scopes, rejected)
        if gap is not None and waited is None:
            waited = await self._pause(ctx, spec, owner, gap, need_scopes)
            await _still_goes_on(ctx)
            row = await self.store.get(name, owner)
            gap, token = await self._check(spec, row, need_scopes, None)
        if gap is not None or token is None or row is None:
            raise ToolError(f"{name} is still not usable after connecting ({gap or 'no token'}); "
                            "continue without it")
        assert row.id is not None
        self._teach(name, token)  # masked here too, even if another replica stored it
        await self.store.touch(row.id, self.clock.now())
        return CredentialUse({"Authorization": f"Bearer {token}"}, spec.hosts)

    async def _alone(self, ctx: ToolContext, name: str, owner: str) -> None:
        """Someone else's words must not steer a person's account: it is used only in a conversation that nobody
        else wrote in (a sub-agent's is its parent's). A schedule's firing is its creator's prompt alone, but the
        schedule was shaped where it was asked for: the people recorded there count."""
        thread = thread_of(ctx.session_id)
        writers = await self.store.conversation_senders(thread)
        schedule = firing_schedule(thread)
        if writers is None:  # only a firing's can be unknown
            which = f"schedule {schedule}" if schedule is not None else "this schedule"
            raise ToolError(f"{name} acts as {owner}'s own account, and it is not recorded who had written where "
                            f"{which} was asked for (it was made before the bot recorded that); a schedule's "
                            "firings use it only when its creator was alone there. Continue without it.")
        others = [who for who in writers if who != owner]
        if not others:
            return
        if schedule is not None:
            raise ToolError(f"{name} acts as {owner}'s own account, and schedule {schedule} was asked for in a "
                            f"conversation that also had messages from {', '.join(others[:5])}; its firings use it "
                            f"only when {owner} was alone there. Continue without it.")
        raise ToolError(f"{name} acts as {owner}'s own account, and this conversation also has messages from "
                        f"{', '.join(others[:5])}; it is used only in conversations with {owner} alone (a DM "
                        "with the bot, or a thread of their own). Continue without it.")

    async def _check(self, spec: ConnectionSpec, row: ConnectionRow | None, need: tuple[str, ...],
                     rejected: str | None) -> tuple[ConnectionGap | None, str | None]:
        """What is missing, or the access token to send (refreshed when due)."""
        if row is None:
            return ConnectionGap.ABSENT, None
        granted = json.loads(row.scopes)
        if granted is not None and any(scope not in granted for scope in need):
            return ConnectionGap.INSUFFICIENT_SCOPE, None
        tokens = self.open(row)
        access = str(tokens.get("access_token") or "")
        due = row.expires_at is not None and row.expires_at <= self.clock.now() + EXPIRY_SKEW
        if rejected is not None and rejected != access:
            return None, access  # someone refreshed it meanwhile: try the new one
        if not due and rejected is None:
            return None, access
        refresh = tokens.get("refresh_token")
        if not row.refreshable or not refresh:
            return ConnectionGap.EXPIRED, None
        return await self._refresh(spec, row, str(refresh))

    async def _refresh(self, spec: ConnectionSpec, row: ConnectionRow, refresh: str
                       ) -> tuple[ConnectionGap | None, str | None]:
        key = (row.name, row.owner)
        async with self._refreshing.setdefault(key, asyncio.Lock()):
            current = await self.store.get(row.name, row.owner)
            if current is None:
                return ConnectionGap.ABSENT, None
            if current.ciphertext != row.ciphertext:  # refreshed while this one waited: use that
                return None, self._token(current)
            assert current.id is not None
            now = self.clock.now()
            if not await self.store.claim_refresh(current.id, expected_ciphertext=current.ciphertext, now=now,
                                                  until=now + REFRESH_CLAIM):
                # Another replica is refreshing: its tokens, once stored.
                if (fresh := await self._refreshed_elsewhere(current, REFRESH_CLAIM)) is not None:
                    return None, self._token(fresh)
                raise ToolError(f"the {spec.name} token is being refreshed elsewhere and it did not finish; "
                                "try again")
            return await self._refresh_now(spec, current, refresh)

    async def _refresh_now(self, spec: ConnectionSpec, row: ConnectionRow, refresh: str
                           ) -> tuple[ConnectionGap | None, str | None]:
        assert row.id is not None
        try:
            fresh = await self.client.refresh(spec, refresh)
        except OAuthError as exc:
            if not exc.invalid_grant:
                await self.store.release_refresh(row.id)
                raise ToolError(f"could not refresh the {spec.name} token: {exc}") from None
            if (current := await self._refreshed_elsewhere(row, REFRESH_RACE)) is not None:
                return None, self._token(current)
            log.info("connection %s (%s): refresh refused, consent needed again", spec.name, row.owner or "shared")
            await self.store.mark_expired(row.id, expected_ciphertext=row.ciphertext, now=self.clock.now(),
                                          why=str(exc))
            return ConnectionGap.EXPIRED, None
        keep = fresh if fresh.refresh_token else TokenSet(fresh.access_token, refresh, fresh.expires_at,
                                                           fresh.scopes, fresh.token_type, fresh.extra)
        sealed = self._seal(keep, row.name, row.owner, row.id)
        self.learn_tokens(row.name, keep)
        won = await self.store.replace_tokens(
            row.id, expected_ciphertext=row.ciphertext, key_id=sealed.key_id, ciphertext=sealed.blob,
            expires_at=keep.expires_at, refreshable=keep.refresh_token is not None,
            scopes=json.dumps(list(keep.scopes)) if keep.scopes is not None else None, now=self.clock.now(),
            by="system")
        if won:
            return None, keep.access_token
        current = await self.store.get(row.name, row.owner)  # another process refreshed first: theirs stands
        if current is None:
            return ConnectionGap.ABSENT, None
        return None, self._token(current)

    async def _refreshed_elsewhere(self, row: ConnectionRow, wait: timedelta) -> ConnectionRow | None:
        """The row once its tokens changed (another process refreshed them), waiting up to ``wait``."""
        deadline = self.clock.now() + wait
        while True:
            current = await self.store.get(row.name, row.owner)
            if current is None or current.ciphertext != row.ciphertext:
                return current
            if self.clock.now() >= deadline:
                return None
            await asyncio.sleep(0.1)

    # -- parking --------------------------------------------------------------------------------

    async def _resume_parked(self, ctx: ToolContext, spec: ConnectionSpec) -> ConnectionRequestInfo | None:
        """A call re-run after a restart finds the request it parked on: waits on it again if still open,
        goes on (once) if it was completed meanwhile."""
        found = await self.store.for_call(ctx.session_id, ctx.call_id, ctx.turn_id)
        if found is None or found[1] or found[0].connection != spec.name:
            return None
        request = found[0]
        if request.status == ConnectionStatus.PENDING:
            request = await self.requests.wait(request, ctx.turn_id)
        return await self._went_on(request)

    async def _pause(self, ctx: ToolContext, spec: ConnectionSpec, owner: str, gap: ConnectionGap,
                     need: tuple[str, ...]) -> ConnectionRequestInfo:
        problem = ConnectionRequestInfo.ask_for(spec.name, gap, need)
        if spec.authorize_url is None:
            raise ToolError(f"{problem}: but {spec.name} has no authorize_url, so nobody can be sent to connect "
                            "it; an operator must configure it. Continue without it.")
        # As for credentials: nobody is sent to connect an account on a guest's, an outsider's or a bot's word
        # (a risk = "safe" MCP server's call reaches here with no approval in between).
        if (why := await why_nobody_is_asked(ctx, self.policy.trust, "connect", f"connection:{spec.name}")) is not None:
            raise ToolError(f"{problem}: " + {
                "subagent": f"{SUBAGENT_CANNOT_ASK} (they can connect it)",
                "restricted": f"asking people to connect {spec.name} is {NOT_ALLOWED} ({ctx.trust}); nobody was "
                              "asked; continue without it",
                "not interactive": "nobody can be asked to connect it here; continue without it"}[why])
        now = self.clock.now()
        request = await self.store.park(ConnectionRequestRow(
            session_id=ctx.session_id, turn_id=ctx.turn_id, tool_call_id=ctx.call_id, connection=spec.name,
            principal=owner, gap=gap, scopes=json.dumps(list(need)), agent=ctx.agent,
            status=ConnectionStatus.PENDING, created_at=now, expires_at=now + self.timeout))
        log.info("connection %s needed (%s): request %s, session %s", spec.name, gap, request.id, ctx.session_id)
        self.requests.announce(ConnectionRequested(request.session, request))
        return await self._went_on(await self.requests.wait(request, ctx.turn_id))

    async def _went_on(self, request: ConnectionRequestInfo) -> ConnectionRequestInfo:
        """The outcome the call goes on with (once: a second caller for the same request is refused)."""
        if not await self.store.mark_resumed(request.id, self.clock.now()):
            raise ToolError(f"this call already went on after the request to connect {request.connection}")
        if request.status == ConnectionStatus.EXPIRED:
            seconds = self.timeout.total_seconds()
            waited = f"{seconds / 60:g} minutes" if seconds >= 120 else f"{seconds:g} seconds"
            raise ToolError(f"nobody connected {request.connection} within {waited}, so the call did not run; "
                            "continue without it")
        if request.status != ConnectionStatus.CONNECTED:
            raise ToolError(f"the request to connect {request.connection} was cancelled; continue without it")
        return request

    async def _end(self, request_id: int, status: str, _reason: str | None
                   ) -> tuple[bool, ConnectionRequestInfo | None]:
        return await self.store.settle(request_id, ConnectionStatus(status), self.clock.now())

    async def resumable(self, ctx: ToolContext) -> bool:
        """Whether a call a crash left without result was parked here and never went on (run it again: it
        waits on, or goes on once)."""
        found = await self.store.for_call(ctx.session_id, ctx.call_id, ctx.turn_id)
        return found is not None and not found[1]  # pending, completed, or ended unreported: it says which

    async def expire_overdue(self) -> int:
        return await self.requests.expire_overdue()

    async def get(self, request_id: int) -> ConnectionRequestInfo | None:
        return await self.requests.get(request_id)

    async def record_announcement(self, request_id: int, where: dict[str, object]) -> None:
        await self.requests.record_announcement(request_id, dict(where))

    # -- listing and disconnecting --------------------------------------------------------------

    async def views(self, owner: str | None = None, *, with_shared: bool = False) -> list[ConnectionView]:
        """Connected accounts (``owner``: one person's; ``with_shared``: and the shared ones). Never a token."""
        rows = await self.store.listed(owner)
        if with_shared and owner:
            rows += await self.store.listed("")
        return [ConnectionView(name=r.name, owner=r.owner, scopes=_scopes(r), expires_at=r.expires_at,
                               refreshable=r.refreshable, connected_by=r.connected_by, updated_at=r.updated_at,
                               last_used_at=r.last_used_at) for r in rows]

    async def disconnect(self, name: str, owner: str, *, by: str, force: bool = False) -> str:
        """Revoke at the provider first (RFC 7009), then delete here. A failed revocation deletes nothing
        unless ``force``."""
        if name not in self.specs:
            raise NotFound(f"no connection named {name!r} is configured")
        spec = self.specs[name]
        owner = "" if spec.owner == "shared" else owner
        row = await self.store.get(name, owner)
        if row is None:
            whose = "shared" if not owner else f"of {owner}"
            raise NotFound(f"there is no {name} connection {whose}")
        assert row.id is not None
        revoked, problem = False, None
        if spec.revoke_url:
            try:
                tokens = self.open(row)
                for kind in ("refresh_token", "access_token"):  # revoking the refresh token ends the grant
                    if tokens.get(kind):
                        await self.client.revoke(spec, str(tokens[kind]), kind)
                revoked = True
            except (OAuthError, VaultError) as exc:
                problem = str(exc)
        if problem is not None and not force:
            await self.store.audit(self.clock.now(), by, "connection.revoke_failed", f"connection:{name}",
                                   {"owner": owner, "error": problem})
            whose = f" --user {owner}" if owner else ""
            raise InvalidInput(f"could not revoke the {name} token at the provider ({problem}); nothing was "
                               f"deleted. Try again later; an operator can delete it here anyway with "
                               f"`bot connections disconnect {name}{whose} --force` (the provider then keeps the "
                               "grant until it expires or is revoked there).")
        if not await self.store.delete(row.id, expected_ciphertext=row.ciphertext, by=by, now=self.clock.now(),
                                       detail={"revoked": revoked, "forced": problem is not None, "error": problem}):
            raise InvalidInput(f"the {name} connection changed while it was being removed (reconnected or "
                               "refreshed); nothing was deleted: try again")
        if revoked:
            return f"{name} disconnected: revoked at the provider, deleted here."
        if problem is not None:
            return f"{name} deleted here (forced); the provider refused the revocation: {problem}"
        return f"{name} deleted here ({name} has no revoke_url: revoke the grant at the provider too)."

    # -- tokens ---------------------------------------------------------------------------------

    def open(self, row: ConnectionRow) -> dict[str, object]:
        assert row.id is not None
        text = self.keys.open(Sealed(row.key_id, row.ciphertext), seal_context(row.name, row.owner, row.id),
                              label=connection_label(row))
        opened = json.loads(text)
        return opened if isinstance(opened, dict) else {}

    def _seal(self, tokens: TokenSet, name: str, owner: str, row_id: int) -> Sealed:
        plain = json.dumps({"access_token": tokens.access_token, "refresh_token": tokens.refresh_token})
        return self.keys.seal(plain, seal_context(name, owner, row_id))

    def learn_tokens(self, name: str, tokens: TokenSet) -> None:
        for value in (tokens.access_token, tokens.refresh_token):
            if value:
                self._teach(name, value)

    def _teach(self, name: str, value: str) -> None:
        """The masks learn a token once (each lesson rebuilds them)."""
        if self.learn is not None and value not in self._taught:
            self._taught.add(value)
            self.learn(f"connection:{name}", value)

    def _token(self, row: ConnectionRow) -> str:
        return str(self.open(row).get("access_token") or "")

    async def known_values(self) -> list[tuple[str, str]]:
        """Every stored token as (label, value), for the masks."""
        values: list[tuple[str, str]] = []
        for row in await self.store.listed():
            try:
                tokens = self.open(row)
            except VaultError as exc:
                log.warning("%s", exc)
                continue
            values += [(f"connection:{row.name}", str(v)) for k, v in tokens.items()
                       if k in ("access_token", "refresh_token") and v]
        return values


def _scopes(row: ConnectionRow) -> tuple[str, ...] | None:
    granted = json.loads(row.scopes)
    return tuple(granted) if isinstance(granted, list) else None


async def _still_goes_on(ctx: ToolContext) -> None:
    """After the consent it waited for: the call was allowed before the pause, and a change freeze that began
    meanwhile refuses it (ToolError) all the same (core.approvals.ApprovalBroker.goes_on)."""
    if ctx.goes_on is not None and (why := await ctx.goes_on()) is not None:
        raise ToolError(why)

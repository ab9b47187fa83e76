"""Operator commands that act on the database directly (every running process sees the result)."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from bot.config.file import load_agents, load_config, load_policies
from bot.errors import DB_HINT, BotError, Failed, NotFoundError, Refused
from bot.home import secure_home
from bot.keys import load_keyring
from bot.people import people
from bot.settings import Settings, load_settings
from core.agents import AgentDirectory
from core.approval_policy import ApprovalPolicy
from core.approvals import ApprovalBroker
from core.clock import SystemClock
from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from core.display import visible
from core.errors import InvalidInput, StoreError, VaultError
from core.events import EventBus
from core.freezes import Freezes, parse_until
from core.hosts import parse_hosts
from core.policies import PolicyBook
from core.replies import asked_by
from core.store import ApprovalStore, CredentialStore, Database
from core.store.freezes import FreezeStore
from core.stored_secrets import credential_views
from core.tools import canonical_call


@dataclass
class _Core:
    settings: Settings
    approvals: ApprovalBroker
    credentials: CredentialService
    agents: AgentDirectory
    freezes: Freezes


@asynccontextmanager
async def _core() -> AsyncIterator[_Core]:
    settings = load_settings()
    secure_home(settings)  # before the database file is opened (or created): 0700 folders, 0600 files
    db = Database(settings.resolved_database_url)
    try:
        await db.migrate()
        agents = AgentDirectory(load_agents(settings.bot_config, default_instructions=settings.bot_instructions))
        policy = ApprovalPolicy(settings.approvers, settings.admins, people=people())
        bus, clock = EventBus(), SystemClock()
        freezes = Freezes(FreezeStore(db), clock, load_config(settings.bot_config).freeze_windows())
        yield _Core(
            settings,
            ApprovalBroker(ApprovalStore(db), bus, clock, policy, agents, timeout_s=settings.approval_timeout_s,
                           policies=PolicyBook(load_policies(settings.bot_config)), freezes=freezes),
            CredentialService(CredentialStore(db), load_keyring(settings), bus, clock, policy, agents,
                              timeout_s=settings.credential_timeout_s, max_bytes=settings.credential_max_bytes),
            agents,
            freezes,
        )
    except StoreError as exc:
        raise Failed(f"{exc}; {DB_HINT}") from exc
    except VaultError as exc:  # a key the settings lack: fixed in BOT_SECRET_KEYS
        raise BotError(str(exc)) from exc
    finally:
        await db.close()


def read_secret(name: str) -> str:
    """From stdin when piped (``… | bot credentials set NAME``), else a prompt that does not echo."""
    if not sys.stdin.isatty():
        return sys.stdin.read()
    return getpass.getpass(f"Value for {name} (not shown): ")


def operator_name() -> str:
    try:
        return f"operator:{getpass.getuser()}"
    except (KeyError, OSError):
        return "operator"


async def audit_command(args: argparse.Namespace) -> int:
    """``bot audit export``: the audit trail from --since (to --until) on stdout; the count on stderr."""
    from bot.audit_export import parse_day, write

    since, until = parse_day(args.since), parse_day(args.until) if args.until else None
    async with _core() as core:
        rows = await core.approvals.audit_entries(since, until)
    count = write(rows, args.format)
    print(f"{count} audit event(s) since {since.isoformat()}", file=sys.stderr)
    return 0


async def approvals_command(args: argparse.Namespace) -> int:
    async with _core() as core:
        broker = core.approvals
        if args.verb == "list":
            pending = await broker.pending()
            if not pending:
                print("no pending approval requests")
            for p in pending:  # the arguments whole, with whitespace and invisible characters marked
                asked = asked_by(p, limit=len(p.other_senders))  # the words the Slack card and /bot use, all names
                print(f"{p.id}\t{p.tool}\t{p.session.id}\t{asked}"
                      f"\texpires {p.expires_at:%Y-%m-%d %H:%M} UTC\t{visible(canonical_call(p.arguments))}")
            return 0
        if args.verb in ("approve", "deny"):
            result = await broker.decide(args.id, args.verb, by=operator_name(),
                                         reason=getattr(args, "reason", None), operator=True)
            if result.request is None:
                raise NotFoundError(f"there is no approval request {args.id}; `bot approvals list` shows them")
            if result.expired:
                raise Refused(f"request {args.id} expired at {result.request.expires_at:%Y-%m-%d %H:%M:%S} UTC; "
                              f"nothing was {'approved' if args.verb == 'approve' else 'denied'}")
            if not result.won:
                raise Refused(result.message)
            print(result.message)
            return 0
        if args.verb == "grants":
            grants = await broker.grants(every=True)  # revoked and expired ones too, marked: the record
            if not grants:
                print("no grants")
            now = broker.clock.now()
            for g in grants:  # each covers one exact call: printed whole
                where = f"thread {g.thread}" if g.thread is not None else f"place {g.place or '-'}"
                revoked = f"revoked by {g.revoked_by} at {g.revoked_at:%Y-%m-%d %H:%M} UTC" if g.revoked_at else \
                    "not revoked"
                print(f"{g.id}\tagent {g.agent}\ttool {g.tool}\tscope {where}"
                      f"\tby {g.created_by} at {g.created_at:%Y-%m-%d %H:%M} UTC\texpires {g.expiry(now)}"
                      f"\t{revoked}\tcall {visible(g.describe())}")
            return 0
        if args.verb == "revoke":
            try:
                print(await broker.revoke_grant(args.id, by=operator_name(), channel=None, operator=True))
            except InvalidInput as exc:  # no such active grant (an operator is always allowed)
                raise NotFoundError(f"{str(exc).rstrip('.')}; `bot approvals grants` shows them") from exc
            return 0
    return 2


async def credentials_command(args: argparse.Namespace, value: str | None) -> int:
    async with _core() as core:
        service = core.credentials
        if args.verb == "list":
            stored = await credential_views(service.store)
            if not stored:
                print("no stored credentials")
            for c in stored:
                used = f"{c.last_used_at:%Y-%m-%d %H:%M} UTC" if c.last_used_at else "never"
                hosts = ", ".join(c.hosts or ["any"])
                print(f"{c.name}\t{c.describe()}\thosts {hosts}\tkey {c.key_id}\tstored by {c.created_by} "
                      f"{c.updated_at:%Y-%m-%d %H:%M} UTC\tlast used {used}")
            return 0
        if args.verb == "set":
            assert value is not None
            agent = args.agent or core.agents.default.name
            try:
                key_id = await service.set_secret(args.name, value.rstrip("\n"), scope=args.scope, agent=agent,
                                                  by=operator_name(), hosts=args.host)
            except InvalidInput as exc:
                raise BotError(str(exc)) from exc
            where = f"; may be sent to {', '.join(parse_hosts(args.host)[0] or [])}" if args.host else ""
            print(f"stored {args.name} ({args.scope}, agent {agent}), sealed with key {key_id!r}{where}")
            return 0
        if args.verb == "delete":
            count = await service.store.delete_secret(args.name, by=operator_name(), now=SystemClock().now())
            if not count:
                raise NotFoundError(f"there is no credential named {args.name}; `bot credentials list` shows them")
            print(f"deleted {args.name}")
            return 0
        if args.verb == "rotate":
            return await _rotate(service)
        if args.verb == "link":
            token = await CredentialLinks(service).create_link(args.request_id)  # refusals: bot.cli's exit codes
            base = core.settings.bot_public_url or f"http://{core.settings.host}:{core.settings.port}"
            print(f"{base.rstrip('/')}/credentials/{token}")
            print("(one use, 15 minutes at most; it opens only over HTTPS or on this machine)", file=sys.stderr)
            return 0
    return 2


async def _rotate(service: CredentialService) -> int:
    """``bot credentials rotate``: every sealed value (credentials, connections, Slack installs) under the
    current key, each kind summed up; what could not be moved is named, and the exit code says so."""
    from bot.channels import sealed_kinds
    from core.sealed_values import reseal_all

    current = service.keys.current
    reports = await reseal_all(sealed_kinds(service.store.db), service.keys, SystemClock(),
                               lambda line: print(line, flush=True))
    for report in reports:
        print(report.summary(current))
    unopened = [why for report in reports for why in report.unopened]
    busy = [label for report in reports for label in report.busy]
    if unopened or busy:
        problems = []
        if unopened:
            problems.append(f"{len(unopened)} value(s) no configured key opens (named above): add their key to "
                            "BOT_SECRET_KEYS after the current one and run this again, or store them again")
        if busy:
            problems.append(f"{len(busy)} changed while this ran: run it again")
        raise Failed("not everything was re-sealed: " + "; ".join(problems) + ". Keep the old keys until then.")
    print(f"done: every sealed value is under key {current!r}; the other keys in BOT_SECRET_KEYS can be removed")
    return 0


async def schedules_command(args: argparse.Namespace) -> int:
    """Acts on the schedules table; the running gateway follows it at the next firing (pause, cancel)
    or within a few seconds (resume)."""
    from core.schedules import ScheduleService
    from core.store import ConversationStore
    from core.store.schedules import ScheduleStore

    async with _core() as core:
        db = core.credentials.store.db
        # Management only: no scheduler runs here (the gateway's follows the table).
        service = ScheduleService(ScheduleStore(db), ConversationStore(db), core.approvals, EventBus(), SystemClock())
        if args.verb == "list":
            rows = await service.list()
            if not rows:
                print("no schedules")
            for r in rows:
                print(f"{r.id}\t{r.status}\t{r.describe()}\t-> {r.destination}"
                      f"\tby {r.creator}\tfirings {r.firings}\tlast: {r.last_outcome or '-'}\t{r.prompt[:60]}")
            return 0
        # Refusals (no such schedule, not in a state for this) reach bot.cli, which picks the exit code.
        print(await service.change(args.id, args.verb, by=operator_name(), channel=None, operator=True))
        return 0


async def feedback_command(args: argparse.Namespace) -> int:
    """``bot feedback list``: the newest verdicts on answers, with their totals (every replica's)."""
    from core.store.feedback import FeedbackStore

    async with _core() as core:
        store = FeedbackStore(core.credentials.store.db)
        counts = await store.counts()
        rows = await store.recent(limit=args.limit)
        print(f"feedback: {counts[True]} positive, {counts[False]} negative")
        for r in rows:
            verdict = "positive" if r.positive else "negative"
            print(f"{r.updated_at:%Y-%m-%d %H:%M:%S}Z\t{verdict}\tturn {r.turn_id}\tby {visible(r.user)}"
                  f"\t{visible(r.session_id)}")
        return 0


async def events_command(args: argparse.Namespace) -> int:
    """``bot events list|replay``: the events table, which the running gateway follows (a replayed event is queued
    again; the gateway takes it within seconds)."""
    from core.store import ConversationStore
    from core.store.webhook_events import WebhookEventStore

    async with _core() as core:
        db = core.credentials.store.db
        store = WebhookEventStore(db)
        if args.verb == "replay":
            row = await store.replay(args.id, SystemClock().now())  # NotFound reaches bot.cli (exit 3)
            print(f"event {args.id} queued again as event {row.id}: the running bot answers it within seconds "
                  "(or at its next start)")
            return 0
        rows = await store.list(source=args.source, limit=args.limit)
        if not rows:
            print("no events" + (f" from {args.source}" if args.source else ""))
        conversations = ConversationStore(db)
        for r in rows:
            print(f"{r.id}\t{r.source}\t{visible(r.event_type) or '-'}\t{visible(r.delivery_id or '-')}"
                  f"\t{r.received_at:%Y-%m-%d %H:%M:%S}Z\t{r.status}\t{await _thread(conversations, r)}"
                  + (f"\t{visible(r.note)[:120]}" if r.note else ""))
        return 0


async def memory_command(args: argparse.Namespace) -> int:
    """``bot memory list|forget``: the memories table, which every running process reads at each turn."""
    from core.memory import MemoryService
    from core.store.memories import MemoryStore

    async with _core() as core:
        # A memory kept before its words became a stored secret's value is printed masked, as the agents see it.
        service = MemoryService(MemoryStore(core.credentials.store.db), SystemClock(),
                                redactor=core.credentials.redactor)
        if args.verb == "forget":
            gone = await service.forget_as_operator(args.id, by=operator_name())  # NotFound: bot.cli's exit 3
            print(f"forgot memory {gone.id} of agent {gone.agent}")
            return 0
        rows = await service.store.recent(args.agent, limit=args.limit)
        if not rows:
            print("no memories" + (f" of agent {args.agent}" if args.agent else ""))
        for m in rows:  # whole, with invisible characters marked: what the model reads
            print(f"{m.id}\t{m.agent}\t{'pinned' if m.pinned else '-'}\t{'proposed' if m.proposed else '-'}"
                  f"\tby {visible(m.written_by or '-')}\t{m.created_at:%Y-%m-%d %H:%M:%S}Z"
                  f"\t{visible(m.session_id or '-')}\t{visible(await service.mask(m.text)).replace(chr(10), ' ⏎ ')}")
        return 0


async def _thread(conversations: Any, row: Any) -> str:
    """Where an event's answers go: its thread key, and the thread once its first post opened it."""
    key = f"key {visible(row.thread_key)!r}" if row.thread_key else "own thread"
    session = await conversations.get_session(row.session_id) if row.session_id else None
    if session is None:
        return key
    ref = session.reply_ref
    where = "/".join(str(ref[k]) for k in ("channel", "thread_ts") if ref.get(k))
    return f"{key} ({where})" if where else key


async def freeze_command(args: argparse.Namespace) -> int:
    """``bot freeze --until TIME --reason TEXT`` and ``bot unfreeze`` (audited, as the operator)."""
    async with _core() as core:
        freezes = core.freezes
        if args.command == "unfreeze":
            lifted = await freezes.lift(by=operator_name())
            print(f"bot: lifted freeze{'' if len(lifted) == 1 else 's'} {', '.join(map(str, lifted))}" if lifted
                  else "bot: no freeze was set")
            if (window := freezes.window_in_force()) is not None:
                print(f"bot: a [[freezes]] window of bot.toml still holds ({window.describe()}); it can't be lifted: "
                      "change bot.toml and restart to end it", file=sys.stderr)
            return 0
        try:
            freeze = await freezes.freeze(parse_until(args.until, freezes.clock.now()), args.reason,
                                          by=operator_name())
        except InvalidInput as exc:
            raise BotError(f"not frozen: {exc}") from exc
        print(f"bot: frozen ({freeze.describe()}); calls that need approval are refused until then, on every "
              "replica; `bot unfreeze` lifts it")
        return 0

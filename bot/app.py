"""Wiring: build the gateway, its channels and the one aiohttp server from settings."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aiohttp import web
from yarl import URL

from bot.channels import installed_channels
from bot.config.file import BotToml, load_config
from bot.connections_config import build_connections
from bot.egress import EgressPolicy
from bot.errors import Failed, SettingsError
from bot.event_routes import EventRoutes, event_secrets
from bot.health import healthz, readyz_handler, until_ready
from bot.home import sandbox_hidden, secure_home, skills_dir_problem
from bot.http_headers import server_app
from bot.keys import load_keyring
from bot.metrics import EventFigures, Metrics
from bot.model_endpoints import agent_endpoints, fallback_endpoint
from bot.oncall import on_call_rota
from bot.passkeys_config import build_passkeys
from bot.people import people
from bot.policy_check import flag_warnings
from bot.providers import build_provider
from bot.sandbox import SKILLS, Bubblewrap
from bot.sandbox import probe as probe_sandbox
from bot.sandbox_peers import SandboxPeers
from bot.self_approval_check import unsatisfiable_setup
from bot.settings import Settings
from bot.skills import BUILTIN_SKILLS
from bot.tools import build_registry
from bot.tools.schedules import schedule_tools
from bot.tracing import from_environment as traces_from_environment
from channels.web.credential_link import CredentialLinkPage
from channels.web.oauth_pages import OAuthPages
from channels.web.passkey_pages import PasskeyPages
from core.agents import AgentDirectory
from core.approval_edits import ApprovalEdits
from core.approval_policy import ApprovalPolicy
from core.approvals import ApprovalBroker
from core.attachments import AttachmentReader
from core.budget import ThreadBudget
from core.clock import Clock, SystemClock
from core.commands import Commands
from core.connections.service import ConnectionService
from core.credential_links import CredentialLinks
from core.credentials import CredentialService
from core.delivery import Deliveries, DeliveryConfig
from core.dispatcher import DispatchConfig, Dispatcher, build_dispatcher
from core.events import EventBus
from core.failed_turns import announce_cancelled_requests
from core.feedback import FeedbackBook
from core.freezes import Freezes
from core.gateway import Gateway
from core.memory import MemoryLimits, MemoryPass, MemoryService, PinnedMemories, memory_tools
from core.memory.tools import REMEMBER
from core.model_routing import Model, ModelRouter
from core.outside_text import OutsideText
from core.plugins import ChannelContext
from core.policies import PolicyBook
from core.ports import Channel, Ports
from core.providers import Provider, RetryPolicy
from core.redaction import Redactor
from core.runner import AgentRunner, RunnerLimits
from core.schedules import ScheduleService
from core.schedules.jobs import JobSettings, ScheduleJobs
from core.skill_access import SkillAccess
from core.skills import SkillCatalog, SkillRoot
from core.spending import SpendingCaps, cost_cap_problem
from core.step_up import StepUps
from core.store import (
    ApprovalStore,
    ControlStore,
    ConversationStore,
    CredentialStore,
    Database,
    InputStore,
    LeaseStore,
)
from core.store.budgets import BudgetStore
from core.store.deliveries import DeliveryStore
from core.store.feedback import FeedbackStore
from core.store.freezes import FreezeStore
from core.store.memories import MemoryStore
from core.store.schedules import ScheduleStore
from core.store.stats import snapshot
from core.store.usage import UsageStore
from core.store.webhook_events import WebhookEventStore
from core.subagents import SubAgents
from core.tools import ToolRegistry
from core.tracing import Tracer
from core.trust import SenderTrust
from core.webhooks.intake import WebhookIntake
from core.webhooks.processor import EventProcessor, ProcessorSettings, SourceLevels

if TYPE_CHECKING:  # the MCP SDK is imported only when bot.toml names a server (it takes a second to load)
    from bot.mcp.manager import McpServers

log = logging.getLogger(__name__)


@dataclass
class Address:
    """Where this process listens: PORT as set, and the port actually bound once it listens (PORT=0 picks one).
    Made before what needs to know it (egress refuses the bot's own port; connection links name it), and
    filled in by ``Application.start``."""

    configured: int
    bound: int | None = None

    @property
    def port(self) -> int:
        return self.bound if self.bound is not None else self.configured


@dataclass
class Application:
    settings: Settings
    db: Database
    dispatcher: Dispatcher
    approvals: ApprovalBroker
    credentials: CredentialService
    schedules: ScheduleService
    schedule_jobs: ScheduleJobs
    deliveries: Deliveries
    gateway: Gateway  # what the channels call
    address: Address
    sandbox_peers: SandboxPeers | None = None
    connections: ConnectionService | None = None  # [[connections]] in bot.toml
    mcp: McpServers | None = None  # [[mcp_servers]] in bot.toml: started (their tools listed) before turns run
    events: EventProcessor | None = None  # [[event_sources]]: stored events taken to their answers
    memory: MemoryService | None = None  # the agents' memories (remember / recall / forget, pinned ones in prompts)
    channels: list[Channel] = field(default_factory=list)
    routes: list[web.RouteDef] = field(default_factory=list)  # served beside health, readiness and the channels'
    intake: WebhookIntake | None = None  # [[event_sources]] in bot.toml: POST /events/<name>
    web_app: web.Application = field(init=False)
    _runner: web.AppRunner | None = None
    _prune_task: asyncio.Task[None] | None = None
    phase: str = "starting"  # then "ready", then "stopping": requests are served only when ready

    def __post_init__(self) -> None:
        # The security headers on every response (server_app); a running command's connections refused; nothing
        # taken in until recovered.
        middlewares = [self.sandbox_peers.middleware()] if self.sandbox_peers is not None else []
        self.web_app = server_app(middlewares=[*middlewares, until_ready(self)])
        self.web_app.add_routes([web.get("/healthz", healthz), web.get("/readyz", readyz_handler(self)),
                                 *self.routes, *(route for channel in self.channels for route in channel.routes())])

    async def start(self) -> None:
        """Listen, then migrate, recover and start channels. Order matters: a busy port fails before
        anything is changed, and until recovery is done every request gets 503 (``bot.health.until_ready``)."""
        await self._listen()
        try:
            await self._recover()
        except BaseException:
            await self._close_listener()  # as if never started: the port is free again
            raise
        self.phase = "ready"

    async def _recover(self) -> None:
        await self.db.migrate()
        await self.credentials.upgrade_legacy()  # bind secrets sealed before 0007 to their rows
        await self.credentials.redactor.check()  # load the masks (and tell the log filter) before any turn
        await self.approvals.expire_overdue()  # those that ran out while no process was up
        await self.credentials.expire_overdue()
        if self.connections is not None:
            await self.connections.expire_overdue()
        # Before turns resume: on SQLite it releases the claims of answers the last run left mid-delivery,
        # and must not release those of answers resumed turns are about to post.
        await self.deliveries.start(single_process=self.db.is_sqlite)  # resumes answers left undelivered
        if self.mcp is not None:
            await self.mcp.start(self.dispatcher.runner.tools)
        await self.dispatcher.start()
        for channel in self.channels:
            await channel.start()
        await self.schedule_jobs.start()
        await self.schedules.start()
        if self.events is not None:
            await self.events.start()  # events a crash left queued are taken again (deduplicated by their id)

    async def _listen(self) -> None:
        self._runner = web.AppRunner(self.web_app, access_log=None, handle_signals=False)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.settings.host, self.settings.port).start()
        except OSError as exc:
            await self._close_listener()
            raise Failed(f"cannot listen on {self.settings.host}:{self.settings.port}: {exc.strerror or exc}; "
                         "is another program using that port? stop it, or set PORT") from exc
        bound = [int(address[1]) for address in self._runner.addresses if isinstance(address, tuple)]
        self.address.bound = bound[0] if bound else self.settings.port

    async def _close_listener(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self.address.bound = None

    @property
    def bound_port(self) -> int:
        assert self.address.bound is not None
        return self.address.bound

    async def problems(self) -> list[str]:
        """Why it does not serve now (``/readyz``); empty when it does."""
        problems: list[str] = []
        try:
            await self.db.ping()
        except Exception as exc:
            problems.append(f"database: {type(exc).__name__}")
        if self.phase != "ready":
            problems.append(f"the bot is {self.phase}")
        problems += [f"channel {c.name} not started" for c in self.channels if not c.started]
        if not self.dispatcher.accepting:
            problems.append("gateway not accepting")
        return problems

    def channel_names(self) -> list[str]:
        return [c.name for c in self.channels]

    async def stop(self) -> Stopped:
        """Take no more requests (503: Slack delivers them again, to the next start), set parked turns
        aside at once, give running ones SHUTDOWN_DRAIN_S, close. Returns what the last line says."""
        recovered, self.phase = self.phase == "ready", "stopping"
        if self.events is not None:
            await self.events.stop()  # what is queued stays queued: the next start takes it
        await self.schedules.stop()
        await self.schedule_jobs.stop()
        for channel in self.channels:
            await channel.stop()
        shutdown = await self.dispatcher.stop(drain_s=self.settings.shutdown_drain_s)
        if self.mcp is not None:
            await self.mcp.stop()
        await self.deliveries.stop()
        for channel in self.channels:
            await channel.close()
        for provider in _providers(self.dispatcher.runner.models):  # their HTTP sessions
            close = getattr(provider, "aclose", None)
            if close is not None:
                await close()
        kept = await self._still_parked() if recovered else 0
        await self._close_listener()
        await self.db.close()
        return Stopped(drained=shutdown.drained, interrupted=shutdown.interrupted, kept=kept)

    async def _still_parked(self) -> int:
        try:
            figures = await snapshot(self.db)
        except Exception:
            log.exception("could not count the requests left pending")
            return 0
        return int(figures["approvals_pending"] + figures["credential_requests_pending"]
                   + figures["connection_requests_pending"])


@dataclass(frozen=True)
class Stopped:
    drained: int  # turns that ended while the bot stopped
    interrupted: int  # turns cut at the end of SHUTDOWN_DRAIN_S: continued at the next start
    kept: int  # requests still waiting on a person: their buttons work again after the next start

    def describe(self) -> str:
        cut = (f", {self.interrupted} interrupted at the end of SHUTDOWN_DRAIN_S (continued at the next start)"
               if self.interrupted else "")
        return (f"bot stopped: {self.drained} turn(s) drained{cut}, {self.kept} parked request(s) kept "
                "for the next start")


def build_application(
    settings: Settings, *, clock: Clock | None = None, provider: Provider | None = None,
    secret_sink: Callable[[str], None] | None = None, tracer: Tracer | None = None,
) -> Application:
    """Every object gets its collaborators when it is made, in dependency order; nothing is set afterwards.
    ``secret_sink`` learns every stored secret value (the log filter masks them). ``tracer``: where spans go
    (None: as the OTEL_* variables say, bot.tracing; none of them set: nowhere, at no cost)."""
    clock = clock or SystemClock()
    tracer = tracer if tracer is not None else traces_from_environment(os.environ, secrets=secret_sink)
    secure_home(settings)  # before anything is created under BOT_HOME: 0700 folders, 0600 files
    # Where this process listens: known before anything that must recognise its own port or link to it.
    address = Address(settings.port)
    db = Database(settings.resolved_database_url, sqlite_synchronous=settings.sqlite_synchronous,
                  pool_size=settings.database_pool_size)
    store = ConversationStore(db)
    bus = EventBus()
    toml = load_config(settings.bot_config)  # bot.toml, read and checked once: every table below comes from it
    agents = AgentDirectory(toml.agent_list(settings.bot_instructions))
    ports = Ports()  # what core calls on each channel, registered below as the channels are built
    approval_store = ApprovalStore(db)
    schedule_store = ScheduleStore(db)
    # Senders' trust levels: labelled by each channel's port, decided in core (audited in the audit log); a
    # schedule's firing runs at its creator's level at creation.
    named = people()  # BOT_ADMINS and approvers compared with the person's channel (core.people)
    # An event source's turns run at the source's level (its ``trust``, at most member).
    event_sources = {source.name: source for source in toml.event_source_list()}
    event_levels = SourceLevels(event_sources)

    async def fixed_level(session_id: str) -> str | None:
        return await event_levels(session_id) or await schedule_store.firing_level(session_id)

    trust = SenderTrust(ports, settings.admins, audit=approval_store.audit, now=clock.now,
                        fixed=fixed_level, people=named)
    policy = ApprovalPolicy(settings.approvers, settings.admins, groups=ports, trust=trust, people=named)
    policies = PolicyBook(toml.policy_list())
    # A setup nobody could approve (self-approval refused, only the requester may approve): one line, no start.
    if stuck := unsatisfiable_setup(settings, policies.policies, map(agents.get, agents.names())):
        raise SettingsError("; ".join(stuck))
    for warning in flag_warnings(policies.policies):  # a glob wider than meant: said, not refused
        log.warning("%s", warning)
    passkeys = build_passkeys(settings.bot_public_url, policies.policies, db, clock)  # step_up rules' (SPEC §17)
    freezes = Freezes(FreezeStore(db), clock, toml.freeze_windows())  # in the database: every replica's at once
    approvals = ApprovalBroker(approval_store, bus, clock, policy, agents,
                               timeout_s=settings.approval_timeout_s, poll_s=settings.approval_poll_s,
                               policies=policies, tracer=tracer, freezes=freezes,
                               self_approval=settings.bot_self_approval, passkeys=passkeys,
                               rota=on_call_rota(settings, [agents.get(n) for n in agents.names()], policies.policies,
                                                 ports, clock))
    credentials = CredentialService(
        CredentialStore(db), load_keyring(settings), bus, clock, policy, agents,
        timeout_s=settings.credential_timeout_s, max_bytes=settings.credential_max_bytes,
        poll_s=settings.approval_poll_s, on_secret=secret_sink,
    )
    credentials.redactor.add_static(settings.named_secrets())
    # The port actually bound (PORT=0 picks one) is never a destination of http_request on this machine.
    egress = EgressPolicy.from_settings(settings, own_port=lambda: address.bound or settings.port or None)
    peers = SandboxPeers()  # a command's processes must not be "this machine" to our own server
    if (problem := skills_dir_problem(settings)) is not None:
        raise SettingsError(problem)
    shell = probe_sandbox(settings.shell_sandbox, network=settings.shell_network, hide=sandbox_hidden(settings),
                          peers=peers, skills=settings.resolved_skills_dir)
    shell.log()  # without a working sandbox shell_run is off, and the log says how to fix it
    # Links and the redirect URI: BOT_PUBLIC_URL, else this machine at the port actually bound.
    connections = build_connections(settings, toml.connection_specs(settings.bot_config), db, credentials, bus,
                                    clock, policy,
                                    base_url=lambda: settings.bot_public_url or f"http://127.0.0.1:{address.port}")
    # A turn failed after restarts: its cards say so.
    announce_cancelled_requests(bus, approvals, credentials, connections.service if connections else None)
    tools = build_registry(settings.bot_home.resolve(), sandbox=shell.sandbox, shell_env=credentials.env_for,
                           credential_headers=credentials.headers_for, egress=egress,
                           connections=connections.service if connections is not None else None,
                           connection_wait_s=settings.connection_timeout_s)
    tools.register(credentials.tool())
    # Memories: an agent's, across its threads; the pinned ones in every turn's system prompt (SPEC §17).
    memory = MemoryService(MemoryStore(db), clock, redactor=credentials.redactor, trust=trust, limits=MemoryLimits(
        max_items=settings.memory_max_items, pinned_max_chars=_pinned_budget(settings)))
    # Once a conversation holds text from outside it (a page, a command's output, a shared file), what it would write
    # into memory is a person's to allow (core.outside_text); the tools registered later are looked up when asked.
    outside = OutsideText(store, tools)
    for tool in memory_tools(memory, outside):
        tools.register(tool)
    # Skills: the built-in one, then SKILLS_DIR's (read again when they change); listed in each turn's prompt.
    catalog = SkillCatalog([SkillRoot(BUILTIN_SKILLS, builtin=True), SkillRoot(settings.resolved_skills_dir)])
    catalog.refresh()  # a malformed skill is named in the start-up log (and by `bot doctor`); the bot starts anyway
    skills = SkillAccess(catalog, tools, agents, credentials.stored_names, shell_folder=(
        SKILLS if isinstance(shell.sandbox, Bubblewrap) else
        str(settings.resolved_skills_dir) if shell.sandbox is not None else None))
    tools.register(skills.tool())
    mcp_specs = toml.mcp_specs()
    mcp = None
    if mcp_specs:
        from bot.mcp.manager import McpServers, audit_to

        mcp = McpServers(mcp_specs, home=settings.bot_home.resolve(), sandbox=shell.sandbox,
                         audit=audit_to(approvals.store, clock.now), env_for=credentials.env_for,
                         credential_headers=credentials.headers_for,
                         connections=connections.service if connections is not None else None,
                         connection_wait_s=settings.connection_timeout_s)
    model = provider or build_provider(settings)
    models = _model_router(settings, toml, model, bus, credentials.redactor, secret_sink)
    caps = toml.caps_config()
    if (problem := cost_cap_problem(caps, _model_names(models))) is not None:
        raise SettingsError(f"{settings.bot_config}: {problem}")
    spending = SpendingCaps(UsageStore(db), clock, approvals, caps, bus=bus)  # [[prices]], caps, bot usage
    runner = AgentRunner(
        store,
        model,
        tools,
        clock,
        limits=RunnerLimits(max_steps=settings.max_steps, tool_result_max_chars=settings.tool_result_max_chars,
                            context_tokens=settings.llm_context_tokens),
        retry=RetryPolicy(attempts=settings.llm_max_attempts, base_delay_s=settings.llm_retry_base_s,
                          retry_after_max_s=settings.llm_timeout_s),
        gate=approvals,
        redactor=credentials.redactor,
        budget=ThreadBudget(settings.thread_token_budget, BudgetStore(db), approvals),
        resumable=connections.service.resumable if connections is not None else None,
        trust=trust,
        sections=[PinnedMemories(memory), skills],
        tracer=tracer,
        models=models,
        events=bus,  # each tool call's outcome (chatops_tool_calls_total)
        spending=spending,
    )
    if settings.memory_pass:  # after a member's turn, one bounded call proposes memories (best effort)
        bus.subscribe(MemoryPass(memory, model, store, trust=trust, enabled_for=_remembers(tools, agents),
                                 outside=outside, spending=spending, model_name=models.primary.name).on_event)
    if len(agents.names()) > 1:  # delegate: only where there is another agent to hand work to (core.subagents)
        tools.register(SubAgents(runner, agents, clock, max_per_turn=settings.max_subagents_per_turn,
                                 max_steps=settings.subagent_max_steps).tool())
    deliveries = Deliveries(DeliveryStore(db), ports, bus, clock, config=DeliveryConfig(
        max_age_s=settings.delivery_max_age_s, retry_base_s=settings.delivery_retry_base_s,
        claim_s=settings.lease_ttl_s, poll_s=settings.approval_poll_s), tracer=tracer)
    # With SQLite there is one process; with PostgreSQL several replicas share the work through leases.
    leases = None if db.is_sqlite else LeaseStore(db)
    dispatcher = build_dispatcher(
        store, InputStore(db), ControlStore(db), runner, agents, bus, clock,
        DispatchConfig(
            max_concurrent_turns=settings.max_concurrent_turns,
            record_thread_context=settings.bot_record_thread_context,
            queue_mode=settings.queue_mode,
            debounce_s=settings.queue_debounce_ms / 1000,
            max_waiting=settings.queue_max_waiting,
            lease_ttl_s=settings.lease_ttl_s,
        ),
        leases=leases,
        policy=policy,  # who may stop or re-queue someone else's work
        deliveries=deliveries,
        attachments=AttachmentReader(ports, image_max_bytes=settings.image_max_bytes),  # files shared with messages
        tracer=tracer,
    )
    schedule_jobs = ScheduleJobs(
        db, schedule_store, dispatcher, bus, clock,
        JobSettings(misfire_grace_s=int(settings.schedule_misfire_grace_min * 60), lease_ttl_s=settings.lease_ttl_s),
        deliveries=deliveries, leases=leases, trust=trust,
    )
    schedules = ScheduleService(schedule_store, store, approvals, bus, clock,
                                interval_floor_s=settings.schedule_min_interval_s, jobs=schedule_jobs, ports=ports)
    # "#name" destinations are the places of the channel that offers them (Slack's channels).
    destination = next((plugin.name for plugin in installed_channels() if plugin.destinations), None)
    if destination is not None:
        for tool in schedule_tools(schedules, store, channel=destination):
            tools.register(tool)
    # Stored events become turns answered in their destination (``resolve`` set once that channel is built).
    events = EventProcessor(WebhookEventStore(db), dispatcher, clock, event_sources,
                            resolve=_destinations(ports, destination), settings=ProcessorSettings(
                                channel=destination or "", retention=timedelta(days=settings.event_retention_days),
                                poll_s=settings.approval_poll_s)
                            ) if event_sources else None
    commands = Commands(dispatcher, approvals, schedules,
                        connections=connections.service if connections is not None else None, memory=memory,
                        freezes=freezes)
    feedback = FeedbackBook(FeedbackStore(db), store, bus, clock)
    gateway = Gateway(dispatcher, approvals, credentials, schedules, commands=commands, feedback=feedback,
                      consent=connections, edits=ApprovalEdits(approvals, tools, credentials.redactor))
    channels = _channels(settings, toml, ChannelContext(
        gateway=gateway, db=db, clock=clock, keys=credentials.keys, learn_secret=credentials.redactor.learn,
        public_url=settings.bot_public_url))
    for channel, channel_tools in channels:
        ports.register(channel.port)  # answers, destinations and user groups (BOT_APPROVERS) go through it
        for tool in channel_tools:
            tools.register(tool)
    routes = CredentialLinkPage(CredentialLinks(credentials), trusted_proxies=settings.trusted_proxies).routes()
    intake = None
    if events is not None:  # a stored event wakes the processor (which also finds it in the table)
        sources = list(event_sources.values())
        intake = WebhookIntake(sources, event_secrets(sources), events.store, clock, on_queued=events.queued)
        routes += EventRoutes(intake, settings.event_max_body_bytes).routes()
    metrics = Metrics(db, bus, token=settings.bot_web_token,
                      events=EventFigures(events.store, intake.refusals) if events and intake else None)
    routes.append(web.get("/metrics", metrics.handle))
    if connections is not None:
        routes += OAuthPages(gateway, secure_cookie=(settings.bot_public_url or "").startswith("https://"),
                             prefix=URL(settings.bot_public_url or "/").path.rstrip("/"),
                             trusted_proxies=settings.trusted_proxies).routes()
    if passkeys is not None:  # the passkey pages: enrolment and step-up links
        routes += PasskeyPages(StepUps(passkeys, approvals), secure_cookie=passkeys.rp.origin.startswith("https://"),
                               prefix=URL(settings.bot_public_url or "/").path.rstrip("/"),
                               trusted_proxies=settings.trusted_proxies).routes()
    return Application(settings=settings, db=db, dispatcher=dispatcher, approvals=approvals, credentials=credentials,
                       schedules=schedules, schedule_jobs=schedule_jobs, deliveries=deliveries, gateway=gateway,
                       address=address, sandbox_peers=peers, events=events, memory=memory,
                       connections=connections.service if connections is not None else None, mcp=mcp,
                       channels=[channel for channel, _tools in channels], routes=routes, intake=intake)


def _model_router(settings: Settings, toml: BotToml, primary: Provider, bus: EventBus, redactor: Redactor,
                  secret_sink: Callable[[str], None] | None) -> ModelRouter:
    """The primary, the fallback (LLM_FALLBACK_*) and each agent's own model ([[agents]]); the keys of the agents'
    are masked like the bot's own (the fallback's is among the settings' secrets)."""
    fallback = fallback_endpoint(settings)
    own = agent_endpoints(toml.agents, settings, settings.bot_config)
    for endpoint in own.values():
        if endpoint.api_key and endpoint.key_name and len(endpoint.api_key) >= 4:
            redactor.add_static([(endpoint.key_name, endpoint.api_key)])
            if secret_sink is not None:
                secret_sink(endpoint.api_key)
    return ModelRouter(
        Model(primary, str(getattr(primary, "model", None) or settings.llm_model or primary.name)),
        fallback=Model(build_provider(settings, fallback), fallback.model) if fallback is not None else None,
        agents={name: Model(build_provider(settings, endpoint), endpoint.model) for name, endpoint in own.items()},
        bus=bus, redact=redactor.redact)


def _model_names(models: ModelRouter) -> list[str]:
    """Every model the bot may call (what [[prices]] must price when a cost cap is set)."""
    found = [models.primary, *models.agents.values(), *([models.fallback] if models.fallback is not None else [])]
    return [model.name for model in found]


def _providers(models: ModelRouter) -> list[Provider]:
    """Every distinct provider the router holds."""
    found = [models.primary.provider, *(m.provider for m in models.agents.values())]
    if models.fallback is not None:
        found.append(models.fallback.provider)
    return list({id(p): p for p in found}.values())


def _pinned_budget(settings: Settings) -> int:
    """MEMORY_PINNED_MAX_CHARS, at most half of LLM_CONTEXT_TOKENS (the section is measured in UTF-8 bytes, and a
    token is at least one): the system prompt is never cut, so pinned memories must leave the window room for the
    conversation."""
    most = settings.llm_context_tokens // 2
    if settings.memory_pinned_max_chars > most:
        log.warning("MEMORY_PINNED_MAX_CHARS=%d is more than half of LLM_CONTEXT_TOKENS=%d: pinned memories get %d "
                    "characters", settings.memory_pinned_max_chars, settings.llm_context_tokens, most)
        return most
    return settings.memory_pinned_max_chars


def _remembers(tools: ToolRegistry, agents: AgentDirectory) -> Callable[[str], bool]:
    """Whether an agent may call ``remember`` ([[agents]] tools): only then does the memory pass propose for it."""
    return lambda name: any(tool.name == REMEMBER for tool in tools.allowed(agents.get(name).tools))


def _destinations(ports: Ports, channel: str | None) -> Callable[[str], Awaitable[str]] | None:
    """How an event source's destination is resolved: by the port of the channel whose places destinations are,
    once it is registered (it is built after core)."""
    if channel is None:
        return None

    async def resolve(destination: str) -> str:
        return await ports.get(channel).resolve_destination(destination)  # InvalidInput when not configured

    return resolve


def _channels(settings: Settings, toml: BotToml, context: ChannelContext) -> list[tuple[Channel, list[Any]]]:
    """Every installed channel its own settings enable, built with its own bot.toml section, with the tools it
    offers the model."""
    built = []
    for plugin in installed_channels():
        own = settings.channels[plugin.name]
        if own.enabled:
            channel = plugin.build(own, replace(context, section=toml.section(plugin.name)))
            built.append((channel, plugin.tools(channel)))
    return built


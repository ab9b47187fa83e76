"""Plain value types shared by core and the channel adapters."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.grants import granted_label

# Session ids in these namespaces are minted by core only (scheduled firings, sub-agents, events).
SUBAGENT_PREFIX = "sub:"  # a sub-agent's session: sub:<parent session>:<n> (core.subagents)
# An event source's conversations (event:<source>:<key digest>) and its sender (event:<source>): nobody's words,
# so nobody is the requester of what its turns ask for (core.webhooks.processor).
EVENT_PREFIX = "event:"
RESERVED_SESSION_PREFIXES = ("schedule:", SUBAGENT_PREFIX, EVENT_PREFIX)
VIEW_KEY = "view:"  # the idempotency keys of view contexts (Inbound.view_context): a newer one replaces them


def thread_of(session_id: str) -> str:
    """The conversation a session belongs to: a sub-agent's is its parent's (its tokens count there)."""
    if session_id.startswith(SUBAGENT_PREFIX):
        return session_id[len(SUBAGENT_PREFIX):].rsplit(":", 1)[0]
    return session_id


class SessionStatus(enum.StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    PENDING_APPROVAL = "pending_approval"
    WAITING_CREDENTIAL = "waiting_credential"
    WAITING_CONNECTION = "waiting_connection"
    FAILED = "failed"


class TurnStatus(enum.StrEnum):
    QUEUED = "queued"  # a turn interrupted by a restart, waiting to be continued
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


LIVE_TURN_STATUSES = (TurnStatus.QUEUED, TurnStatus.RUNNING)


class InputStatus(enum.StrEnum):
    WAITING = "waiting"
    TAKEN = "taken"
    CANCELLED = "cancelled"
    REFUSED = "refused"


class InputKind(enum.StrEnum):
    MESSAGE = "message"  # asks for an answer
    CONTEXT = "context"  # recorded for the next turn, asks nothing
    CONTROL = "control"  # a command to the bot ("stop", "queue collect"), never shown to the model


class QueueMode(enum.StrEnum):
    STEER = "steer"
    COLLECT = "collect"
    FOLLOWUP = "followup"


QUEUE_MODES = tuple(QueueMode)


class OutcomeStatus(enum.StrEnum):
    """How an input ended (``Outcome.status``)."""

    ANSWERED = "answered"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REFUSED = "refused"


class ScheduleStatus(enum.StrEnum):
    PENDING_DESTINATION = "pending_destination"
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


class FiringStatus(enum.StrEnum):
    RUNNING = "running"
    POSTED = "posted"
    FAILED = "failed"


class DeliveryStatus(enum.StrEnum):
    """An answer in the outbox: waiting for its channel to take it, taken, or given up."""

    PENDING = "pending"
    DELIVERED = "delivered"
    GIVEN_UP = "given_up"


@dataclass(frozen=True)
class MessageRef:
    """Where a message lives on its platform (Slack: channel id and ts)."""

    channel: str | None = None
    ts: str | None = None


@dataclass(frozen=True)
class Attachment:
    """A file shared with a message, as the channel names it; read (``ChannelPort.fetch_file``) only when a
    turn takes the message, never while the platform waits for its acknowledgement."""

    name: str
    mimetype: str
    size: int | None  # bytes, as the platform declares it (checked again while reading)
    source: str  # the channel's own handle to fetch it (Slack: the file's private download URL)


@dataclass(frozen=True)
class Inbound:
    """One message from a person, as a channel adapter hands it to core.

    ``addressed`` says the person spoke to the bot (a mention, a DM); core decides what follows.
    ``idempotency_key`` identifies the message itself (the same message delivered twice has the
    same key); ``delivery_key`` identifies one delivery of it (e.g. a Slack ``event_id``).
    """

    session_id: str
    channel: str
    sender: str
    text: str
    addressed: bool
    reply_ref: dict[str, Any] = field(default_factory=dict)
    ref: MessageRef = MessageRef()
    idempotency_key: str | None = None
    delivery_key: str | None = None
    agent: str | None = None
    images: tuple[str, ...] = ()  # image URLs or data: URIs
    attachments: tuple[Attachment, ...] = ()  # files shared with it, read when a turn takes it
    place: str | None = None  # where the conversation lives, e.g. "slack:T1:C1" (per-place settings)
    # What the person is looking at (context, e.g. the channel beside an assistant chat): it may open the
    # conversation before anything is asked, and a newer one replaces one that still waits.
    view_context: bool = False
    # Unaddressed, in a place the bot listens in (Slack's ``listen_channels``): it still starts a turn, whose answer
    # is optional, at most this many such turns per place a minute (core counts them; beyond, it is context only).
    # None: the bot does not listen there. The channel says where it listens; core decides what follows.
    listen_per_minute: int | None = None
    # Reserved for core (a scheduled firing's destination); refused from channels.
    preapproved: tuple[tuple[str, str], ...] = ()


FALLBACK_MODEL = "fallback"  # sessions.model of a session that switched to LLM_FALLBACK_* for good


@dataclass(frozen=True)
class SessionInfo:
    id: str
    channel: str
    agent: str
    status: SessionStatus
    reply_ref: dict[str, Any]
    place: str | None = None
    preapproved: tuple[tuple[str, str], ...] = ()  # (tool, subject) calls that need no approval here
    model: str | None = None  # FALLBACK_MODEL once its primary model failed for good (core.model_routing)

    @staticmethod
    def parse_reply_ref(raw: str) -> dict[str, Any]:
        value = json.loads(raw) if raw else {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class TurnInfo:
    id: int
    session: SessionInfo
    inputs: tuple[MessageRef, ...]  # every input the turn took, steered ones included
    sender: str | None  # who asked first
    input_ids: tuple[int, ...] = ()
    # Everyone whose words the turn took in (messages and context, not controls): it runs at the least
    # trusted level among them (core.trust).
    senders: tuple[str, ...] = ()
    # Everyone whose words are in the conversation (this turn's senders first), when read in the transaction that
    # started the turn; None: not read (a resumed turn), the runner reads it.
    everyone: tuple[str, ...] | None = None
    # The transcript messages (ids) of the inputs that addressed the bot (not context): the newest of them is
    # never cut to fit the context window (core.context_window).
    asked: tuple[int, ...] = ()
    # Every message it took came unaddressed, in a place the bot listens in: the model may stay silent
    # (core.listening), and a silent end posts nothing.
    answer_optional: bool = False
    # The trace it belongs to (core.tracing): the W3C traceparent stored with the first message it took (its
    # intake's span). None when traces were off then.
    trace_context: str | None = None
    resumed: bool = False  # continued after a restart (its trace links back to its first span)


class ApprovalStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ApprovalInfo:
    """A parked tool call as channels render it, and as deciders see it."""

    id: int
    session: SessionInfo
    tool: str
    arguments: dict[str, Any]
    agent: str
    requester: str | None
    status: ApprovalStatus
    parked_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    reason: str | None = None
    always: bool = False
    announcement: dict[str, Any] | None = None
    started: bool = False
    turn_id: int | None = None  # the turn that asked (None: not a turn's call, e.g. a schedule's destination)
    # Whoever else had messages in the turn when the call was asked (steered or context): the call
    # may be their idea. Shown to approvers; they are not requesters (only ``requester`` is).
    other_senders: tuple[str, ...] = ()
    # From the [[policies]] rule that asked: who may decide (empty: the agent's or BOT_APPROVERS), how many
    # distinct approvers must agree, the rule, and the approvals given so far (voter ids, in order).
    approvers: tuple[str, ...] = ()
    quorum: int = 1
    policy: str | None = None
    approved_by: tuple[str, ...] = ()
    risk: str = "gated"  # BUDGET_RISK: a thread's token budget used up (Continue / Stop), not a tool call
    notify: tuple[str, ...] = ("thread",)  # where it is shown: the thread, and each approver's DM ("dm")
    remind_at: datetime | None = None  # when the approvers are reminded (a rule's remind_after_s)
    reminded: bool = False
    # Its rule's grant_ttl_s: a grant made on it lasts that long (core.grants); None: never, or (a rule that sets
    # none) no grant is offered.
    grant_ttl_s: float | None = None
    grant_scope: str | None = None  # the grant its approval recorded: place (Always allow) or thread
    grant_rule_key: str | None = None  # the fingerprint of the rule that asked, which its grant is bound to
    # Separation of duties (core.self_approval): everyone whose words the turn had taken when it asked (the
    # requester first), and whether they may approve it. False: only someone else's approval counts.
    senders: tuple[str, ...] = ()
    self_approval: bool = True
    step_up: bool = False  # an approval counts once the approver confirms it with a passkey (core.passkeys)
    batch: str | None = None  # one model step's gated calls asked on one card share it (issue 40.3)
    # An approver's edit, approved: what runs instead of ``arguments`` (the call as the model asked it), and who.
    edited_arguments: dict[str, Any] | None = None
    edited_by: str | None = None

    @property
    def settled(self) -> bool:
        return self.status != ApprovalStatus.PENDING

    @property
    def grantable(self) -> bool:
        """Whether "Always allow" and "Allow in this thread" are offered: for a call no rule decides, or one a
        rule with ``grant_ttl_s`` asks; never past a quorum (a grant would let one person stand for several
        from then on), and never for a rule without ``grant_ttl_s`` (it would skip its approvers for good)."""
        by_rule = self.policy is None or self.grant_ttl_s is not None
        return by_rule and self.quorum <= 1 and self.risk not in (BUDGET_RISK, CAP_RISK)

    @property
    def thread_grantable(self) -> bool:
        """Whether "Allow in this thread" is offered: a turn's call (a schedule's destination has no thread)."""
        return self.grantable and self.turn_id is not None

    @property
    def editable(self) -> bool:
        """Whether **Edit** is offered (issue 40.3; core checks every edit again): a tool call that waits, needs one
        approver, allows self-approval (an edit is the editor's own call), uses no credential and fits the edit box.
        Never a budget's Continue or a schedule's destination."""
        return (not self.settled and self.risk not in (BUDGET_RISK, CAP_RISK) and not self.step_up
                and self.self_approval
                and self.tool != "schedule_destination"
                and self.quorum <= 1 and not carries_credential(self.arguments)
                and len(self.edit_text()) <= EDIT_MAX_CHARS)

    def edit_text(self) -> str:
        """The call's arguments as the edit box shows them: pretty-printed JSON."""
        return json.dumps(self.arguments, indent=2, ensure_ascii=False)

    def progress(self) -> str | None:
        """"1 of 2 — U1" while a request that needs several approvers waits; None otherwise."""
        if self.quorum <= 1 or self.settled:
            return None
        who = ", ".join(self.approved_by) or "nobody yet"
        return f"{len(self.approved_by)} of {self.quorum} approvals — {who}"

    def summary(self) -> str:
        """One line saying how it was settled, e.g. "Denied by U1: not now"."""
        who = self.decided_by or "someone"
        if self.status == ApprovalStatus.APPROVED:
            if len(self.approved_by) > 1:
                who = " and ".join([", ".join(self.approved_by[:-1]), self.approved_by[-1]])
            if self.edited_arguments is not None:
                return f"Approved with changes by {self.edited_by or who}"
            return f"{granted_label(self.grant_scope, self.grant_ttl_s) if self.always else 'Approved'} by {who}"
        if self.status == ApprovalStatus.DENIED:
            return f"Denied by {who}" + (f": {self.reason}" if self.reason else "")
        if self.status == ApprovalStatus.EXPIRED:
            return "Expired: nobody decided in time"
        if self.status == ApprovalStatus.CANCELLED:
            return "Cancelled" + (f" ({self.reason})" if self.reason else "")
        return "Waiting for a decision"


BUDGET_RISK = "budget"  # what a thread's token-budget park is filed as (its card: Continue and Stop)
CAP_RISK = "cap"  # what a spending cap's park is filed as (core.spending): Continue and Stop, admins only
EDIT_MAX_CHARS = 3_000  # what an approval's edit box holds (Slack's plain_text_input); longer calls are not editable


def carries_credential(args: dict[str, Any]) -> bool:
    """Whether a call names a credential to use (shell_run ``credentials``, http_request ``credential``, any tool's
    argument so named) or a connection whose token it sends (http_request ``connection``: the requester's own OAuth
    token): such a call is never edited (an edit could send the credential somewhere else, or act as the requester
    on a request they never made)."""
    return any(any(word in str(key).lower() for word in _CREDENTIAL_WORDS) and value not in (None, "", [], {})
               for key, value in args.items())


_CREDENTIAL_WORDS = ("credential", "connection")


class CredentialStatus(enum.StrEnum):
    PENDING = "pending"
    PROVIDED = "provided"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class CredentialRequestInfo:
    """The agent asked for a secret: what channels show (never a value)."""

    id: int
    session: SessionInfo
    name: str
    reason: str
    scope: str
    agent: str
    requester: str | None
    status: CredentialStatus
    created_at: datetime
    expires_at: datetime
    provided_by: str | None = None
    announcement: dict[str, Any] | None = None
    turn_id: int | None = None  # the turn that asked

    @property
    def settled(self) -> bool:
        return self.status != CredentialStatus.PENDING

    def summary(self) -> str:
        if self.status == CredentialStatus.PROVIDED:
            return f"{self.name} stored by {self.provided_by or 'someone'}"
        if self.status == CredentialStatus.EXPIRED:
            return f"{self.name}: expired, nobody provided it in time"
        if self.status == CredentialStatus.CANCELLED:
            return f"{self.name}: cancelled"
        return f"{self.name}: waiting for someone to provide it"


class ConnectionStatus(enum.StrEnum):
    PENDING = "pending"
    CONNECTED = "connected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ConnectionGap(enum.StrEnum):
    """Why a connection cannot be used: each is told differently (where to look differs)."""

    ABSENT = "absent"
    EXPIRED = "expired"
    INSUFFICIENT_SCOPE = "insufficient_scope"


@dataclass(frozen=True)
class ConnectionRequestInfo:
    """A call waits for someone to connect an account: what channels show (never a token)."""

    id: int
    session: SessionInfo
    connection: str
    principal: str  # who may complete it; "" for a shared connection (an admin)
    gap: ConnectionGap
    scopes: tuple[str, ...]  # what the call needs (named for insufficient_scope)
    agent: str
    status: ConnectionStatus
    created_at: datetime
    expires_at: datetime
    settled_by: str | None = None
    announcement: dict[str, Any] | None = None
    turn_id: int | None = None

    @property
    def settled(self) -> bool:
        return self.status != ConnectionStatus.PENDING

    def ask(self) -> str:
        """What the thread is told, naming the gap."""
        return self.ask_for(self.connection, self.gap, self.scopes)

    @staticmethod
    def ask_for(name: str, gap: ConnectionGap, scopes: tuple[str, ...]) -> str:
        if gap == ConnectionGap.EXPIRED:
            return f"Your {name} connection expired; reconnect"
        if gap == ConnectionGap.INSUFFICIENT_SCOPE:
            return f"{name} needs scope {' '.join(scopes) or '(unnamed)'}; reconnect and grant it"
        return f"Connect {name} to continue"

    def summary(self) -> str:
        if self.status == ConnectionStatus.CONNECTED:
            return f"{self.connection} connected by {self.settled_by or 'someone'}"
        if self.status == ConnectionStatus.EXPIRED:
            return f"{self.connection}: nobody connected it in time; the agent went on without it"
        if self.status == ConnectionStatus.CANCELLED:
            return f"{self.connection}: cancelled"
        return f"{self.connection}: waiting for someone to connect it"


@dataclass(frozen=True)
class Outcome:
    """How one input ended: answered, failed, cancelled or refused (with the text to show)."""

    status: OutcomeStatus
    text: str
    turn_id: int | None = None


@dataclass(frozen=True)
class SessionSummary:
    """One line of a conversation list."""

    id: str
    status: SessionStatus
    title: str
    updated_at: datetime


@dataclass(frozen=True)
class TranscriptEntry:
    """One message as a person reading the conversation sees it."""

    id: int
    role: str
    content: str
    sender: str | None
    created_at: datetime
    tool_names: tuple[str, ...] = ()
    queued: bool = False  # an input still waiting for a turn
    turn_id: int | None = None  # the turn that wrote it (an answer: what feedback names)

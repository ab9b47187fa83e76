"""Table definitions. Every change here needs a migration in ``core/store/migrations/versions``."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Column, Float, Index, Integer, Text, UniqueConstraint, false, text, true
from sqlmodel import Field, SQLModel

from core.store.columns import UTCDateTime, timestamp


class SessionRow(SQLModel, table=True):
    __tablename__ = "sessions"

    id: str = Field(primary_key=True, max_length=255)
    channel: str = Field(max_length=32)
    agent: str = Field(max_length=64)
    status: str = Field(max_length=32)
    # Platform data the channel adapter needs to answer (JSON), e.g. Slack channel and thread_ts.
    reply_ref: str = Field(sa_column=Column(Text, nullable=False))
    # Where the conversation lives (e.g. "slack:T1:C1"), for per-channel settings such as the queue mode.
    place: str | None = Field(default=None, max_length=255)
    queue_mode: str | None = Field(default=None, max_length=16)
    # Calls that need no approval in this session, JSON [[tool, subject], ...] (a firing's destination).
    preapproved: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    summary: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # of what the window left out
    summary_key: str | None = Field(default=None, max_length=64)  # which messages: "count:digest"
    tokens_used: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))  # budget
    token_allowance: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    # Which model its calls go to: None, its agent's (or the primary); "fallback" once the primary failed for good.
    model: str | None = Field(default=None, max_length=16)
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()


class MessageRow(SQLModel, table=True):
    __tablename__ = "messages"
    __table_args__ = (
        UniqueConstraint("session_id", "idempotency_key", name="uq_messages_session_key"),
        Index("ix_messages_session_id_id", "session_id", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    role: str = Field(max_length=16)
    content: str = Field(sa_column=Column(Text, nullable=False))
    sender: str | None = Field(default=None, max_length=64)
    platform_channel: str | None = Field(default=None, max_length=64)
    platform_ts: str | None = Field(default=None, max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=255)
    tool_calls: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    tool_call_id: str | None = Field(default=None, max_length=128)
    turn_id: int | None = Field(default=None)
    created_at: datetime = timestamp()


class TurnRow(SQLModel, table=True):
    __tablename__ = "turns"
    __table_args__ = (Index("ix_turns_session_status", "session_id", "status"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    agent: str = Field(max_length=64)
    status: str = Field(max_length=16)
    # Set on turns from before merged turns existed; newer turns list their inputs in ``inputs``.
    input_message_id: int | None = Field(default=None, foreign_key="messages.id")
    attempts: int = Field(default=0)
    answer: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = timestamp()
    started_at: datetime | None = timestamp(nullable=True)
    finished_at: datetime | None = timestamp(nullable=True)
    # What the channel reported after delivering the answer: the platform's message id, or the error.
    delivered_ref: str | None = Field(default=None, max_length=255)
    delivery_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class InputRow(SQLModel, table=True):
    """One message a person sent, from arrival until a turn takes it into the transcript (or it is refused).

    Inputs wait here, not in ``messages``: a turn writes them to the transcript when it takes them, so
    the transcript's order is the order the model saw things in, and a cancelled input leaves no trace.
    """

    __tablename__ = "inputs"
    __table_args__ = (
        UniqueConstraint("session_id", "idempotency_key", name="uq_inputs_session_key"),
        Index("ix_inputs_session_status", "session_id", "status", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    kind: str = Field(max_length=16)  # "message" (asks for an answer) or "context"
    status: str = Field(max_length=16)  # waiting, taken, cancelled, refused
    text: str = Field(sa_column=Column(Text, nullable=False))
    images: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    # JSON: files shared with it (core.model.Attachment), read when a turn takes it.
    attachments: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    sender: str | None = Field(default=None, max_length=64)
    agent: str | None = Field(default=None, max_length=64)
    platform_channel: str | None = Field(default=None, max_length=64)
    platform_ts: str | None = Field(default=None, max_length=64)
    idempotency_key: str | None = Field(default=None, max_length=255)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    message_id: int | None = Field(default=None, foreign_key="messages.id")
    note: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # why refused or cancelled
    created_at: datetime = timestamp()
    taken_at: datetime | None = timestamp(nullable=True)
    # A message nobody addressed, in a place the bot listens in: its turn may end silently (core.listening).
    answer_optional: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    # The W3C traceparent of its intake's span (core.tracing): the turn that takes it, resumed or not, and the
    # answer's delivery join that trace. None when traces are off.
    trace_context: str | None = Field(default=None, max_length=64)


class ControlRow(SQLModel, table=True):
    """Operator switches that every process must see: intake pause, per-place queue modes."""

    __tablename__ = "control"

    key: str = Field(primary_key=True, max_length=255)
    value: str = Field(sa_column=Column(Text, nullable=False))
    updated_at: datetime = timestamp()


class ProcessedEventRow(SQLModel, table=True):
    """Delivery ids (e.g. Slack ``event_id``) already taken in: the durable dedupe of redeliveries."""

    __tablename__ = "processed_events"

    key: str = Field(primary_key=True, max_length=255)
    received_at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))


class ApprovalRow(SQLModel, table=True):
    """A gated tool call parked until a person decides (SPEC §7). Settled exactly once."""

    __tablename__ = "approvals"
    __table_args__ = (Index("ix_approvals_status_expires", "status", "expires_at"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    tool_call_id: str = Field(max_length=128, index=True)
    tool: str = Field(max_length=64)
    arguments: str = Field(sa_column=Column(Text, nullable=False))  # JSON
    agent: str = Field(max_length=64)
    place: str | None = Field(default=None, max_length=255)
    requester: str | None = Field(default=None, max_length=64)
    # JSON list: who else had messages in the turn when the call was asked (the requester is its first sender)
    other_senders: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    risk: str = Field(max_length=16)
    status: str = Field(max_length=16)  # pending, approved, denied, expired, cancelled
    parked_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    decided_by: str | None = Field(default=None, max_length=64)
    decided_at: datetime | None = timestamp(nullable=True)
    reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    always: bool = Field(default=False)  # approved with "Always allow": a grant was recorded
    announcement: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # where it was posted
    started_at: datetime | None = timestamp(nullable=True)  # the approved call began to run
    approvers: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # a rule's (JSON), else None
    quorum: int = Field(default=1, sa_column=Column(Integer, nullable=False, server_default="1"))  # distinct votes
    policy: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # the rule that asked
    notify: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # JSON: thread, dm
    escalate_to: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # JSON: who joins
    remind_at: datetime | None = timestamp(nullable=True)  # approvers are reminded then (and escalate_to join)
    reminded_at: datetime | None = timestamp(nullable=True)  # ...once: set by whoever reminded them
    # Grants (core.grants): how long one made on this request lasts (its rule's grant_ttl_s; None: never expires, or
    # the rule grants nothing), the fingerprint of the rule it is bound to, and which grant the decision recorded.
    grant_ttl_s: float | None = Field(default=None, sa_column=Column(Float, nullable=True))
    grant_rule_key: str | None = Field(default=None, max_length=64)
    grant_scope: str | None = Field(default=None, max_length=16)  # place (Always allow), thread
    # Separation of duties (core.self_approval): everyone whose words the turn had taken when it asked (JSON list),
    # and whether they may approve it; stored so a decision after a restart, on any replica, is judged alike.
    senders: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    self_approval: bool = Field(default=True, sa_column=Column(Boolean, nullable=False, server_default=true()))
    # A rule's step_up: an approval counts once the approver confirms it with a passkey (core.passkeys)
    step_up: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, server_default=false()))
    # One model step's gated calls are asked on one card (issue 40.3): they share this key ("<turn>:<step>").
    batch: str | None = Field(default=None, max_length=64, index=True)
    # An approver's edit (JSON): what runs instead of ``arguments`` (kept as the model asked), and who edited.
    edited_arguments: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    edited_by: str | None = Field(default=None, max_length=64)


class ApprovalVoteRow(SQLModel, table=True):
    """One approver's vote on a request that needs several (quorum): one per person, audited."""
    __tablename__ = "approval_votes"
    __table_args__ = (UniqueConstraint("approval_id", "voter", name="uq_approval_votes_voter"),)

    id: int | None = Field(default=None, primary_key=True)
    approval_id: int = Field(foreign_key="approvals.id")
    voter: str = Field(max_length=64)
    verdict: str = Field(max_length=16)  # approve, deny
    voted_at: datetime = timestamp()


class GrantRow(SQLModel, table=True):
    """An "Always allow": this agent may run exactly this call (``call_text``) at this place again.

    ``arg_pattern`` is what grants before revision 0007 matched; 0007 revoked those (they covered
    every call of a tool), and it is never written again.
    """

    __tablename__ = "grants"
    __table_args__ = (Index("ix_grants_lookup", "agent", "tool", "place"),)

    id: int | None = Field(default=None, primary_key=True)
    agent: str = Field(max_length=64)
    tool: str = Field(max_length=64)
    place: str | None = Field(default=None, max_length=255)
    arg_pattern: str | None = Field(default=None, max_length=500)
    call_text: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # the exact canonical call
    created_by: str = Field(max_length=64)
    created_at: datetime = timestamp()
    revoked_by: str | None = Field(default=None, max_length=64)
    revoked_at: datetime | None = timestamp(nullable=True)
    # Allow in this thread: the conversation (core.model.thread_of) it holds in; None: the whole place.
    thread: str | None = Field(default=None, max_length=255)
    expires_at: datetime | None = timestamp(nullable=True)  # None: never (a call no rule decides)
    rule: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # the rule it was made under
    rule_key: str | None = Field(default=None, max_length=64)  # ...its fingerprint: lookups match this exactly


class AuditRow(SQLModel, table=True):
    """Who did what, when: decisions, grants, overrides. Never holds a secret value."""

    __tablename__ = "audit"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(sa_column=Column(UTCDateTime(), nullable=False, index=True))
    actor: str = Field(max_length=64)
    action: str = Field(max_length=64)
    subject: str = Field(max_length=255)
    detail: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class SecretRow(SQLModel, table=True):
    """A sealed credential. Everything but ``ciphertext`` is readable without a key."""

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("name", "scope", "agent", name="uq_secrets_name_scope_agent"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64)
    scope: str = Field(max_length=16)  # "agent" (one agent's) or "shared" (agents granted it)
    agent: str = Field(default="", max_length=64)  # the owner for scope "agent"; "" for shared
    key_id: str = Field(max_length=64)
    ciphertext: str = Field(sa_column=Column(Text, nullable=False))  # base64(nonce + AES-GCM ciphertext)
    # What the AEAD associated data binds: 1 = the name only (before 0007), 2 = name, scope, agent and row id.
    aad_version: int = Field(default=2)
    hosts: str | None = Field(default=None, sa_column=Column(Text, nullable=True))  # JSON list; None = anywhere
    created_by: str = Field(max_length=64)
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()
    last_used_at: datetime | None = timestamp(nullable=True)


class SecretGrantRow(SQLModel, table=True):
    """A shared credential an agent may use."""

    __tablename__ = "secret_grants"

    secret_id: int = Field(foreign_key="secrets.id", primary_key=True)
    agent: str = Field(max_length=64, primary_key=True)
    granted_by: str = Field(max_length=64)
    granted_at: datetime = timestamp()


class CredentialRequestRow(SQLModel, table=True):
    """The agent asked for a secret; a person provides it (SPEC §8)."""

    __tablename__ = "credential_requests"
    __table_args__ = (Index("ix_credential_requests_status_expires", "status", "expires_at"),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    tool_call_id: str = Field(max_length=128)
    name: str = Field(max_length=64)
    reason: str = Field(sa_column=Column(Text, nullable=False))
    scope: str = Field(max_length=16)
    agent: str = Field(max_length=64)
    requester: str | None = Field(default=None, max_length=64)
    status: str = Field(max_length=16)  # pending, provided, expired, cancelled
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    provided_by: str | None = Field(default=None, max_length=64)
    provided_at: datetime | None = timestamp(nullable=True)
    announcement: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class CredentialLinkRow(SQLModel, table=True):
    """A one-time link's id (JWT ``jti``): burned when used."""

    __tablename__ = "credential_links"

    jti: str = Field(primary_key=True, max_length=64)
    request_id: int = Field(foreign_key="credential_requests.id")
    expires_at: datetime = timestamp()
    used_at: datetime | None = timestamp(nullable=True)


class LeaseRow(SQLModel, table=True):
    """Who may do something alone (run a session's turns, run the scheduler) until ``expires_at``."""

    __tablename__ = "leases"

    name: str = Field(primary_key=True, max_length=255)
    holder: str = Field(max_length=64)
    expires_at: datetime = timestamp()


class WebSessionRow(SQLModel, table=True):
    """A web chat login. Only a digest of the cookie's random id is stored; revoking ends it everywhere."""

    __tablename__ = "web_sessions"

    id_digest: str = Field(primary_key=True, max_length=64)  # sha256 hex of the cookie value
    created_at: datetime = timestamp()
    expires_at: datetime = timestamp()
    revoked_at: datetime | None = timestamp(nullable=True)


class DeliveryRow(SQLModel, table=True):
    """The outbox: an answer still to be delivered, written in the same commit as the answer itself.

    Its key is the turn's id, which is also the delivery id the platform message carries, with the
    database's install id and the session (so a retry can tell whether an earlier attempt landed). The
    text is the turn's ``answer`` (already redacted)."""

    __tablename__ = "deliveries"
    __table_args__ = (Index("ix_deliveries_status_next", "status", "next_attempt_at"),)

    turn_id: int = Field(primary_key=True, foreign_key="turns.id", sa_column_kwargs={"autoincrement": False})
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    channel: str = Field(max_length=32)
    status: str = Field(max_length=16)  # DeliveryStatus
    attempts: int = Field(default=0)
    # When the next attempt may start; while one runs, when its claim runs out (a crashed claimer's row
    # is then taken over).
    next_attempt_at: datetime = timestamp()
    claimed_by: str | None = Field(default=None, max_length=64)
    ref: str | None = Field(default=None, max_length=255)  # where it landed (Slack: the first message's ts)
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: datetime = timestamp()
    finished_at: datetime | None = timestamp(nullable=True)
    told: bool = Field(default=False)  # a given-up answer: the thread was told it was lost
    # Given up: how often telling the thread was tried (claimed_by / next_attempt_at then hold the try's claim).
    notice_tries: int = Field(default=0)


class FeedbackRow(SQLModel, table=True):
    """A person's verdict on an answer (the feedback buttons under it): one per person and turn, the latest wins."""

    __tablename__ = "feedback"
    __table_args__ = (UniqueConstraint("turn_id", "user", name="uq_feedback_turn_user"),
                      Index("ix_feedback_updated", "updated_at"))

    id: int | None = Field(default=None, primary_key=True)
    turn_id: int = Field(foreign_key="turns.id")
    session_id: str = Field(foreign_key="sessions.id", max_length=255)
    user: str = Field(max_length=255)
    positive: bool
    created_at: datetime = timestamp()
    updated_at: datetime = timestamp()


class ScheduleRow(SQLModel, table=True):
    """A prompt that runs on a trigger and posts its answer to an approved destination (SPEC §9)."""

    __tablename__ = "schedules"

    id: int | None = Field(default=None, primary_key=True)
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    trigger: str = Field(sa_column=Column(Text, nullable=False))  # JSON: {"cron"|"every_seconds"|"at", "timezone"}
    destination: str = Field(max_length=255)  # as the person wrote it ("#ops")
    destination_id: str = Field(max_length=255)  # as the channel knows it ("C123")
    channel: str = Field(max_length=32)  # the adapter that delivers ("slack")
    agent: str = Field(max_length=64)
    creator: str = Field(max_length=64)
    # The creator's trust level at creation (core.trust); None: created before levels existed (a member's).
    creator_trust: str | None = Field(default=None, max_length=16)
    origin_session: str | None = Field(default=None, max_length=255)  # where it was asked for
    # Everyone who had written in that conversation when it was created (JSON list, the creator included): a
    # firing acts through the creator's personal connections only if nobody else had. None: not recorded (a
    # schedule from before this was), so never taken as alone.
    origin_senders: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    status: str = Field(max_length=32)  # pending_destination, active, paused, cancelled, done
    approval_id: int | None = Field(default=None)
    created_at: datetime = timestamp()
    firings: int = Field(default=0)
    failures: int = Field(default=0)  # consecutive failed deliveries
    last_fired_at: datetime | None = timestamp(nullable=True)
    last_outcome: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class FiringRow(SQLModel, table=True):
    __tablename__ = "firings"
    __table_args__ = (UniqueConstraint("schedule_id", "n", name="uq_firings_schedule_n"),)

    id: int | None = Field(default=None, primary_key=True)
    schedule_id: int = Field(foreign_key="schedules.id")
    n: int
    session_id: str = Field(max_length=255)
    status: str = Field(max_length=16)  # running, posted, failed, skipped
    started_at: datetime = timestamp()
    finished_at: datetime | None = timestamp(nullable=True)
    ts: str | None = Field(default=None, max_length=64)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))


class WebhookEventRow(SQLModel, table=True):
    """A delivery to ``POST /events/<source>`` (SPEC §17), stored before its 202: queued until its turn ends
    answered or failed; filtered and duplicate deliveries are recorded and start nothing."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        # A delivery id is taken once per source: a second first delivery (another replica's, racing) fails here
        # and is stored as a duplicate. Duplicate rows repeat the id; NULL ids (bearer) never collide.
        Index("uq_webhook_events_delivery", "source", "delivery_id", unique=True,
              sqlite_where=text("status <> 'duplicate'"), postgresql_where=text("status <> 'duplicate'")),
        # A GitHub body is taken once per source too, whatever its (unsigned) delivery id says.
        Index("uq_webhook_events_body", "source", "body_digest", unique=True,
              sqlite_where=text("status <> 'duplicate'"), postgresql_where=text("status <> 'duplicate'")),
        Index("ix_webhook_events_status_id", "status", "id"),
        Index("ix_webhook_events_received", "received_at"),
        # An id is never given twice, even once pruning took the newest rows: a turn is deduplicated by
        # ``event:<id>`` in its conversation, so a reused id would be taken for the old event (never answered).
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    source: str = Field(max_length=64)
    kind: str = Field(max_length=16)  # github | standard | bearer
    event_type: str = Field(max_length=255)
    delivery_id: str | None = Field(default=None, max_length=255)
    body_digest: str | None = Field(default=None, max_length=64)  # GitHub: the body's SHA-256 (hex)
    status: str = Field(max_length=16)  # queued | answered | failed | filtered | duplicate
    payload: str = Field(sa_column=Column(Text, nullable=False))  # the body as received
    thread_key: str | None = Field(default=None, max_length=255)  # the rendered `thread`; None: its own thread
    session_id: str | None = Field(default=None, max_length=255)
    input_id: int | None = Field(default=None)
    note: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    received_at: datetime = timestamp()
    finished_at: datetime | None = timestamp(nullable=True)
    replay_of: int | None = Field(default=None)


class WebhookRateRow(SQLModel, table=True):
    """Deliveries a source sent in one fixed minute, counted in the database so the limit holds across replicas."""

    __tablename__ = "webhook_rates"

    source: str = Field(primary_key=True, max_length=64)
    window_start: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    count: int = Field(default=0)


class ListenRateRow(SQLModel, table=True):
    """Unaddressed turns started in one place (a channel the bot listens in) in one fixed minute: counted in the
    database, so ``listen_per_minute`` holds across restarts and replicas."""

    __tablename__ = "listen_rates"

    place: str = Field(primary_key=True, max_length=255)
    window_start: datetime = Field(sa_column=Column(UTCDateTime(), primary_key=True))
    count: int = Field(default=0)


class MemoryRow(SQLModel, table=True):
    """A note an agent keeps across its threads (SPEC §17 memory): written with ``remember`` or proposed by the
    memory pass, found by words (``memories_fts`` on SQLite, a stored ``text_search`` tsvector with a GIN index on
    PostgreSQL: neither is in this metadata, see ``core.store.memories.in_metadata``)."""

    __tablename__ = "memories"
    __table_args__ = (
        # An agent's pinned ones newest first, its oldest unpinned one (the first out), its count.
        Index("ix_memories_agent_pinned_id", "agent", "pinned", "id"),
        # A forgotten id is never given again: a recall's "#12" must not name a later memory.
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    agent: str = Field(max_length=64)
    text: str = Field(sa_column=Column(Text, nullable=False))
    pinned: bool = Field(default=False)
    proposed: bool = Field(default=False)  # the memory pass proposed it (nobody asked for it in words)
    written_by: str | None = Field(default=None, max_length=255)  # the sender whose turn wrote it
    session_id: str | None = Field(default=None, max_length=255)  # the conversation it came from
    created_at: datetime = timestamp()


class FreezeRow(SQLModel, table=True):
    """A change freeze set with ``bot freeze`` or ``/bot freeze`` (SPEC §17): gated calls are refused from
    ``starts_at`` until ``until`` unless lifted. Kept in the database so every replica honours it at once."""

    __tablename__ = "freezes"
    __table_args__ = (Index("ix_freezes_until", "until"),)

    id: int | None = Field(default=None, primary_key=True)
    starts_at: datetime = timestamp()
    until: datetime = timestamp()
    reason: str = Field(sa_column=Column(Text, nullable=False))
    created_by: str = Field(max_length=255)
    created_at: datetime = timestamp()
    lifted_at: datetime | None = timestamp(nullable=True)
    lifted_by: str | None = Field(default=None, max_length=255)


class UsageRow(SQLModel, table=True):
    """What model calls used in one UTC day, for one agent and one person (a turn's requester; "nobody" for an
    event's turn): spending caps are checked against it, ``bot usage`` and /metrics report it (core.spending)."""

    __tablename__ = "usage"

    day: str = Field(primary_key=True, max_length=10)  # "2026-12-05": ISO order is date order (month ranges)
    agent: str = Field(primary_key=True, max_length=64)
    person: str = Field(primary_key=True, max_length=255)
    calls: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    input_tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    output_tokens: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    # Millionths of the price table's currency: integers add up exactly (a float sum drifts).
    cost_micros: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    unpriced_calls: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))

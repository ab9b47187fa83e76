"""Durable state: the database, its schema, and the queries core needs."""

from core.store.approvals import ApprovalStore
from core.store.control import ControlStore
from core.store.conversations import ConversationStore
from core.store.credentials import CredentialStore
from core.store.database import Database
from core.store.inputs import Budget, HeldElsewhere, InputStore, Taken
from core.store.intake import Accepted, AcceptOutcome
from core.store.leases import LeaseStore
from core.store.passkeys import PasskeyStore
from core.store.web_sessions import WebSessionStore

__all__ = [
    "AcceptOutcome",
    "Accepted",
    "ApprovalStore",
    "Budget",
    "ControlStore",
    "ConversationStore",
    "CredentialStore",
    "Database",
    "HeldElsewhere",
    "InputStore",
    "LeaseStore",
    "PasskeyStore",
    "Taken",
    "WebSessionStore",
]

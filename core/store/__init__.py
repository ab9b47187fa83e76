"""Durable state: the database, its schema, and the queries core needs."""

from core.store.conversations import AcceptOutcome, ConversationStore
from core.store.database import Database

__all__ = ["AcceptOutcome", "ConversationStore", "Database"]

"""Every exception core raises on purpose: the root, refusals typed by kind, and the failures of its parts."""

from __future__ import annotations


class CoreError(Exception):
    """Root of every error raised on purpose by the core engine."""


class StoreError(CoreError):
    """The database could not be opened, migrated or used."""


class SchemaTooNew(CoreError):
    """The database was migrated by a newer version of the bot: this code does not know its schema, so it must not
    touch it (not a StoreError: checking DATABASE_URL or the server does not help)."""


class InvalidInput(CoreError):
    """Input from outside (a channel, a person) that core refuses; the message says why."""


# Refusals by kind, so an adapter picks its answer (an HTTP status) by type, never by the words.
class NotAllowed(InvalidInput):
    """The person may not do this (HTTP 403)."""


class NotFound(InvalidInput):
    """There is no such thing (HTTP 404)."""


class Conflict(InvalidInput):
    """It exists, but its state does not allow this: already settled, cancelled, not paused (HTTP 409)."""


class Unavailable(CoreError):
    """Core cannot take this right now (e.g. it is starting or stopping); trying later may work (HTTP 503)."""


class ProviderError(CoreError):
    """A model call failed. ``kind`` classifies it; ``retryable`` says whether trying again may help."""

    # "stalled": a streamed answer that sent nothing for LLM_IDLE_TIMEOUT_S (never retried: it is the fallback's turn).
    KINDS = ("auth", "rate_limit", "network", "model", "context_overflow", "stalled", "unknown")

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"unknown provider error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status

    @property
    def user_message(self) -> str:
        """What a person in the thread is told: the problem, and what to do about it."""
        hints = {
            "auth": "The model endpoint rejected the API key (check LLM_API_KEY).",
            "rate_limit": "The model endpoint kept answering 'too many requests'; try again in a minute.",
            "network": "I could not reach the model endpoint (check LLM_BASE_URL and that the server is up).",
            "model": "The model endpoint refused the request (check LLM_MODEL and the server's logs).",
            "context_overflow": "This conversation is too long for the model; start a new thread.",
            "stalled": "The model stopped sending its answer (LLM_IDLE_TIMEOUT_S passed without a word).",
            "unknown": "The model call failed unexpectedly.",
        }
        return f"{hints[self.kind]} Details: {self}"


class ModelsFailed(ProviderError):
    """The primary model failed for good and the fallback model failed too: the turn ends, said once."""

    def __init__(self, primary: str, fallback: str, error: ProviderError) -> None:
        # Only the shown forms: the fallback's raw text is an outsider's (URL credentials, kilobytes of it).
        super().__init__(error.kind, fallback, retryable=False, status=error.status)
        self.primary = primary  # "<kind>: <detail>", already short and masked (core.model_routing)
        self.fallback = fallback  # the same of the fallback's error

    @property
    def user_message(self) -> str:
        return (f"Both models failed: the primary ({self.primary}) and the fallback ({self.fallback}). "
                "I stopped here; nothing else was done.")


class StepLimitReached(CoreError):
    """The agent used ``max_steps`` model calls without giving a final answer."""


class BudgetExhausted(CoreError):
    """The thread used its token budget and nobody chose Continue: the turn ends with this message."""


class ToolError(CoreError):
    """A tool call that could not run as asked; the message goes back to the model as the result."""


class SchemaCheckError(Exception):
    """The arguments could not be checked against the schema (an unresolvable reference, a costly pattern)."""


class DeliveryFailed(CoreError):
    """The platform did not take a message. ``retryable``: trying again later may work (a 5xx, a
    timeout, a rate limit); otherwise it never will (the channel is gone, the bot was removed)."""

    def __init__(self, error: str, *, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class FetchFailed(CoreError):
    """A shared file could not be read; the reason is said to the person who shared it."""


class FileTooBig(FetchFailed):
    """A shared file is larger than the limit it was read with (nothing past the limit was read)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"it is over the limit of {limit} bytes")
        self.limit = limit


class OAuthError(CoreError):
    """A token endpoint refused or could not be reached. ``invalid_grant``: the grant itself is dead (a
    refresh token revoked or expired), which calls for consent again; anything else is reported as it is."""

    def __init__(self, message: str, *, invalid_grant: bool = False) -> None:
        super().__init__(message)
        self.invalid_grant = invalid_grant


class VaultError(CoreError):
    """A secret cannot be sealed or opened; the message names the key id, never the value."""

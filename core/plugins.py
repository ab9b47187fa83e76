"""What a channel package offers the wiring: a ``ChannelPlugin``, found through the entry-point group
``bot.channels``. It brings its own settings (a pydantic-settings model with its own env prefix), its
``build(settings, context) -> Channel`` factory, its doctor checks, its tools and its sealed tables, so adding a
channel touches nothing outside its own folder."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

if TYPE_CHECKING:  # a plug-in is loaded by every command that reads settings: what it names only for types stays out
    from core.clock import Clock
    from core.gateway import Gateway
    from core.ports import Channel
    from core.sealed_values import SealedKind
    from core.store.database import Database
    from core.tools import Tool
    from core.vault import KeyRing

ENTRY_POINTS = "bot.channels"


@dataclass(frozen=True)
class Check:
    """One line of ``bot doctor``: what was checked, whether it holds, and what to do when it does not."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False


class ChannelSettings(Protocol):
    """A channel's settings, read and checked at start with everyone else's. ``SECRETS``: its fields whose
    values are masked everywhere and never echoed in a settings error."""

    SECRETS: ClassVar[tuple[str, ...]]

    @property
    def enabled(self) -> bool: ...  # the channel runs in this process

    def secrets(self) -> dict[str, str | None]: ...  # secret settings by their variable's name


S = TypeVar("S", bound=ChannelSettings)


@dataclass(frozen=True)
class ChannelContext:
    """What every channel is built with: core's front door and the shared infrastructure."""

    gateway: Gateway
    db: Database
    clock: Clock
    keys: KeyRing  # the vault's keys: a channel's own sealed values (a workspace's token)
    learn_secret: Callable[[str, str], None]  # (label, value): a secret the channel opens is masked from then on
    public_url: str | None  # BOT_PUBLIC_URL
    # Its own table of bot.toml ([<name>], an instance of its plugin's ``section`` model), checked with the rest
    # of the file; None when the file has none.
    section: Any = None


@dataclass(frozen=True)
class DoctorContext:
    database_url: str
    # The vault's keys when a check needs them, else why they do not load (asked only then: loading may
    # create the key file).
    keys: Callable[[], KeyRing | str]


async def _no_checks(_settings: Any, _context: DoctorContext) -> list[Check]:
    return []


@dataclass(frozen=True)
class ChannelPlugin(Generic[S]):
    name: str
    settings: type[S]  # its env prefix is the model's own
    build: Callable[[S, ChannelContext], Channel]
    # ``bot doctor`` for this channel (called whether or not it is enabled: it says which).
    checks: Callable[[S, DoctorContext], Awaitable[list[Check]]] = _no_checks
    # Lines for the start-up banner, given the URL the bot listens at.
    announce: Callable[[S, str], list[str]] = lambda _settings, _url: []
    # The model's tools this channel offers once built (e.g. posting to one of its places).
    tools: Callable[[Channel], list[Tool]] = lambda _channel: []
    # Whether a bare entry of BOT_APPROVERS, BOT_ADMINS or bot.toml (no "<channel>:") names one of this
    # channel's people or groups (``core.people``).
    people: Callable[[str], bool] = lambda _entry: False
    # Whether an id written as "<channel>:<id>" has the shape of one of this channel's people or groups (Slack:
    # U…/W…/S…): a wrong shape is refused when settings and bot.toml are read, not left to name nobody.
    ids: Callable[[str], bool] = lambda _id: True
    # Whether people other than the operator talk to the bot through it (``bot doctor`` then warns when they
    # could approve their own shell commands).
    shared: bool = True
    # Whether schedules' destinations ("#name", an id) are this channel's places.
    destinations: bool = False
    # ``bot doctor``: a destination as written (an event source's) to the id the bot posts to, with its own settings;
    # raises with the reason when it cannot post there.
    resolve_destination: Callable[[S, str], Awaitable[str]] | None = None
    # The model of its own bot.toml table, ``[<name>]`` (a pydantic model, extra keys forbidden), if it has one.
    section: type[Any] | None = None
    # Its tables of sealed values (``bot credentials rotate`` and the doctor cover them).
    sealed: Callable[[Database], list[SealedKind[Any]]] = lambda _db: []

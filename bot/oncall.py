"""Who is on call in a PagerDuty schedule (``oncall:<schedule id>`` approvers, core.oncall), as chat people.

PagerDuty's REST API is read through its maintained client (the ``pagerduty`` package). That client is
synchronous (httpx2 underneath), so each read runs in a worker thread with a short timeout: it is network IO, and
the event loop never waits on it. Each schedule's answer is kept for ``CACHE_S`` (by the injected clock); the
people's e-mail addresses are matched to each channel's users by that channel (Slack: ``users.lookupByEmail``).

PagerDuty's answer is data from outside: at most ``MAX_BODY_BYTES`` of it are read, at most ``MAX_ON_CALL``
people, and only well-formed e-mail addresses are looked up. Redirects are not followed, and the token is only ever
in the Authorization header (never logged: a failure is logged by its kind and status).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import httpx2
import pagerduty

from bot.config.table import loopback
from bot.errors import SettingsError
from bot.settings import Settings
from core.agents import Agent
from core.clock import Clock, SystemClock
from core.oncall import MAX_ON_CALL, SCHEDULE_ID, EmailDirectory, RotaUnavailable, names_oncall
from core.people import person
from core.plugins import Check
from core.policies import Policy
from core.ports import Ports

log = logging.getLogger(__name__)

CACHE_S = 60.0
TIMEOUT_S = 5.0
READ_THREADS = 2  # reads of PagerDuty at once (one per schedule; more wait, then fall back)
MAX_BODY_BYTES = 1_000_000
_EMAIL = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,8}")


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


class _CappedStream(httpx2.SyncByteStream):
    """A response body read only up to ``limit`` bytes and until ``deadline`` (``time.monotonic``): a hostile
    server's endless answer stops there, and so does one dripped a byte at a time (each within the read timeout)."""

    def __init__(self, stream: httpx2.SyncByteStream, limit: int, deadline: float) -> None:
        self._stream = stream
        self._limit = limit
        self._deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise _TooLarge
            if time.monotonic() > self._deadline:
                raise _TooSlow
            yield chunk

    def close(self) -> None:
        self._stream.close()


class _CappedTransport(httpx2.BaseTransport):
    """Every answer read up to ``limit`` bytes. ``plain``: the client's https URL is served over plain http (the
    client takes https only; settings allow plain http to this machine only, for a fake server in tests)."""

    def __init__(self, limit: int, *, plain: bool = False, deadline_s: float = TIMEOUT_S) -> None:
        self._inner = httpx2.HTTPTransport()
        self._limit = limit
        self._plain = plain
        self._deadline_s = deadline_s

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        deadline = time.monotonic() + self._deadline_s
        if self._plain and request.url.host and loopback(request.url.host):
            request.url = request.url.copy_with(scheme="http")
        response = self._inner.handle_request(request)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(response.status_code, headers=response.headers, request=request,
                               stream=_CappedStream(response.stream, self._limit, deadline),
                               extensions=response.extensions)

    def close(self) -> None:
        self._inner.close()


def pagerduty_client(token: str, api_url: str, *, timeout_s: float = TIMEOUT_S) -> pagerduty.RestApiV2Client:
    """The maintained client, made for a person who waits: one attempt per read, a 429 retried once, quickly."""
    plain = api_url.startswith("http://")
    base_url = "https://" + api_url.removeprefix("http://") if plain else api_url
    client = pagerduty.RestApiV2Client(token, base_url=base_url,
                                       transport=_CappedTransport(MAX_BODY_BYTES, plain=plain, deadline_s=timeout_s))
    client.timeout = timeout_s  # type: ignore[assignment]  # annotated int upstream; httpx2 takes a float
    client.max_network_attempts = 0  # a network error fails the read at once (the request falls back)
    client.retry[429] = 1
    client.sleep_timer = 0.25
    return client


def read_schedule(client: pagerduty.RestApiV2Client, schedule: str, now: datetime) -> list[str]:
    """The e-mail addresses of the people on call in ``schedule`` at ``now`` (blocking: run it in a thread).
    Raises RotaUnavailable with what went wrong, in words that quote nothing PagerDuty sent."""
    if SCHEDULE_ID.fullmatch(schedule) is None:  # never part of a path unless it is an id
        raise RotaUnavailable("not a schedule id")
    # The range is one second: PagerDuty names everyone on call at any time in it, so a minute would let whoever
    # takes over next approve up to a minute early (and the answer is kept CACHE_S on top of that).
    since = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    until = (now + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        response = client.get(f"/schedules/{schedule}/users", params={"since": since, "until": until})
    except pagerduty.HttpError as exc:  # 401 (the client raises it) or a redirect
        status = exc.response.status_code if exc.response is not None else None
        log.warning("PagerDuty schedule %s: HTTP %s", schedule, status)
        raise RotaUnavailable(_status_said(status)) from None
    except _TooLarge:
        log.warning("PagerDuty schedule %s: answer over %d bytes", schedule, MAX_BODY_BYTES)
        raise RotaUnavailable("PagerDuty's answer was too large") from None
    except _TooSlow:
        log.warning("PagerDuty schedule %s: the answer was still coming at its deadline", schedule)
        raise RotaUnavailable("PagerDuty did not answer in time") from None
    except Exception as exc:  # the client's own Error (network), httpx2's, anything: the request falls back
        log.warning("PagerDuty schedule %s: %s", schedule, type(exc).__name__)
        raise RotaUnavailable("PagerDuty could not be reached") from None
    if not response.is_success:
        log.warning("PagerDuty schedule %s: HTTP %s", schedule, response.status_code)
        raise RotaUnavailable(_status_said(response.status_code))
    try:
        users = response.json().get("users")
    except (ValueError, AttributeError, RecursionError):  # nested deeper than Python recurses: garbage all the same
        users = None
    if not isinstance(users, list):
        raise RotaUnavailable("PagerDuty's answer was not a list of users")
    if len(users) > MAX_ON_CALL:
        raise RotaUnavailable(f"PagerDuty named more than {MAX_ON_CALL} people on call")
    emails = [u["email"].strip().lower() for u in users
              if isinstance(u, dict) and isinstance(u.get("email"), str) and _EMAIL.fullmatch(u["email"].strip())]
    if not emails:
        raise RotaUnavailable("nobody is on call")
    return list(dict.fromkeys(emails))


def _status_said(status: int | None) -> str:
    if status == 401:
        return "PagerDuty refused PAGERDUTY_TOKEN (401)"
    if status == 403:
        return "PAGERDUTY_TOKEN may not read this schedule (403)"
    if status == 404:
        return "PagerDuty has no such schedule (404)"
    if status is not None and 300 <= status < 400:
        return f"PagerDuty answered with a redirect ({status}), which is not followed"
    return f"PagerDuty answered HTTP {status}" if status is not None else "PagerDuty refused the request"


class PagerDutyRota:
    """``core.oncall.OnCallRota`` from PagerDuty: each schedule's e-mail addresses (cached for ``CACHE_S``),
    matched to people by each channel that can look them up by e-mail."""

    def __init__(self, client: pagerduty.RestApiV2Client, directories: Callable[[], list[EmailDirectory]],
                 clock: Clock, *,
                 timeout_s: float = TIMEOUT_S, cache_s: float = CACHE_S) -> None:
        self.client = client
        self.directories = directories
        self.clock = clock
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._schedules: dict[str, tuple[datetime, list[str]]] = {}
        self._reads: dict[str, asyncio.Future[list[str]]] = {}  # one read of a schedule at a time
        # Its own threads: a read that outlives its wait (a server dripping its headers) holds one of these, never
        # one of the event loop's default executor (DNS lookups for every other request wait on those).
        self._threads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="pagerduty")

    async def people(self, schedule: str) -> frozenset[str]:
        emails = await self.emails(schedule)
        found: set[str] = set()
        for email in emails:
            for directory in self.directories():
                user = await directory.person_by_email(email)
                if user is not None:
                    found.add(person(directory.name, user))
        if not found:
            raise RotaUnavailable(f"none of the {len(emails)} people on call has a chat account with their e-mail "
                                  "address")
        return frozenset(found)

    async def emails(self, schedule: str) -> list[str]:
        """The e-mail addresses on call in ``schedule``: PagerDuty's answer of the last ``cache_s``, else read."""
        now = self.clock.now()
        cached = self._schedules.get(schedule)
        # Kept for cache_s after it was read; a clock set back since then reads again (never an old answer for hours).
        if cached is not None and timedelta(0) <= now - cached[0] < timedelta(seconds=self.cache_s):
            return cached[1]
        pending = self._reads.get(schedule)
        if pending is None:
            pending = asyncio.ensure_future(self._read(schedule, now))
            self._reads[schedule] = pending
            pending.add_done_callback(lambda _f: self._reads.pop(schedule, None))
        return await asyncio.shield(pending)

    async def _read(self, schedule: str, now: datetime) -> list[str]:
        try:
            read = asyncio.get_running_loop().run_in_executor(self._threads, read_schedule, self.client, schedule, now)
            emails = await asyncio.wait_for(read, self.timeout_s + 1)
        except TimeoutError:
            log.warning("PagerDuty schedule %s: no answer within %gs", schedule, self.timeout_s)
            raise RotaUnavailable("PagerDuty did not answer in time") from None
        except RotaUnavailable:
            raise
        except Exception as exc:  # whatever else an answer makes go wrong: a rota that cannot be read, never a crash
            log.warning("PagerDuty schedule %s: %s", schedule, type(exc).__name__)
            raise RotaUnavailable("PagerDuty's answer could not be read") from None
        if len(self._schedules) > 1024:  # schedules come from the configuration: a bound all the same
            self._schedules.clear()
        self._schedules[schedule] = (now, emails)  # only answers are kept: a failure is asked again next time
        return emails

    async def check(self) -> str | None:
        """``bot doctor``: None when PagerDuty accepts the token, else why not."""
        def read() -> Any:
            return self.client.get("/abilities")  # any valid token may list them

        try:
            response = await asyncio.wait_for(asyncio.to_thread(read), self.timeout_s + 1)
        except pagerduty.HttpError as exc:
            return _status_said(exc.response.status_code if exc.response is not None else None)
        except Exception as exc:
            return f"PagerDuty could not be reached ({type(exc).__name__})"
        if response.is_success:
            return None
        return _status_said(response.status_code)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def uses_oncall(settings: Settings, agents: Iterable[Agent], policies: Iterable[Policy]) -> bool:
    """Whether BOT_APPROVERS, an agent's approvers or a rule's approvers / escalate_to name an on-call rota."""
    named = [*settings.approvers, *(a for agent in agents for a in agent.approvers),
             *(a for policy in policies for a in (*policy.approvers, *policy.escalate_to))]
    return names_oncall(named)


ONCALL_NEEDS_TOKEN = ("approvers name oncall:<schedule id>, which needs PAGERDUTY_TOKEN (a PagerDuty REST API key "
                      "that may read schedules and users): set it, or remove those approvers")


def on_call_rota(settings: Settings, agents: Iterable[Agent], policies: Iterable[Policy], ports: Ports,
                 clock: Clock) -> PagerDutyRota | None:
    """The rota ``oncall:`` approvers are read from: None when none are configured; SettingsError (one line)
    when they are and PAGERDUTY_TOKEN is not set."""
    if not uses_oncall(settings, agents, policies):
        return None
    if not settings.pagerduty_token:
        raise SettingsError(ONCALL_NEEDS_TOKEN)

    def directories() -> list[EmailDirectory]:  # the channels' ports, registered after this is made
        return [port for port in ports.all() if isinstance(port, EmailDirectory)]

    return PagerDutyRota(pagerduty_client(settings.pagerduty_token, settings.pagerduty_api_url), directories, clock)


async def oncall_check(settings: Settings, agents: Iterable[Agent], policies: Iterable[Policy]) -> Check | None:
    """``bot doctor``: when approvers name a rota, whether PagerDuty takes PAGERDUTY_TOKEN (None: no rota named)."""
    agents, policies = list(agents), list(policies)
    if not uses_oncall(settings, agents, policies):
        return None
    fix = ("set PAGERDUTY_TOKEN to a PagerDuty REST API key that may read schedules and users; the Slack app needs "
           "the users:read.email scope (`bot manifest --oncall`)")
    if not settings.pagerduty_token:
        return Check("pagerduty", False, ONCALL_NEEDS_TOKEN, fix)
    rota = PagerDutyRota(pagerduty_client(settings.pagerduty_token, settings.pagerduty_api_url), list, SystemClock())
    try:
        problem = await rota.check()
    finally:
        rota.close()
    if problem is not None:
        return Check("pagerduty", False, f"{settings.pagerduty_api_url}: {problem}", fix)
    return Check("pagerduty", True, f"{settings.pagerduty_api_url} takes PAGERDUTY_TOKEN (oncall: approvers); the "
                                    "Slack app needs the users:read.email scope")

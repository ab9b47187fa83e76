"""The events store (core.store.webhook_events) on SQLite and, with TEST_DATABASE_URL, PostgreSQL: rate windows,
dedupe by delivery id (also when two replicas race), and what the processor and `bot events` use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from core.errors import NotFound
from core.store import Database
from core.store.webhook_events import WebhookEventStore
from core.webhooks.model import EventArrival, Received

T0 = datetime(2026, 12, 5, 3, 0, 10, tzinfo=UTC)


def arrival(delivery_id: str | None = "d-1", *, source: str = "gh", filtered: bool = False, rate: int = 60,
            now: datetime = T0, thread_key: str | None = None) -> EventArrival:
    return EventArrival(source=source, kind="github" if delivery_id else "bearer", event_type="push",
                        delivery_id=delivery_id, payload='{"ref": "main"}', thread_key=thread_key, filtered=filtered,
                        rate_per_minute=rate, now=now)


@pytest.fixture
def store(store_db: Database) -> WebhookEventStore:
    return WebhookEventStore(store_db)


@pytest.fixture
async def replica(store_db: Database) -> AsyncIterator[WebhookEventStore]:
    """A second process's store on the same database: its own engine and connections."""
    other = Database(store_db.url)
    yield WebhookEventStore(other)
    await other.close()


async def test_an_event_is_stored_queued(store: WebhookEventStore) -> None:
    got = await store.receive(arrival(thread_key="acme/api#1"))
    assert got.outcome == "queued" and got.event_id is not None
    row = await store.get(got.event_id)
    assert row is not None
    assert (row.source, row.kind, row.event_type, row.delivery_id, row.status, row.payload, row.thread_key) == (
        "gh", "github", "push", "d-1", "queued", '{"ref": "main"}', "acme/api#1")
    assert row.received_at == T0 and row.finished_at is None
    assert [r.id for r in await store.queued()] == [got.event_id]


async def test_a_repeated_delivery_id_is_recorded_as_a_duplicate(store: WebhookEventStore) -> None:
    first = await store.receive(arrival())
    again = await store.receive(arrival())
    assert again.outcome == "duplicate" and again.event_id != first.event_id
    row = await store.get(again.event_id or 0)
    assert row is not None and (row.status, row.note) == ("duplicate", f"duplicate of {first.event_id}")
    assert [r.id for r in await store.queued()] == [first.event_id]
    # The same id from another source is its own delivery; bearer deliveries (no id) never collide.
    assert (await store.receive(arrival(source="other"))).outcome == "queued"
    assert [(await store.receive(arrival(None))).outcome for _ in range(2)] == ["queued", "queued"]


async def test_a_filtered_event_is_recorded_and_not_queued(store: WebhookEventStore) -> None:
    got = await store.receive(arrival(filtered=True))
    assert got.outcome == "filtered"
    assert await store.queued() == []
    assert (await store.receive(arrival())).outcome == "duplicate"  # its id is taken all the same


async def test_the_rate_holds_per_minute_and_nothing_is_stored_over_it(store: WebhookEventStore) -> None:
    got = [await store.receive(arrival(f"d-{n}", rate=3)) for n in range(5)]
    assert [g.outcome for g in got] == ["queued"] * 3 + ["limited"] * 2
    assert got[3] == Received("limited", retry_after_s=50)  # T0 is 10 s into its minute
    assert len(await store.list(limit=10)) == 3
    assert (await store.receive(arrival("d-9", rate=3, source="other"))).outcome == "queued"  # per source
    later = T0 + timedelta(seconds=50)  # the next minute
    assert [(await store.receive(arrival(f"d-{n}", rate=3, now=later))).outcome for n in (5, 6, 7)] == ["queued"] * 3
    assert (await store.receive(arrival("d-8", rate=3, now=later + timedelta(seconds=59.5)))).retry_after_s == 1


async def test_a_group_of_deliveries_is_committed_together(store: WebhookEventStore) -> None:
    got = await asyncio.gather(*(store.receive(arrival(f"d-{n % 10}")) for n in range(30)))
    assert sorted(g.outcome for g in got).count("queued") == 10
    assert store.commits.groups < 30  # they shared transactions


async def test_two_replicas_racing_on_one_delivery_store_one_queued_row(store: WebhookEventStore,
                                                                        replica: WebhookEventStore) -> None:
    for n in range(5):
        got = await asyncio.gather(store.receive(arrival(f"race-{n}")), replica.receive(arrival(f"race-{n}")))
        assert sorted(g.outcome for g in got) == ["duplicate", "queued"], got
    assert len(await store.queued()) == 5


async def test_the_rate_holds_across_replicas(store: WebhookEventStore, replica: WebhookEventStore) -> None:
    got = await asyncio.gather(*(s.receive(arrival(f"d-{n}-{i}", rate=7))
                                 for n in range(6) for i, s in enumerate((store, replica))))
    assert sorted(g.outcome for g in got) == ["limited"] * 5 + ["queued"] * 7


async def test_started_finished_listed(store: WebhookEventStore) -> None:
    ids = [(await store.receive(arrival(f"d-{n}", source="gh" if n % 2 else "am"))).event_id or 0 for n in range(4)]
    await store.finish(ids[0], status="answered", note=None, now=T0 + timedelta(seconds=5), session_id="event:am:x",
                       input_id=7)
    await store.finish(ids[1], status="failed", note="the model is down", now=T0 + timedelta(seconds=6))
    first = await store.get(ids[0])
    assert first is not None and (first.status, first.session_id, first.input_id, first.finished_at) == (
        "answered", "event:am:x", 7, T0 + timedelta(seconds=5))
    assert [r.id for r in await store.queued()] == ids[2:]
    assert [r.id for r in await store.list(limit=10)] == ids[::-1]
    assert [r.id for r in await store.list(source="gh", limit=1)] == [ids[3]]
    assert await store.counts() == {("am", "answered"): 1, ("gh", "failed"): 1, ("am", "queued"): 1,
                                    ("gh", "queued"): 1}


async def test_replay_makes_a_new_queued_event(store: WebhookEventStore) -> None:
    old = (await store.receive(arrival(thread_key="k"))).event_id or 0
    await store.finish(old, status="answered", note=None, now=T0)
    new = await store.replay(old, T0 + timedelta(hours=1))
    assert new.id != old
    assert (new.source, new.kind, new.event_type, new.payload, new.thread_key, new.delivery_id, new.status,
            new.replay_of, new.received_at) == ("gh", "github", "push", '{"ref": "main"}', "k", None, "queued", old,
                                                T0 + timedelta(hours=1))
    assert [r.id for r in await store.queued()] == [new.id]
    with pytest.raises(NotFound):
        await store.replay(9999, T0)


async def test_prune_forgets_old_events_and_rate_windows(store: WebhookEventStore) -> None:
    old = (await store.receive(arrival("d-old", rate=1))).event_id or 0
    stuck = (await store.receive(arrival("d-stuck", source="am"))).event_id or 0
    await store.finish(old, status="answered", note=None, now=T0)
    new = (await store.receive(replace(arrival("d-new"), now=T0 + timedelta(days=31)))).event_id
    assert await store.prune(T0 + timedelta(days=1)) == 1
    assert await store.get(old) is None and await store.get(stuck) is not None  # queued: still work to do
    assert await store.get(new or 0) is not None
    # The old window went with it: the source's count starts again in that minute.
    assert (await store.receive(arrival("d-again", rate=1))).outcome == "queued"

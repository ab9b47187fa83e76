"""``bot audit export --since DATE --format jsonl|csv``: the audit trail, one line per event.

Each row says who, what, when, where and with what outcome: approvals and each approver's vote, grants,
credential events (names and scopes, never a value), schedule changes, operator overrides and web logins
ended. The audit table never holds a secret value; a detail that is not JSON is written as it is."""

from __future__ import annotations

import csv
import json
import sys
from datetime import UTC, datetime
from typing import IO, Any

from bot.errors import BotError
from core.views import AuditEntry

COLUMNS = ("at", "who", "what", "subject", "where", "outcome", "detail")


def parse_day(value: str) -> datetime:
    """``2026-11-30`` or an ISO time (``2026-11-30T12:00:00Z``); UTC unless it says otherwise."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BotError(f"--since/--until takes a date such as 2026-11-30 or 2026-11-30T12:00:00Z, not {value!r}") \
            from None
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    try:
        return when.astimezone(UTC)  # (an offset at the calendar's edge has no UTC time)
    except OverflowError:
        raise BotError(f"--since/--until {value!r} is outside the calendar once read as UTC") from None


def export_row(row: AuditEntry) -> dict[str, Any]:
    try:
        detail = json.loads(row.detail) if row.detail else {}
    except ValueError:
        detail = {"text": row.detail}
    if not isinstance(detail, dict):
        detail = {"value": detail}
    where = detail.get("place") or detail.get("session")
    return {"at": row.at.astimezone(UTC).isoformat(), "who": row.actor, "what": row.action, "subject": row.subject,
            "where": where if isinstance(where, str) else None, "outcome": row.action.rsplit(".", 1)[-1],
            "detail": detail}


def write(rows: list[AuditEntry], fmt: str, out: IO[str] | None = None) -> int:
    out = out if out is not None else sys.stdout  # looked up at the call: whatever stdout is then
    if fmt == "jsonl":
        for row in rows:
            out.write(json.dumps(export_row(row), ensure_ascii=False, sort_keys=True) + "\n")
        return len(rows)
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        line = export_row(row)
        cells = {**line, "where": line["where"] or "",
                 "detail": json.dumps(line["detail"], ensure_ascii=False, sort_keys=True)}
        writer.writerow({key: _inert(str(value)) for key, value in cells.items()})
    return len(rows)


def _inert(cell: str) -> str:
    """A cell a spreadsheet would read as a formula (``=``, ``+``, ``-``, ``@``, tab, CR) starts with ``'``:
    a person's text (a deny reason, a channel name) must not run when the export is opened."""
    return f"'{cell}" if cell[:1] in ("=", "+", "-", "@", "\t", "\r") else cell

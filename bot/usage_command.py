"""``bot usage``: what the model calls used, by UTC day, agent and person (tokens in and out, cost from [[prices]]),
read from the database every replica writes to (core.spending)."""

from __future__ import annotations

import argparse
from datetime import timedelta

from core.clock import SystemClock
from core.display import visible
from core.store.usage import UsageLine, UsageStore


def usage_lines(lines: list[UsageLine]) -> list[str]:
    """A header, one tab-separated line per day, agent and person, and a total."""
    out = ["day\tagent\tperson\tcalls\tinput tokens\toutput tokens\tcost"]
    for r in lines:
        out.append(f"{r.day}\t{visible(r.agent)}\t{visible(r.person)}\t{r.calls}\t{r.input_tokens}\t{r.output_tokens}"
                   f"\t{_cost(r.cost_micros, r.unpriced_calls)}")
    total_in, total_out = sum(r.input_tokens for r in lines), sum(r.output_tokens for r in lines)
    unpriced = sum(r.unpriced_calls for r in lines)
    out.append(f"total\t\t\t{sum(r.calls for r in lines)}\t{total_in}\t{total_out}"
               f"\t{_cost(sum(r.cost_micros for r in lines), unpriced)}")
    return out


def _cost(micros: int, unpriced: int) -> str:
    return f"{micros / 1e6:.4f}" + (f" (+{unpriced} unpriced call{'s' if unpriced != 1 else ''})" if unpriced else "")


async def usage_command(args: argparse.Namespace) -> int:
    from bot.operator import _core

    async with _core() as core:
        since = (SystemClock().now() - timedelta(days=args.days - 1)).date().isoformat()
        lines = await UsageStore(core.credentials.store.db).lines(since=since, agent=args.agent, person=args.person)
        print("\n".join(usage_lines(lines)))
        return 0

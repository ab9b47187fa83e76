"""One summary line per figure, which bench.run_all collects into its table."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp


def summary(figure: str, ours: float, baseline: float, unit: str, target: str) -> None:
    """``ratio`` is ours / baseline; ``target`` says which way is good (e.g. "<= 1.5x")."""
    ratio = ours / baseline if baseline else float("nan")
    print(f"SUMMARY\t{figure}\t{ours:.1f} {unit}\t{baseline:.1f} {unit}\t{ratio:.2f}x\t{target}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def running_bot(home: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`bot run` on the embedded default in ``home``, yielded once /readyz answers 200."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "LLM_", "BOT_", "DATABASE_"))}
    env |= {"PORT": str(port), "BOT_HOME": str(home), "LOG_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot", "run", env=env, cwd=home,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        await wait_ready(port, proc)
        yield proc, port
    finally:
        proc.terminate()
        await proc.wait()


async def wait_ready(port: int, proc: asyncio.subprocess.Process, path: str = "/readyz") -> None:
    """Until ``path`` on the app at ``port`` answers 200 (RuntimeError if the app exits first)."""
    async with asyncio.timeout(60), aiohttp.ClientSession() as http:
        while proc.returncode is None:
            try:
                async with http.get(f"http://127.0.0.1:{port}{path}") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.02)
    raise RuntimeError(f"the app on port {port} exited with {proc.returncode} before it was ready")


def pct(values: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``values``; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

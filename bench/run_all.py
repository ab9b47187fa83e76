"""Run every benchmark (as separate processes, one after another) and print one table.

    python -m bench.run_all                                   # about 5 minutes on 2 cores
    python -m bench.run_all --database-url postgresql://...   # also the intake figures on PostgreSQL,
                                                              # one process and two replicas, and recall

Each figure is measured in the same run as its baseline and given as a ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

RUNS = [
    # Turns complete while mentions arrive (an instant model): the load users create.
    ("intake, 100/s", ["bench.intake_load", "--rate", "100", "--seconds", "10"]),
    # Every turn also adds and removes its :eyes: reaction (SLACK_PROGRESS_DELAY_S=0), as slower turns do.
    ("intake, 100/s, a reaction on every turn", ["bench.intake_load", "--rate", "100", "--seconds", "10",
                                                  "--progress-delay", "0"]),
    # The same load with a catalog of 50 skills and 20 pinned memories in every prompt, against the plain gateway.
    ("intake, 100/s, 50 skills + pinned memories", ["bench.intake_load", "--rate", "100", "--seconds", "10",
                                                   "--context"]),
    ("intake, burst of 200", ["bench.intake_load", "--burst", "200"]),
    ("intake, burst of 500", ["bench.intake_load", "--burst", "500"]),
    # The model takes 0.5 s: every turn outlasts SLACK_PROGRESS_DELAY_S (0.2 s) and shows its reaction, and
    # about 5 run at once (within MAX_CONCURRENT_TURNS).
    ("first visible sign, 10/s", ["bench.intake_load", "--rate", "10", "--seconds", "10", "--signs",
                                  "--model-delay", "0.5"]),
    # Answers streamed into Slack while a model writes 1,000 characters over 2 s: first text, calls per answer.
    ("streamed answers", ["bench.streaming", "--answers", "10"]),
    # A second line: acks while a slow model keeps every turn parked (nothing else writes meanwhile).
    ("ack latency, 100/s, parked model", ["bench.ack_latency", "--rate", "100", "--seconds", "5", "--model-delay",
                                          "10"]),
    # A signed GitHub delivery to its 202 against a Slack mention to its ack, both at 100/s, turns completing.
    ("event intake, 100/s", ["bench.event_intake", "--rate", "100", "--seconds", "10"]),
    ("dispatcher", ["bench.dispatcher", "--sessions", "1000", "--burst", "5"]),
    ("approval latency", ["bench.approval_latency", "--rounds", "20"]),
    ("schedule drift", ["bench.schedule_drift", "--every", "1", "--firings", "8"]),
    ("recovery", ["bench.recovery", "--parked", "1000", "10000", "--rounds", "2"]),
    ("memory", ["bench.memory", "--sessions", "10000"]),
    # recall (issue 36): a word search over one agent's 10,000 memories, p50 / p99 against a read by id.
    ("memory recall", ["bench.memory_recall", "--memories", "10000"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="", help="a PostgreSQL database for the intake figures")
    args = parser.parse_args()
    runs = list(RUNS)
    if args.database_url:
        for replicas in ("1", "2"):
            runs.append((f"intake on PostgreSQL, {replicas} replica(s), 100/s",
                         ["bench.intake_load", "--rate", "100", "--seconds", "10", "--database-url",
                          args.database_url, "--replicas", replicas]))
            runs.append((f"intake on PostgreSQL, {replicas} replica(s), burst of 200",
                         ["bench.intake_load", "--burst", "200", "--database-url", args.database_url,
                          "--replicas", replicas]))
        runs.append(("memory recall on PostgreSQL", ["bench.memory_recall", "--memories", "10000", "--no-sqlite",
                                                     "--database-url", args.database_url]))
    rows: list[list[str]] = []
    started = time.monotonic()
    for label, argv in runs:
        print(f"== {label}: python -m {' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, check=False)
        for line in done.stdout.splitlines():
            if line.startswith("SUMMARY\t"):
                rows.append(line.split("\t")[1:])
            else:
                print("   " + line)
        if done.returncode != 0:
            print(f"   FAILED ({done.returncode}): {done.stderr.strip()[-500:]}")
        print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    headers = ["figure", "gateway", "baseline", "ratio", "target"]
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    print()
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    print(f"\n(total {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()

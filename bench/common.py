"""One summary line per figure, which bench.run_all collects into its table."""

from __future__ import annotations


def summary(figure: str, ours: float, baseline: float, unit: str, target: str) -> None:
    """``ratio`` is ours / baseline; ``target`` says which way is good (e.g. "<= 1.5x")."""
    ratio = ours / baseline if baseline else float("nan")
    print(f"SUMMARY\t{figure}\t{ours:.1f} {unit}\t{baseline:.1f} {unit}\t{ratio:.2f}x\t{target}", flush=True)

#!/usr/bin/env python3
"""Benchmark: how long `sparkstack` takes to start, beside the interpreter's own start.

Runs, alternating, N times each (default 10): `python -c pass`, `sparkstack --help` and `sparkstack strip --help`,
all with this interpreter and the package on its path, and prints each median and its excess over `python -c pass`.
The goals (issue 39): `sparkstack --help` <= 100 ms and `sparkstack strip --help` <= 80 ms. This machine is shared and
noisy: read the side-by-side excess, and run it more than once.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "sparkstack --help": [sys.executable, "-m", "sparkstack.cli", "--help"],
    "sparkstack strip --help": [sys.executable, "-m", "sparkstack.cli", "strip", "--help"],
}
GOALS_MS = {"sparkstack --help": 100, "sparkstack strip --help": 80}


def once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for argv in CASES.values():  # warm the page cache and the bytecode cache
        once(argv)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.runs):
        for name, argv in CASES.items():
            times[name].append(once(argv))
    base = statistics.median(times["python -c pass"])
    print(f"{'case':26} {'median':>9} {'over python':>12}  goal")
    for name, samples in times.items():
        med = statistics.median(samples)
        goal = GOALS_MS.get(name)
        verdict = "" if goal is None else f"<= {goal} ms: {'met' if med * 1000 <= goal else 'NOT met'}"
        print(f"{name:26} {med * 1000:7.1f}ms {(med - base) * 1000:10.1f}ms  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

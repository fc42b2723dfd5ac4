"""Where pytest's time went, for the table .ci/run ends with; the standard library only, so it runs even when the
venv failed.

    python3 checks/slowest.py junit.xml [N]        the N slowest tests of a JUnit XML report
    python3 checks/slowest.py --timeline FILE      each worker's tests, and each xdist group's span, from the lines
                                                   checks/conftest.py writes under SPARKSTACK_TEST_TIMELINE
"""

import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def slowest(path: str, n: int) -> list[tuple[float, str]]:
    cases = ET.parse(path).getroot().iter("testcase")
    timed = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in cases]
    return sorted(timed, reverse=True)[:n]


def timeline(lines: list[str], files: int = 15) -> list[str]:
    """Per worker: its tests, the seconds they took, and when (since the first test began) its first began and its
    last ended; then per xdist group (a node ID's `@group`): its worker and its span. A worker's busy time well
    under its span is time it waited, or time the other worker's group held it to. Last, the `files` test files
    that took longest, over both workers."""
    rows = []
    for line in lines:
        worker, began, ended, nodeid = line.rstrip("\n").split("\t", 3)
        rows.append((worker, float(began), float(ended), nodeid))
    if not rows:
        return []
    zero = min(r[1] for r in rows)
    out = [f"{'worker':>8}  {'tests':>5}  {'busy s':>7}  {'from s':>6}  {'to s':>6}"]
    by_worker = defaultdict(list)
    groups = defaultdict(list)
    for r in rows:
        by_worker[r[0]].append(r)
        group = re.search(r"@([\w.-]+)$", r[3])  # xdist's suffix; a parameter's own "@" (user@host]) is not one
        if group:
            groups[(group.group(1), r[0])].append(r)
    for worker, rs in sorted(by_worker.items()):
        busy = sum(e - b for _, b, e, _ in rs)
        out.append(f"{worker:>8}  {len(rs):5d}  {busy:7.0f}  {min(b for _, b, _, _ in rs) - zero:6.0f}  "
                   f"{max(e for _, _, e, _ in rs) - zero:6.0f}")
    for (group, worker), rs in sorted(groups.items(), key=lambda kv: min(r[1] for r in kv[1])):
        busy = sum(e - b for _, b, e, _ in rs)
        out.append(f"{'@' + group:>8}  {len(rs):5d}  {busy:7.0f}  {min(b for _, b, _, _ in rs) - zero:6.0f}  "
                   f"{max(e for _, _, e, _ in rs) - zero:6.0f}  on {worker}")
    by_file = defaultdict(float)
    for _, b, e, nodeid in rows:
        by_file[nodeid.split("::", 1)[0]] += e - b
    out.append("files with the most busy seconds:")
    out += [f"{seconds:8.0f}  {name}" for name, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:files]]
    return out


if __name__ == "__main__":
    if sys.argv[1] == "--timeline":
        with open(sys.argv[2]) as f:
            print("\n".join(timeline(f.readlines())))
    else:
        for seconds, name in slowest(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15):
            print(f"{seconds:8.1f}  {name}")

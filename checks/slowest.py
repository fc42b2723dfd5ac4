"""Print the slowest tests of a pytest JUnit XML report: `python3 checks/slowest.py junit.xml [N]`.

.ci/run ends its table with these; the standard library only, so it runs even when the venv failed."""

import sys
import xml.etree.ElementTree as ET


def slowest(path: str, n: int) -> list[tuple[float, str]]:
    cases = ET.parse(path).getroot().iter("testcase")
    timed = [(float(c.get("time", 0)), f"{c.get('classname', '')}::{c.get('name', '')}") for c in cases]
    return sorted(timed, reverse=True)[:n]


if __name__ == "__main__":
    for seconds, name in slowest(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 15):
        print(f"{seconds:8.1f}  {name}")

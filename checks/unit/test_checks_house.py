"""checks/ as a house (issue 40): support modules are a floor below the tests, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_support_module_imports_a_test_module():
    """A support module (lab.py, realpair.py, the stand-ins, conftest.py...) that imports a test module makes that
    test part of what everything else stands on (realpair.py once imported test_runbook)."""
    offenders = {}
    for path in sorted(CHECKS.rglob("*.py")):
        if path.name.startswith("test_"):
            continue
        tests = sorted(m for m in imported_modules(path) if m.startswith("test_"))
        if tests:
            offenders[str(path.relative_to(CHECKS))] = tests
    assert offenders == {}


def test_the_rule_sees_an_import_of_a_test_module(tmp_path):
    """The scan itself: both import forms, inside a function too (where realpair.py's was)."""
    probe = tmp_path / "support.py"
    probe.write_text("def f():\n    from test_runbook import world\n    import test_boot_lab\n")
    assert {"test_runbook", "test_boot_lab"} <= imported_modules(probe)

"""checks/ as a house (issue 40): support modules are a floor below the tests, never the other way round."""

from __future__ import annotations

import ast
import re
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


def fixtures() -> dict[str, list[str]]:
    """Every pytest fixture under checks/, by name -> the files that define one by that name."""
    found: dict[str, list[str]] = {}
    for path in sorted(CHECKS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    "fixture" in ast.unparse(d) for d in node.decorator_list):
                found.setdefault(node.name, []).append(str(path.relative_to(CHECKS)))
    return found


def test_no_fixture_is_just_world_and_the_shared_worlds_are_defined_once():
    """A world is named for what it holds (README's table); the shared ones live in conftest.py alone."""
    found = fixtures()
    assert "world" not in found, found.get("world")
    for shared in ("hub_world", "image_world", "run_cli"):
        assert found.get(shared) == ["conftest.py"], (shared, found.get(shared))


def test_the_fixtures_checks_readme_names_exist():
    readme = (CHECKS / "README.md").read_text()
    table = readme.split("## Fixtures and helpers", 1)[1]
    named = {n for line in table.splitlines() if line.startswith("| `") for n in
             re.findall(r"`(\w+)`", line.split("|")[1])}
    assert named and named <= set(fixtures()), sorted(named - set(fixtures()))

"""nix/nixpkgs-versions.toml (the versions nixpkgs gives, and where each was read) against python/pyproject.toml.

Every requirement pyproject declares (runtime and the test extra) is recorded, of the same kind, and its
specifier admits every version recorded for it: nixpkgs' own (`version`), the others read (`also_read`)
and what the stub installs instead where PyPI cannot give nixpkgs' here (`stub`, with `stub_why`). A
constraint nixpkgs' version does not meet fails here; nix/stub fails the build on it too (test_stub_fails).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> dict[str, tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "python/pyproject.toml").read_text())["project"]
    found = {}
    for kind, reqs in (("runtime", project["dependencies"]), ("test", project["optional-dependencies"]["test"])):
        for text in reqs:
            req = Requirement(text)
            found[norm(req.name)] = (kind, req)
    return found


def recorded() -> dict:
    return tomllib.loads((ROOT / "nix/nixpkgs-versions.toml").read_text())["packages"]


def versions_of(entry: dict) -> list[str]:
    return [entry["version"], *entry.get("also_read", []), *([entry["stub"]] if "stub" in entry else [])]


def test_every_requirement_is_recorded_and_nothing_else():
    assert set(recorded()) == set(requirements())


@pytest.mark.parametrize("name", sorted(requirements()))
def test_pyproject_admits_every_version_recorded(name):
    kind, req = requirements()[name]
    entry = recorded()[name]
    assert entry["kind"] == kind, f"{name}: recorded as {entry['kind']}, declared as {kind}"
    assert entry["path"].startswith("pkgs/") and entry["read"], entry
    assert ("stub" in entry) == ("stub_why" in entry), f"{name}: a stub version says why, and only then"
    refused = [v for v in versions_of(entry) if not req.specifier.contains(v, prereleases=True)]
    assert refused == [], f"pyproject's {req} does not admit {', '.join(refused)} (nix/nixpkgs-versions.toml)"


"""nix/stub fails where nixpkgs would: `nix build .#default` of a throwaway clone, each with one change.

- a pyproject constraint that the recorded nixpkgs version does not meet (main's `huggingface_hub>=2.4,<3`
  before this check existed, against nixpkgs' 1.28.0) fails in one line from the stub's stand-in for
  pythonRuntimeDepsCheckHook, naming the package, the requirement and the version;
- an import of a module no dependency provides, at the top of a module a command imports, fails the
  build's pythonImportsCheck;
- writing outside sourceRoot fails: that tree is read-only, as after nixpkgs' unpackPhase.
And the clone as it is builds, so each failure is the change's.

The venv the stub stands on (nix/stub/make-venv) holds the versions nix/nixpkgs-versions.toml records; the
version expected in the line is read from that venv and from the record, never typed here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib

import pytest

from nixrun import ROOT, STUB_VENV, required, run, working_tree_clone


@pytest.fixture
def clone(tmp_path):
    required("nix", shutil.which("nix") is not None, "apt-get install nix-bin")
    required("the stub's host venv", (STUB_VENV / "bin/python3").exists(), "run nix/stub/make-venv")
    return working_tree_clone(tmp_path / "clone")


def build(clone, check):
    env = {**os.environ, "NIX_CONFIG": "experimental-features = nix-command flakes"}
    argv = ["nix", "build", "--offline", "--override-input", "nixpkgs", f"path:{clone}/nix/stub",
            "-L", "--no-link", ".#default"]
    return run(argv, cwd=clone, env=env, check=check)


def edit(clone, rel, old, new):
    path = clone / rel
    text = path.read_text()
    assert text.count(old) == 1, f"{rel}: {old!r} not found once"
    path.write_text(text.replace(old, new))
    run(["git", "add", rel], cwd=clone)


def installed(name):
    return subprocess.run([STUB_VENV / "bin/python3", "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_the_clone_as_it_is_builds(clone):
    build(clone, check=0)


def test_a_constraint_nixpkgs_does_not_meet_fails_in_one_line(clone):
    record = tomllib.loads((ROOT / "nix/nixpkgs-versions.toml").read_text())["packages"]["huggingface-hub"]
    version = installed("huggingface_hub")
    assert version == record.get("stub", record["version"])  # the stub stands on nixpkgs' version
    project = tomllib.loads((clone / "python/pyproject.toml").read_text())["project"]
    current = next(r for r in project["dependencies"] if r.startswith("huggingface_hub"))
    edit(clone, "python/pyproject.toml", f'"{current}"', '"huggingface_hub>=2.4,<3"')
    proc = build(clone, check=1)
    said = [re.sub(r"^\S+> ", "", l) for l in proc.stderr.splitlines() if "runtime dependency" in l]
    assert said == [f"nix/stub: {project['name']} {project['version']}: runtime dependency huggingface-hub<3,>=2.4 not satisfied by "
                    f"version {version} (nixpkgs' pythonRuntimeDepsCheckHook fails here too)"], proc.stderr


def test_an_import_no_dependency_provides_fails_the_imports_check(clone):
    # fetch/plan.py is imported by `sparkstack fetch`; no recorded package provides this module.
    edit(clone, "python/sparkstack/fetch/plan.py", "from __future__ import annotations\n",
         "from __future__ import annotations\n\nimport sparkstack_undeclared_module  # noqa: F401\n")
    proc = build(clone, check=1)
    assert "ModuleNotFoundError: No module named 'sparkstack_undeclared_module'" in proc.stderr, proc.stderr


def test_the_tree_outside_source_root_is_read_only(clone):
    edit(clone, "nix/package.nix", "  doCheck = false;\n",
         '  doCheck = false;\n  preBuild = "touch inside-is-writable && touch ../outside";\n')
    proc = build(clone, check=1)
    assert re.search(r"touch: cannot touch '\.\./outside': Permission denied", proc.stderr), proc.stderr
    assert "inside-is-writable" not in proc.stderr

"""The flake's files agree with the rest of the checkout; no Nix build needed (nix-instantiate only parses).

- nix/package.nix names exactly pyproject.toml's dependencies, test extra and version, and its
  pythonImportsCheck names every sparkstack module cli.py imports (what a user's command imports);
- flake.nix's overlay input is the repo and full rev overlays/dflash2/overlay.toml pins;
- flake.lock holds nixpkgs' real entry (NIX.md) and no overlay entry (its narHash cannot be known here);
- nix/fixture-pins.json is what the fixture generator gives now;
- every .nix file parses; the stub and docs/nix.md (the flake's page, moved out of the README) say the stub
  proves the wiring, not nixpkgs' build;
- `pin fetch --no-digest-check` (what the flake's fixed-output derivations run) leaves the sha256 to its
  caller but still checks sizes, while the default refuses a corrupt blob.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import fixtures  # noqa: E402
from registry_standin import Standin, fixture_repo  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NIXPKGS_LOCK = {  # NIX.md: a real nixos-unstable entry from a public flake.lock
    "locked": {"lastModified": 1787070829, "narHash": "sha256-vXNVDVtvfiQuXthP0NHPFdNvvMTkGpx0UP8oddIWbNk=",
               "owner": "NixOS", "repo": "nixpkgs", "rev": "0ae2bc1419c3f345984c2629e72e7a631820fa4d", "type": "github"},
    "original": {"owner": "NixOS", "ref": "nixos-unstable", "repo": "nixpkgs", "type": "github"},
}


def norm(name: str) -> str:
    """A requirement's project name, PEP 503-normalised (nixpkgs attribute names use dashes too)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", name).group(0)).lower()


def nix_list(text: str, key: str) -> list[str]:
    """The names in `key = with python3Packages; [ ... ];` (or a let-bound list) of a .nix file."""
    m = re.search(rf"\b{re.escape(key)} = with python3Packages; \[([^\]]*)\];", text)
    assert m, f"{key} list not found"
    return m.group(1).split()


def test_package_nix_names_exactly_the_pyproject_dependencies():
    project = tomllib.loads((ROOT / "python/pyproject.toml").read_text())["project"]
    text = (ROOT / "nix/package.nix").read_text()
    assert sorted(nix_list(text, "dependencies")) == sorted(norm(r) for r in project["dependencies"])
    assert sorted(nix_list(text, "test")) == sorted(norm(r) for r in project["optional-dependencies"]["test"])
    assert re.search(rf'version = "{re.escape(project["version"])}";', text)
    assert 'mainProgram = "sparkstack";' in text and "pyproject = true;" in text


def command_modules() -> set[str]:
    """sparkstack.cli, the command objects it imports (or names, lazily) (each area's command.py), and every sparkstack module those
    import, at any depth of their code (each command imports its own area's modules)."""
    import ast

    py = ROOT / "python"

    def is_module(dotted: str) -> bool:
        p = py / dotted.replace(".", "/")
        return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()

    def source(dotted: str) -> Path:
        p = py / dotted.replace(".", "/")
        return p.with_suffix(".py") if p.with_suffix(".py").is_file() else p / "__init__.py"

    mods, todo = {"sparkstack.cli"}, ["sparkstack.cli"]
    while todo:
        found = set()
        for n in ast.walk(ast.parse(source(todo.pop()).read_text())):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").split(".")[0] == "sparkstack":
                found.add(n.module)
                found.update(f"{n.module}.{a.name}" for a in n.names if is_module(f"{n.module}.{a.name}"))
            elif isinstance(n, ast.Import):
                found.update(a.name for a in n.names if a.name.split(".")[0] == "sparkstack")
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"sparkstack(\.\w+)+:\w+", n.value):
                # cli's lazy commands, named as "module:NAME"; importing one runs its package's __init__ first
                parts = n.value.partition(":")[0].split(".")
                found.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
        todo += [m for m in found - mods if m.endswith(".command")]  # a command object's own imports count too
        mods |= found
    return mods


def test_package_nix_imports_every_module_a_command_imports():
    text = (ROOT / "nix/package.nix").read_text()
    m = re.search(r"\bpythonImportsCheck = \[([^\]]*)\];", text)
    assert m, "pythonImportsCheck not found"
    listed = re.findall(r'"([^"]+)"', m.group(1))
    assert len(listed) == len(set(listed))
    mods = command_modules()
    assert {"sparkstack.cli", "sparkstack.fetch", "sparkstack.launch.apply"} <= mods  # the walk finds them
    assert set(listed) == mods, (f"add {sorted(mods - set(listed))}, drop {sorted(set(listed) - mods)}")

# nixpkgs' lib/fetchers.nix proxyImpureEnvVars (read from NixOS/nixpkgs, lib/fetchers.nix).
NIXPKGS_PROXY_VARS = ["http_proxy", "https_proxy", "ftp_proxy", "all_proxy", "no_proxy",
                      "HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "ALL_PROXY", "NO_PROXY", "NIX_SSL_CERT_FILE"]


def test_blob_fetches_pass_every_variable_nixpkgs_fetchers_pass():
    text = (ROOT / "nix/base.nix").read_text()
    m = re.search(r"\bimpureEnvVars = \[([^\]]*)\];", text)
    assert m, "impureEnvVars not found"
    listed = re.findall(r'"([^"]+)"', m.group(1))
    assert listed[:len(NIXPKGS_PROXY_VARS)] == NIXPKGS_PROXY_VARS
    assert set(listed) - set(NIXPKGS_PROXY_VARS) == {"SPARKSTACK_REGISTRY_MIRROR", "SPARKSTACK_REGISTRY_TIMEOUT"}

def test_the_overlay_is_the_blogs_bundle_by_its_pinned_hash_and_no_input():
    """Nix locks every input at evaluation: a GitHub input would need GitHub for every build. The image's overlay
    is the bundle overlay.toml pins, a requireFile path the user adds (or, --impure, SPARKSTACK_OVERLAY_SRC)."""
    source = tomllib.loads((ROOT / "overlays/dflash2/overlay.toml").read_text())["source"]
    assert source["bundle_sha256"] == "2d5931db561d58c22bb8dca60a1a45e41905e1e4d11d7cafd44cd950ef41eb94"  # the blog's
    flake = (ROOT / "flake.nix").read_text()
    inputs = flake[flake.index("inputs = {"):flake.index("outputs =")]
    assert re.findall(r"^\s*([\w-]+)\.url = ", inputs, re.M) == ["nixpkgs"] and "overlay-src = {" not in inputs
    bundle = (ROOT / "nix/bundle.nix").read_text()
    assert "pkgs.requireFile" in bundle and "source.bundle_sha256" in bundle and "nix-store --add-fixed sha256" in bundle
    assert 'builtins.getEnv "SPARKSTACK_OVERLAY_SRC"' in flake  # the env var the CLI reads for --overlay-src


def test_flake_lock_holds_the_real_nixpkgs_and_no_made_up_hash():
    lock = json.loads((ROOT / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert set(lock["nodes"]) == {"root", "nixpkgs"}, "nixpkgs is the flake's one input"
    assert lock["nodes"]["nixpkgs"] == NIXPKGS_LOCK
    assert lock["nodes"]["root"] == {"inputs": {"nixpkgs": "nixpkgs"}}


def test_fixture_pins_are_what_the_generator_gives(tmp_path):
    fixtures.write_image(tmp_path / "fx")
    got = fixtures.pins_of(tmp_path / "fx" / "base")
    want = json.loads((ROOT / "nix/fixture-pins.json").read_text())
    assert got == want, ("nix/fixture-pins.json is stale: python checks/nix/fixtures.py image DIR && "
                         "python checks/nix/fixtures.py pins DIR/base > nix/fixture-pins.json")


def test_every_nix_file_parses():
    tool = shutil.which("nix-instantiate")
    if tool is None:
        if os.environ.get("SPARKSTACK_REQUIRE_TOOLS"):
            pytest.fail("nix-instantiate is required here (SPARKSTACK_REQUIRE_TOOLS is set): apt-get install nix-bin")
        pytest.skip("nix-instantiate not installed")
    files = sorted(p for p in ROOT.rglob("*.nix") if ".git" not in p.parts)
    assert {p.relative_to(ROOT).as_posix() for p in files} >= {
        "flake.nix", "nix/package.nix", "nix/base.nix", "nix/image.nix", "nix/apps.nix", "nix/checks.nix",
        "nix/stub/flake.nix", "nix/stub/default.nix"}
    for p in files:
        proc = subprocess.run([tool, "--parse", str(p)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{p}: {proc.stderr}"


def test_the_stub_and_readme_say_it_proves_wiring_not_nixpkgs_build():
    lines = (ROOT / "nix/stub/flake.nix").read_text().splitlines()
    first = " ".join(l for l in lines[:next(i for i, l in enumerate(lines) if not l.startswith("#"))]).lower()
    assert "stand-in" in first and "wiring" in first and "not prove" in first and "nixpkgs' own build" in first
    readme = (ROOT / "docs/nix.md").read_text().lower()  # the README's Nix section lives there now
    assert "proves the wiring, not nixpkgs' own build" in readme


def test_pin_fetch_leaves_the_digest_to_nix_but_not_the_size(tmp_path, run_cli):
    repos, served = fixture_repo(tmp_path / "fixture")
    arm = served.platforms["linux/arm64"]
    with Standin(repos) as standin:
        env = {"SPARKSTACK_REGISTRY_MIRROR": standin.url}
        pins = tmp_path / "pins.json"
        run_cli("pin", "base", f"ghcr.io/{served.repo}:{served.tag}", "--pins", pins, env=env, check=0)
        layer = arm["layers"][0]
        size = (served.layouts["linux/arm64"] / "blobs/sha256" / layer.split(":")[1]).stat().st_size
        standin.faults.add("corrupt-blob")
        refused = run_cli("pin", "fetch", layer, "--pins", pins, "--out", tmp_path / "a", env=env, check=1)
        assert "refusing them" in refused.stderr and not (tmp_path / "a").exists()
        run_cli("pin", "fetch", layer, "--pins", pins, "--out", tmp_path / "b", "--no-digest-check", env=env, check=0)
        assert (tmp_path / "b").stat().st_size == size  # the bytes served, for Nix to judge
        import hashlib
        assert "sha256:" + hashlib.sha256((tmp_path / "b").read_bytes()).hexdigest() != layer
        # A wrong size is still refused here, flag or not.
        doc = json.loads(pins.read_text())
        doc["platforms"]["linux/arm64"]["layers"][0]["size"] = size - 1
        pins.write_text(json.dumps(doc))
        short = run_cli("pin", "fetch", layer, "--pins", pins, "--out", tmp_path / "c", "--no-digest-check",
                        env=env, check=1)
        assert "pinned size" in short.stderr and not (tmp_path / "c").exists()

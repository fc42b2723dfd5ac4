"""The flake, really built and run offline, end to end, in a throwaway clone of this checkout.

nixpkgs is nix/stub (a host-tools stand-in: it proves the wiring, not nixpkgs' own build); the overlay is a
fixture bundle of a fixture checkout, pinned in the clone's overlay.toml under its own (test) hash and added to
the store as a user adds the blog's (requireFile); the registry is checks/registry_standin.py on 127.0.0.1,
reached through SPARKSTACK_REGISTRY_MIRROR, which the flake's fixed-output derivations take as an impure variable.

In the clone: the committed, unresolved pins make `nix build .#image` fail at build time in one line
(while `nix flake show` still evaluates); then `sparkstack pin base` and `pin overlay` pin the fixture,
`git add` stages them, and the real `nix build .#image` and `nix run .#launch -- 0 --dry-run --json` run.
Checked: without the bundle in the store the build says how to add it; the image passes `image verify`; its
manifest digest equals a direct `sparkstack image build` of the same base from the bundle's directory (and
differs with stdenv's SOURCE_DATE_EPOCH, which the flake overrides), and so does `--impure` with
SPARKSTACK_OVERLAY_SRC naming that directory;
its base blobs are symlinks to one store path per blob; docker_run names its tag; a second build asks
the registry nothing; lib.mkImage through builtins.getFlake gives the very same derivation; and a new
base tag refetches only what changed, where a corrupt layer fails with Nix's hash-mismatch line; and
image-instanttensor builds once its (fixture) wheels are pinned and added to the store.

Needs nix (nix-bin) and the stub's host venv (nix/stub/make-venv); with SPARKSTACK_REQUIRE_TOOLS set,
a missing one fails instead of skipping.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tomllib
from pathlib import Path

import pytest

import imagefix as fx
from clirun import assert_planned, sparkstack_cmd
from nixrun import STUB_VENV, TIMEOUT, required, run, working_tree_clone
from registry_standin import OCI_INDEX, OCI_MANIFEST, Repo, Standin

ROOT = Path(__file__).resolve().parents[2]
REPO, TAG, NEW_TAG = "tonyd2wild/vllm-glm53-flash", "sm121-v8", "sm121-v9"
REF = f"ghcr.io/{REPO}:{TAG}"
# The files the shipped overlay's registry_and_select step declares it touches, beyond the fixture base's.
EXTRA_VLLM_FILES = ["model_executor/models/qwen3_dflash.py", "v1/worker/gpu/spec_decode/speculator.py",
                    "config/vllm.py", "model_executor/layers/logits_processor.py"]


def base_layers(filler_bytes: int) -> list:
    """The fixture base's layers (checks/imagefix.py) plus one holding every file the shipped overlay touches."""
    entries = []
    for rel in EXTRA_VLLM_FILES:
        path = f"{fx.VLLM}/{rel}"
        entries += [d for d in fx._dirs(path) if d not in entries]
        entries.append((path, "file", f"# {rel}, as the base ships it\n"))
    return fx.default_layers(filler_bytes=filler_bytes) + [("gzip", entries)]


def add_image(repo: Repo, tmp: Path, tag: str, filler_bytes: int) -> dict:
    """One multi-arch index (arm64 + amd64) under `tag`; returns the arm64 layout and digests."""
    entries, arm = [], None
    layers = base_layers(filler_bytes)
    for arch in ("arm64", "amd64"):
        layout = tmp / f"{tag}-{arch}"
        facts = fx.write_base(layout, layers=layers, arch=arch)
        repo.add_layout(layout)
        size = fx.blob_path(layout, facts["manifest"]).stat().st_size
        entries.append({"mediaType": OCI_MANIFEST, "digest": facts["manifest"], "size": size,
                        "platform": {"os": "linux", "architecture": arch, **({"variant": "v8"} if arch == "arm64" else {})}})
        if arch == "arm64":
            arm = {"layout": layout, **facts}
    repo.add_manifest(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode(),
                      OCI_INDEX, tag)
    return arm


@pytest.fixture(scope="module")
def flake_world(tmp_path_factory):
    required("nix", shutil.which("nix") is not None, "apt-get install nix-bin")
    required("the stub's host venv", (STUB_VENV / "bin/python3").exists(), "run nix/stub/make-venv")
    tmp = tmp_path_factory.mktemp("flake-e2e")
    clone = working_tree_clone(tmp / "clone")
    src = fx.write_overlay_source(tmp / "overlay-src")
    repo = Repo()
    arm = add_image(repo, tmp / "served", TAG, filler_bytes=256 << 10)
    with Standin({REPO: repo}) as standin:
        env = {k: v for k, v in os.environ.items() if k not in ("IMAGE", "SOURCE_DATE_EPOCH")}
        env.update(NIX_CONFIG="experimental-features = nix-command flakes", SPARKSTACK_REGISTRY_MIRROR=standin.url,
                   SPARKSTACK_CACHE_DIR=str(tmp / "cache"))
        overrides = ["--offline", "--override-input", "nixpkgs", f"path:{clone}/nix/stub"]
        yield {"tmp": tmp, "clone": clone, "src": src, "repo": repo, "arm": arm, "standin": standin, "env": env,
               "O": overrides}


def cli(w, *args, check=0, env=None):
    return run([*sparkstack_cmd(), *args], cwd=w["clone"], env={**w["env"], **(env or {})}, check=check)


def nix(w, *args, check=0):
    return run(["nix", *args], cwd=w["clone"], env=w["env"], check=check)


def nix_build(w, attr, check=0):
    proc = nix(w, "build", *w["O"], "--no-link", "--json", f".#{attr}", check=check)
    return json.loads(proc.stdout)[0]["outputs"]["out"] if check == 0 else proc


def blob_requests(standin, since: int = 0) -> list[str]:
    """Digests asked for from the blob host ("CDN") and the registry's manifests endpoint, in order."""
    return [m.group(1) for r in standin.log[since:]
            if (m := re.search(r"/(?:blobs?|manifests)/(?:[^/]+/)*(sha256:[0-9a-f]{64})", r["path"]))]


def test_flake_end_to_end(flake_world):
    w = flake_world
    # 0. The overlay is the blog's bundle, by overlay.toml's hash: not in the store, its build says how to add it.
    absent = nix_build(w, "overlay-bundle", check=1)
    assert "nix-store --add-fixed sha256 glm5.3-flash-spark-bundle" in absent.stderr, absent.stderr
    assert "2d5931db561d58c22bb8dca60a1a45e41905e1e4d11d7cafd44cd950ef41eb94" in absent.stderr  # the blog's hash
    # A test bundle of the fixture source stands in for it: its own hash pinned in the clone, added by that name.
    bundle = fx.make_bundle(w["src"], w["tmp"] / "glm5.3-flash-spark-bundle")
    toml = w["clone"] / "overlays/dflash2/overlay.toml"
    blog = 'bundle_sha256 = "2d5931db561d58c22bb8dca60a1a45e41905e1e4d11d7cafd44cd950ef41eb94"'
    assert blog in toml.read_text()
    toml.write_text(toml.read_text().replace(blog, f'bundle_sha256 = "{hashlib.sha256(bundle.read_bytes()).hexdigest()}"'))
    run(["nix-store", "--add-fixed", "sha256", bundle], cwd=w["clone"], env=w["env"])
    run(["git", "add", "overlays/dflash2/overlay.toml"], cwd=w["clone"])
    assert Path(nix_build(w, "overlay-bundle")).read_bytes() == bundle.read_bytes()

    # 1. Committed, unresolved pins: evaluation works, the build fails inside a derivation, in one line.
    nix(w, "flake", "show", *w["O"])
    proc = nix_build(w, "image", check=1)
    said = [l.strip().lstrip("> ") for l in proc.stderr.splitlines() if "sparkstack: error:" in l]
    assert len(said) == 1 and "nix run .#pin -- base " + REF in said[0], proc.stderr

    # 2. Pin the base through the stand-in and the overlay from the fixture source; stage both.
    cli(w, "pin", "base")
    cli(w, "pin", "overlay", "--overlay-src", w["src"])
    run(["git", "add", "nix/pins.json", "overlays/dflash2/overlay.toml"], cwd=w["clone"])
    pins = json.loads((w["clone"] / "nix/pins.json").read_text())["platforms"]["linux/arm64"]
    assert pins["manifest"]["digest"] == w["arm"]["manifest"]

    # 3. The real build: one fixed-output path per blob, then `image build --link-base symlink` over them.
    image = Path(nix_build(w, "image"))
    cli(w, "image", "verify", image)
    index = json.loads((image / "index.json").read_text())
    manifest = json.loads((image / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text())
    for layer in manifest["layers"][:-1]:  # every base layer: a symlink to its own store path
        hexd = layer["digest"].split(":")[1]
        target = os.readlink(image / "blobs/sha256" / hexd)
        assert re.fullmatch(rf"/nix/store/[0-9a-z]{{32}}-oci-blob-{hexd}", target), target

    # 4. Bit for bit what the CLI builds from the same base and overlay with its defaults.
    direct = json.loads(cli(w, "image", "build", "--base", w["arm"]["layout"], "--overlay",
                            w["clone"] / "overlays/dflash2", "--overlay-src", w["src"], "--out",
                            w["tmp"] / "cli-image", "--json").stdout)["result"]
    assert index["manifests"][0]["digest"] == direct["manifest_digest"]
    assert manifest["config"]["digest"] == direct["config_digest"]
    # ... which holds only because the flake pins the timestamp: stdenv's would give another image.
    stdenv_epoch = json.loads(cli(w, "image", "build", "--base", w["arm"]["layout"], "--overlay",
                                  w["clone"] / "overlays/dflash2", "--overlay-src", w["src"], "--out",
                                  w["tmp"] / "cli-image-1980", "--json",
                                  env={"SOURCE_DATE_EPOCH": "315532800"}).stdout)["result"]
    assert stdenv_epoch["manifest_digest"] != direct["manifest_digest"]
    # ... and from an upstream checkout instead of the bundle (--impure, SPARKSTACK_OVERLAY_SRC): the same image.
    checkout = json.loads(run(["nix", "build", *w["O"], "--impure", "--no-link", "--json", ".#image"], cwd=w["clone"],
                              env={**w["env"], "SPARKSTACK_OVERLAY_SRC": str(w["src"])}).stdout)[0]["outputs"]["out"]
    assert checkout != str(image)  # another derivation (its overlay input differs) ...
    assert json.loads((Path(checkout) / "index.json").read_text())["manifests"][0]["digest"] == direct["manifest_digest"]

    # 5. `nix run .#launch` runs that very image: its store path as --image, its tag in docker_run.
    proc = nix(w, "run", *w["O"], ".#launch", "--", "0", "--dry-run", "--json", check=None)
    assert_planned(proc)  # its preflight may fail off a Spark (exit 1); the plan is what this step reads
    plan = json.loads(proc.stdout)
    assert plan["image"] == direct["name"] and plan["image_config_digest"] == direct["config_digest"]
    assert plan["image_source"] == "flag" and plan["would_load"]["from"] == str(image)
    assert plan["docker_run"][:2] == ["docker", "run"] and direct["name"] in plan["docker_run"]
    # ... and so does `nix run .#up`: its build stage is that image, up to date, and ship would send it.
    proc = nix(w, "run", *w["O"], ".#up", "--", "--until", "build", "--dry-run", "--json", check=None)
    assert_planned(proc)
    up = json.loads(proc.stdout)
    (build,) = [s for s in up["stages"] if s["stage"] == "build"]
    assert build["state"] == "up to date" and build["outputs"]["image"] == str(image)
    assert build["outputs"]["config"] == direct["config_digest"]
    assert "--image " + str(image) in next(s for s in up["stages"] if s["stage"] == "ship")["rerun"]

    # 6. A second build asks the registry nothing: every blob is already a valid store path.
    before = len(w["standin"].log)
    assert nix_build(w, "image") == str(image)
    assert w["standin"].log[before:] == []

    # 7. lib.mkImage called from outside through builtins.getFlake (which reads the committed tree) with
    #    lib.overlayBundle is the same derivation as packages.image.
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "e2e: pins and the test bundle's hash"],
        cwd=w["clone"])
    expr = (f'let f = builtins.getFlake "{w["clone"]}"; s = builtins.getFlake "path:{w["clone"]}/nix/stub"; '
            f'pkgs = s.legacyPackages.x86_64-linux; in f.lib.mkImage {{ inherit pkgs; '
            f'base = f.lib.mkBase {{ inherit pkgs; pins = {w["clone"]}/nix/pins.json; }}; '
            f'overlaySrc = f.lib.overlayBundle {{ inherit pkgs; }}; }}')
    via_lib = json.loads(nix(w, "build", "--offline", "--impure", "--no-link", "--json", "--expr", expr).stdout)
    assert via_lib[0]["outputs"]["out"] == str(image)

    # 8. packages.image-instanttensor: its wheels are overlay.toml's, pinned by `pin overlay --wheels`
    #    and added to the store by hand (requireFile paths: overlay.toml pins no URL).
    wheels = w["tmp"] / "wheels"
    wheels.mkdir()
    toml = tomllib.loads((w["clone"] / "overlays/dflash2/overlay.toml").read_text())
    for wheel in toml["variants"]["instanttensor"]["wheels"]:
        dist, version = wheel["file"].split("-")[:2]
        # A nonce: `nix-store --add-fixed` outlives the test, and this run must start without them in the store.
        made = fx.make_wheel(wheels, dist, version, {f"{dist}/__init__.py": f"VERSION = {version!r}\n"
                                                     f"NONCE = {secrets.token_hex(8)!r}\n"})
        (wheels / made).rename(wheels / wheel["file"])
    cli(w, "pin", "overlay", "--overlay-src", w["src"], "--wheels", wheels)
    run(["git", "add", "overlays/dflash2/overlay.toml"], cwd=w["clone"])
    unadded = nix_build(w, "image-instanttensor", check=1)
    assert "nix-store --add-fixed sha256" in unadded.stderr, unadded.stderr
    run(["nix-store", "--add-fixed", "sha256", *sorted(wheels.iterdir())], cwd=w["clone"], env=w["env"])
    variant = Path(nix_build(w, "image-instanttensor"))
    cli(w, "image", "verify", variant)
    tag = json.loads((variant / "index.json").read_text())["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
    assert tag.startswith("instanttensor-"), tag

    # 9. A new base tag refetches only what changed (its manifest, config and the one new layer), and
    #    a registry serving corrupt blobs fails the build with Nix's own hash-mismatch line.
    new = add_image(w["repo"], w["tmp"] / "served", NEW_TAG, filler_bytes=128 << 10)
    cli(w, "pin", "base", f"ghcr.io/{REPO}:{NEW_TAG}")
    run(["git", "add", "nix/pins.json"], cwd=w["clone"])
    changed = {new["manifest"], new["config"]} | (set(new["layers"]) - set(w["arm"]["layers"]))
    assert len(changed) == 3
    w["standin"].faults.add("corrupt-blob")
    before = len(w["standin"].log)
    proc = nix_build(w, "base", check=1)
    w["standin"].faults.discard("corrupt-blob")
    mismatch = [l for l in proc.stderr.splitlines() if "hash mismatch in fixed-output derivation" in l]
    assert mismatch, proc.stderr
    assert any(f"oci-blob-{d.split(':')[1]}.drv" in l for l in mismatch for d in changed - {new["manifest"]}), mismatch
    asked = set(blob_requests(w["standin"], before))
    assert asked and asked <= changed, f"refetched unchanged blobs: {asked - changed}"
    # With the registry healthy again the new base builds, and reuses every unchanged layer's store path.
    base = Path(nix_build(w, "base"))
    for d in set(new["layers"]) & set(w["arm"]["layers"]):
        hexd = d.split(":")[1]
        assert os.readlink(base / "blobs/sha256" / hexd) == os.readlink(image / "blobs/sha256" / hexd)


def test_apps_wire_exactly_the_commands_that_exist(flake_world):
    """An app per top-level command but patch (it has none), and none for a command that does not exist."""
    import click

    from sparkstack.cli import main

    commands = set(main.list_commands(click.Context(main)))
    assert "patch" in commands
    for system in ("x86_64-linux", "aarch64-linux"):
        apps = set(json.loads(nix(flake_world, "eval", *flake_world["O"], "--json", f".#apps.{system}",
                                  "--apply", "builtins.attrNames").stdout))
        assert {"strip", "pin", "plan", "image", "launch"} <= apps
        assert commands - {"patch"} <= apps, f"wire apps for {commands - {'patch'} - apps} in nix/apps.nix"
        assert apps <= commands - {"patch"}, f"apps for no command (or for patch): {apps - (commands - {'patch'})}"

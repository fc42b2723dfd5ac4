#!/usr/bin/env python3
"""Byte-for-byte parity of the CLI's outputs between two trees (a dev tool, not a pytest test).

    python checks/tools/outputs_parity.py capture TREE OUTDIR [--python PY]
    python checks/tools/outputs_parity.py diff OUTDIR_A OUTDIR_B

`capture` runs a fixed list of `sparkstack` invocations (every command's dry run, human and --json; the read-only
and status outputs; a few bad inputs; every --help) against the sparkstack of TREE and writes one file per case to
OUTDIR: the argv, cwd and the environment the case adds, the exit code, and stdout and stderr byte for byte.
`diff` prints, per case, `same` or a unified diff, then a count; it exits 1 when anything differs.

How a capture is made the same twice:
- The world is rebuilt from nothing at one fixed path, ROOT (/tmp/sparkstack-parity), by this tool, from the
  repository's own fixture builders (checks/synth.py, imagefix.py, hostfix.py, standins.py) taken from the
  checkout this tool sits in, so both captures see the same world whichever TREE they test.
- TREE itself is copied to ROOT/checkout (the files git knows, tracked and untracked-but-not-ignored; or the
  whole tree less .git, .venv and caches when TREE is not a git work tree), and the CLI runs as
  `PY -m sparkstack.cli` with PYTHONPATH=ROOT/checkout/python. Two trees thus print the same paths for the
  checkout, the shipped recipes and overlays, and nix/pins.json. Before any case, the tool checks that
  `import sparkstack` in that environment really loads ROOT/checkout (an installed copy must not shadow it).
- The environment is built from nothing (nothing is inherited): HOME, the state, cache, data and config dirs and
  HF_HOME inside the world; TZ=UTC, COLUMNS=100, NO_COLOR=1, LANG=C.UTF-8, PYTHONHASHSEED=0; no VLLM_API_KEY.
  Nothing can reach a network: the registry mirror and HF_ENDPOINT name a closed port on 127.0.0.1.
- docker, podman, ssh, nvidia-smi, sysctl, sync, sudo and id are the repository's recording stand-ins
  (checks/standins.py), first on PATH: the read-only questions `image load`, `launch status`, `ship` and
  `tune` ask get the same answers everywhere. The "nodocker" cases instead reach the real docker client with
  DOCKER_HOST on a socket that does not exist (the case is its error line; its wording is the docker client's).
- Host facts are read below the world's fake host roots (--host-root), never from this machine's /proc.
- The hub stand-in (checks/hub_standin.py) serves the recipe's model and drafter for the fetch cases that name
  it; it listens on a port of the kernel's choosing, shown in the outputs as <hub>.
- What still varies run to run is rewritten after the run, each rule in NORMALISE below with its reason.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/tmp/sparkstack-parity")  # fixed, so paths in the outputs match between captures
CHECKOUT = ROOT / "checkout"  # the copy of TREE under test
W = ROOT / "world"  # HOME, state, caches, fixtures
EMPTY = ROOT / "empty"  # a directory outside any checkout
CHECKS = Path(__file__).resolve().parents[1]  # the fixture builders: this checkout's, whatever TREE is
SUFFIX = ".case"
INDEX = "INDEX"
DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens there, a connection is refused at once
URL = "http://127.0.0.1:8888"  # the served endpoint verify/bench/soak/top name; dry runs send nothing to it
CASE_TIMEOUT_S = 120
HUB = "{hub}"  # in a case's env: the hub stand-in's URL, known once it listens; shown in outputs as HUB_SHOWN
HUB_SHOWN = b"http://127.0.0.1:<hub>"

# Rewrites of what varies from run to run although the world does not: (commands, pattern, replacement, why). A rule
# applies to the cases of those commands (their argv[0]; None: every case), to stdout and stderr alike.
NORMALISE: list[tuple[tuple[str, ...] | None, re.Pattern[bytes], bytes, str]] = [
    (("soak",), re.compile(rb"soak-\d{8}T\d{6}Z\.jsonl"), b"soak-<UTC time>.jsonl",
     "soak's default --log is named after the wall clock (./soak-<UTC time>.jsonl)"),
    (None, re.compile(rb"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB) free\b"), b"<N> free",
     "launch's disk check (also in up's plan) and ship's room line read the real free space of the filesystem "
     "under the world (statvfs)"),
    (None, re.compile(rb'("needed": \d+,\s+"free": )\d+'), rb"\1<N>",
     "ship --json (also in up's plan): the same free space, in bytes, in each host's room entry"),
    (None, re.compile(rb'(uptime_s(?:=|": ))\d+'), rb"\1<N>",
     "launch status: uptime is now minus the stand-in docker's fixed StartedAt"),
    (("bench", "up"), re.compile(rb'("salt": ")[0-9a-f]{8}"'), rb'\1<salt>"',
     "bench --dry-run --json: the run's salt is secrets.token_hex(4), new every run by design"),
    (("strip",), re.compile(rb'("fingerprint": ")[0-9a-f]{64}"'), rb'\1<fingerprint>"',
     "strip --json: the fingerprint hashes each source shard's (device, inode, size, mtime_ns), and a world made "
     "anew has new inodes (image build's fingerprint hashes content only: it is left as it is)"),
]


# ---------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    cwd: Path = CHECKOUT
    env: tuple[tuple[str, str], ...] = ()  # added to (or, with an empty value, removed from) the base env
    path: str = "standins"  # "standins": stand-ins first on PATH; "nodocker": the real docker, no daemon;
    #                         "ship": checks/shipfix.py's ssh and docker before the stand-ins


def _c(name: str, *argv: object, cwd: Path = CHECKOUT, env: dict[str, str] | None = None,
       path: str = "standins") -> Case:
    return Case(name, tuple(str(a) for a in argv), cwd, tuple(sorted((env or {}).items())), path)


HELP = [(), ("strip",), ("image",), ("image", "build"), ("image", "verify"), ("image", "load"), ("patch",),
        ("patch", "check"), ("pin",), ("pin", "overlay"), ("pin", "base"), ("pin", "fetch"), ("fetch",), ("launch",),
        ("tune",), ("plan",), ("plan", "kv"), ("ship",), ("verify",), ("soak",), ("top",), ("bench",), ("compare",),
        ("up",)]


def cases() -> list[Case]:
    """The fixed list. Names are the file names: keep them stable; add new cases at the end of their group."""
    model = W / "models/hub/models--org--model"
    base, overlay, unpinned, src = W / "base", W / "overlay", W / "overlay-unpinned", W / "src"
    host, untuned = W / "hostroot", W / "hostroot-untuned"
    fixture_pins = CHECKOUT / "nix/fixture-pins.json"
    pinned_index = json.loads((CHECKOUT / "nix/pins.json").read_text())["resolved"]["digest"]
    fixture_layer = json.loads(fixture_pins.read_text())["platforms"]["linux/arm64"]["layers"][0]["digest"]
    pinned = W / "recipes/pinned.toml"
    lab = ["--recipe", "lab-vllm-cpu"]
    offline = {"HF_HUB_OFFLINE": "1"}
    out: list[Case] = []
    add = out.append

    # strip
    add(_c("strip-dry-run", "strip", model, "--dry-run"))
    add(_c("strip-dry-run-json", "strip", model, "--dry-run", "--json"))
    add(_c("strip-dry-run-index-only", "strip", model, "--dry-run", "--index-only"))
    add(_c("strip-dry-run-index-only-json", "strip", model, "--dry-run", "--index-only", "--json"))
    add(_c("strip-dry-run-out", "strip", model, "--out", W / "stripped", "--dry-run"))
    add(_c("strip-dry-run-hub-model", "strip", W / "hf/hub/models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP",
           "--dry-run"))
    add(_c("strip-bad-missing-src", "strip", W / "no-such-model", "--dry-run"))

    # image
    build = ["image", "build", "--base", base, "--overlay", overlay, "--overlay-src", src, "--out", W / "image"]
    add(_c("image-build-dry-run", *build, "--dry-run"))
    add(_c("image-build-dry-run-json", *build, "--dry-run", "--json"))
    add(_c("image-build-dry-run-shipped-overlay", "image", "build", "--base", base, "--dry-run"))
    add(_c("image-build-dry-run-shipped-overlay-json", "image", "build", "--base", base, "--dry-run", "--json"))
    add(_c("image-build-dry-run-unpinned", "image", "build", "--base", base, "--overlay", unpinned, "--overlay-src",
           src, "--allow-unpinned", "--dry-run"))
    add(_c("image-verify-dry-run", "image", "verify", base, "--dry-run"))
    add(_c("image-verify-dry-run-json", "image", "verify", base, "--dry-run", "--json"))
    add(_c("image-verify", "image", "verify", base))
    add(_c("image-verify-json", "image", "verify", base, "--json"))
    add(_c("image-verify-oci-archive", "image", "verify", W / "base.tar"))
    add(_c("image-verify-bad-missing", "image", "verify", W / "no-such-image", "--dry-run"))
    add(_c("image-load-dry-run", "image", "load", base, "--dry-run"))
    add(_c("image-load-dry-run-json", "image", "load", base, "--dry-run", "--json"))
    add(_c("image-load-dry-run-podman", "image", "load", base, "--engine", "podman", "--dry-run"))
    add(_c("image-load-dry-run-nodocker", "image", "load", base, "--dry-run", path="nodocker"))

    # patch / pin
    add(_c("patch-check-dry-run", "patch", "check", "--base", base, "--overlay", overlay, "--overlay-src", src,
           "--dry-run"))
    add(_c("patch-check-dry-run-json", "patch", "check", "--base", base, "--overlay", overlay, "--overlay-src", src,
           "--dry-run", "--json"))
    add(_c("patch-check-dry-run-shipped-overlay", "patch", "check", "--base", base, "--dry-run"))
    add(_c("pin-overlay-dry-run", "pin", "overlay", "--overlay", unpinned, "--overlay-src", src, "--dry-run"))
    add(_c("pin-overlay-dry-run-json", "pin", "overlay", "--overlay", unpinned, "--overlay-src", src, "--dry-run",
           "--json"))
    add(_c("pin-overlay-dry-run-pinned", "pin", "overlay", "--overlay", overlay, "--overlay-src", src, "--dry-run"))
    add(_c("pin-base-dry-run", "pin", "base", "--dry-run"))
    add(_c("pin-base-dry-run-json", "pin", "base", "--dry-run", "--json"))
    add(_c("pin-base-check", "pin", "base", "--check"))
    add(_c("pin-base-dry-run-outside", "pin", "base", "--dry-run", cwd=EMPTY))
    add(_c("pin-fetch-dry-run", "pin", "fetch", pinned_index, "--out", W / "fetched-index", "--dry-run"))
    add(_c("pin-fetch-dry-run-json", "pin", "fetch", pinned_index, "--out", W / "fetched-index", "--dry-run",
           "--json"))
    add(_c("pin-fetch-dry-run-fixture-layer", "pin", "fetch", fixture_layer, "--pins", fixture_pins, "--out",
           W / "fetched-layer", "--dry-run"))
    add(_c("pin-fetch-dry-run-fixture-layer-json", "pin", "fetch", fixture_layer, "--pins", fixture_pins, "--out",
           W / "fetched-layer", "--dry-run", "--json"))
    add(_c("pin-fetch-bad-unpinned", "pin", "fetch", "sha256:" + "0" * 64, "--out", W / "x", "--dry-run"))
    add(_c("pin-fetch-bad-digest", "pin", "fetch", "nope", "--out", W / "x", "--dry-run"))

    # fetch (offline: error lines are the case where the hub would be asked)
    add(_c("fetch-dry-run", "fetch", "--dry-run", env=offline))
    add(_c("fetch-dry-run-json", "fetch", "--dry-run", "--json", env=offline))
    add(_c("fetch-resolve-dry-run", "fetch", "--resolve", "--dry-run", env=offline))
    add(_c("fetch-resolve-dry-run-json", "fetch", "--resolve", "--dry-run", "--json", env=offline))
    add(_c("fetch-dry-run-lab", "fetch", *lab, "--dry-run", env=offline))
    add(_c("fetch-resolve-dry-run-lab", "fetch", *lab, "--resolve", "--dry-run", env=offline))
    add(_c("fetch-dry-run-pinned", "fetch", "--recipe", pinned, "--dry-run", env=offline))
    add(_c("fetch-dry-run-pinned-json", "fetch", "--recipe", pinned, "--dry-run", "--json", env=offline))
    # against checks/hub_standin.py (on 127.0.0.1, its port shown as <hub>): the plans themselves
    hub = {"HF_ENDPOINT": HUB}
    add(_c("fetch-hub-dry-run", "fetch", "--recipe", W / "recipes/hub-pinned.toml", "--dry-run", env=hub))
    add(_c("fetch-hub-dry-run-json", "fetch", "--recipe", W / "recipes/hub-pinned.toml", "--dry-run", "--json",
           env=hub))
    add(_c("fetch-hub-resolve-dry-run", "fetch", "--resolve", "--dry-run", env=hub))
    add(_c("fetch-hub-resolve-dry-run-json", "fetch", "--resolve", "--dry-run", "--json", env=hub))
    add(_c("fetch-dry-run-outside", "fetch", "--dry-run", cwd=EMPTY, env=offline))

    # launch (host facts from the fake roots; docker and ssh are the stand-ins)
    add(_c("launch-0-dry-run", "launch", "0", "--dry-run", "--host-root", host))
    add(_c("launch-0-dry-run-json", "launch", "0", "--dry-run", "--json", "--host-root", host))
    add(_c("launch-0-dry-run-default-host-root", "launch", "0", "--dry-run", "--host-root", W / "empty-root"))
    add(_c("launch-all-dry-run", "launch", "all", "--dry-run", "--host-root", host))
    add(_c("launch-all-dry-run-lab", "launch", "all", "--dry-run", "--profile", "lab", "--host-root", host))
    add(_c("launch-all-dry-run-lab-json", "launch", "all", "--dry-run", "--profile", "lab", "--host-root", host,
           "--json"))
    add(_c("launch-all-dry-run-lab-recipe", "launch", "all", *lab, "--dry-run", "--profile", "lab", "--host-root",
           host))
    add(_c("launch-all-dry-run-lab-recipe-json", "launch", "all", *lab, "--dry-run", "--profile", "lab",
           "--host-root", host, "--json"))
    add(_c("launch-all-dry-run-probe", "launch", "all", "--dry-run", "--probe", "--host-root", host))
    add(_c("launch-all-dry-run-drop-caches-image", "launch", "all", "--dry-run", "--drop-caches", "--image", base,
           "--host-root", host))
    add(_c("launch-stop-dry-run", "launch", "stop", "--dry-run"))
    add(_c("launch-stop-dry-run-json", "launch", "stop", "--dry-run", "--json"))
    add(_c("launch-stop-dry-run-lab-recipe", "launch", "stop", *lab, "--dry-run"))
    # status asks the head's API on 127.0.0.1: the discard port, where nothing on this machine answers
    closed = {"API_PORT": "9"}
    add(_c("launch-status", "launch", "status", env=closed))
    add(_c("launch-status-json", "launch", "status", "--json", env=closed))
    add(_c("launch-status-nodocker", "launch", "status", env=closed, path="nodocker"))
    add(_c("launch-status-nodocker-json", "launch", "status", "--json", env=closed, path="nodocker"))
    add(_c("launch-bad-health-attempts-env", "launch", "0", "--dry-run", "--host-root", host,
           env={"HEALTH_ATTEMPTS": "lots"}))
    add(_c("launch-bad-target", "launch", "7", "--dry-run", "--host-root", host))
    add(_c("launch-bad-recipe", "launch", "0", "--recipe", "no-such-recipe", "--dry-run"))

    # tune
    add(_c("tune-all-dry-run", "tune", "all", "--dry-run", "--host-root", untuned))
    add(_c("tune-all-dry-run-json", "tune", "all", "--dry-run", "--host-root", untuned, "--json"))
    add(_c("tune-all-dry-run-tuned", "tune", "all", "--dry-run", "--host-root", host))
    add(_c("tune-0-dry-run-lab-recipe", "tune", "0", *lab, "--dry-run", "--host-root", host))

    # plan kv
    add(_c("plan-kv", "plan", "kv"))
    add(_c("plan-kv-json", "plan", "kv", "--json"))
    add(_c("plan-kv-kv-bytes", "plan", "kv", "--kv-bytes", "20000000000"))
    add(_c("plan-kv-kv-bytes-json", "plan", "kv", "--kv-bytes", "20000000000", "--json"))
    add(_c("plan-kv-lab-recipe", "plan", "kv", *lab))

    # ship: checks/shipfix.py's ssh and docker (each host a HOME of its own; the helper runs here, read-only)
    add(_c("ship-dry-run", "ship", "--dry-run", path="ship"))
    add(_c("ship-dry-run-json", "ship", "--dry-run", "--json", path="ship"))
    add(_c("ship-dry-run-host-image", "ship", "w1", "--dry-run", "--image", base, path="ship"))
    add(_c("ship-dry-run-host-image-json", "ship", "w1", "--dry-run", "--image", base, "--json", path="ship"))
    add(_c("ship-dry-run-host-no-weights", "ship", "w1", "--dry-run", "--image", base, "--no-weights", "--streams",
           "1", path="ship"))
    add(_c("ship-dry-run-unknown-host", "ship", "nohost", "--dry-run", "--image", base, path="ship"))
    add(_c("ship-bad-contradiction", "ship", "--dry-run", "--image", base, "--no-image", path="ship"))

    # verify / bench / soak / top / compare
    add(_c("verify-dry-run", "verify", URL, "--dry-run"))
    add(_c("verify-dry-run-json", "verify", URL, "--dry-run", "--json"))
    add(_c("verify-dry-run-key-temperature", "verify", URL, "--dry-run", "--temperature", "0", "--model", "m",
           env={"VLLM_API_KEY": "sk-parity-secret"}))
    add(_c("bench-dry-run", "bench", URL, "--dry-run"))
    add(_c("bench-dry-run-json", "bench", URL, "--dry-run", "--json"))
    add(_c("bench-dry-run-concurrency-category", "bench", URL, "--concurrency", "1,2", "--category", "code",
           "--dry-run"))
    add(_c("bench-dry-run-concurrency-category-json", "bench", URL, "--concurrency", "1,2", "--category", "code",
           "--dry-run", "--json"))
    add(_c("bench-bad-concurrency-0", "bench", URL, "--concurrency", "0", "--dry-run"))
    add(_c("bench-bad-category", "bench", URL, "--category", "nope", "--dry-run"))
    add(_c("soak-dry-run", "soak", URL, "--duration", "90s", "--dry-run"))
    add(_c("soak-dry-run-json", "soak", URL, "--duration", "90s", "--dry-run", "--json"))
    add(_c("soak-dry-run-log-recipe", "soak", URL, "--duration", "2h", "--log", W / "soak.jsonl", "--recipe",
           "lab-vllm-cpu", "--category", "code,json", "--dry-run"))
    add(_c("soak-bad-no-duration", "soak", URL, "--dry-run"))
    add(_c("top-dry-run", "top", URL, "--dry-run"))
    add(_c("top-dry-run-json", "top", URL, "--dry-run", "--json"))
    add(_c("top-dry-run-once-recipe", "top", URL, "--once", "--recipe", "glm53-flash-dflash2-nvfp4", "--dry-run"))
    add(_c("compare", "compare", W / "bench-a.json", W / "bench-b.json"))
    add(_c("compare-json", "compare", W / "bench-a.json", W / "bench-b.json", "--json"))
    add(_c("compare-settings-differ", "compare", W / "bench-a.json", W / "bench-cold.json"))
    add(_c("compare-bad-missing", "compare", W / "bench-a.json", W / "no-such.json"))

    # up
    add(_c("up-dry-run", "up", "--dry-run", "--host-root", host))
    add(_c("up-dry-run-json", "up", "--dry-run", "--json", "--host-root", host))
    add(_c("up-dry-run-outside", "up", "--dry-run", "--host-root", untuned, cwd=EMPTY))
    add(_c("up-dry-run-outside-json", "up", "--dry-run", "--json", "--host-root", untuned, cwd=EMPTY))
    add(_c("up-dry-run-from-launch-until-verify", "up", "--dry-run", "--from", "launch", "--until", "verify",
           "--host-root", host))
    add(_c("up-dry-run-image", "up", "--dry-run", "--image", base, "--host-root", host))
    add(_c("up-dry-run-base-bench", "up", "--dry-run", "--base", base, "--bench", "--host-root", host))
    add(_c("up-dry-run-lab-recipe", "up", "--dry-run", *lab, "--profile", "lab", "--host-root", host))
    add(_c("up-dry-run-pinned-recipe", "up", "--dry-run", "--recipe", pinned, "--image", base, "--host-root", host))
    add(_c("up-dry-run-pinned-recipe-json", "up", "--dry-run", "--json", "--recipe", pinned, "--image", base,
           "--host-root", host))
    add(_c("up-dry-run-hub-pinned-recipe", "up", "--dry-run", "--recipe", W / "recipes/hub-pinned.toml", "--image",
           base, "--host-root", host, env={"HF_ENDPOINT": HUB}))
    add(_c("up-bad-from", "up", "--from", "nope", "--dry-run"))
    add(_c("up-bad-image-and-base", "up", "--dry-run", "--image", base, "--base", base))

    # the program itself
    add(_c("version", "--version"))
    add(_c("bad-command", "nope"))
    add(_c("bad-option", "strip", "--nope"))
    for words in HELP:
        add(_c("help-" + ("-".join(words) or "sparkstack"), *words, "--help"))
    return out


# ---------------------------------------------------------------- the world


def _copy_tree(tree: Path, dest: Path) -> None:
    """TREE's files as git sees them (tracked, and untracked but not ignored), else all but .git/.venv/caches."""
    proc = subprocess.run(["git", "-C", str(tree), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if proc.returncode == 0:
        for rel in sorted(set(proc.stdout.decode().split("\0")) - {""}):
            s, d = tree / rel, dest / rel
            if not os.path.lexists(s):  # deleted in the work tree, not yet in the index
                continue
            d.parent.mkdir(parents=True, exist_ok=True)
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
            else:
                shutil.copy2(s, d)
    else:
        shutil.copytree(tree, dest, symlinks=True,
                        ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", ".hypothesis"))


def _fixed_bytes(n: int) -> bytes:
    """n bytes that are the same every time (imagefix's filler layer is os.urandom)."""
    block, seed = b"", b"sparkstack-parity"
    while len(block) < n:
        seed = hashlib.sha256(seed).digest()
        block += seed
    return block[:n]


def _write_lab_hub(hf: Path) -> None:
    """The lab recipe's two cache entries, shaped as hostfix.write_hub shapes the shipped recipe's."""
    import synth

    flat = W / "lab-flat"
    stripped = {name: [s for s in specs if not s.mtp] for name, specs in synth.DEFAULT_SHARDS.items()}
    config = synth.base_config(True)
    for level in (config, config["text_config"]):
        level.update(num_nextn_predict_layers=0, index_share_for_mtp_iteration=False)
    synth.write_model_dir(flat, shards={n: s for n, s in stripped.items() if s}, config=config)
    synth.cache_from_dir(flat, hf / "hub", repo_id="sparkstack-lab/tiny-glm-no-MTP")
    dflat = W / "lab-dflat"
    synth.write_model_dir(dflat, index=False,
                          shards={"model.safetensors": synth.DEFAULT_SHARDS["model-00001-of-00003.safetensors"]})
    synth.cache_from_dir(dflat, hf / "hub", repo_id="sparkstack-lab/tiny-dflash")
    shutil.rmtree(flat)
    shutil.rmtree(dflat)


def _pinned_recipe(dest: Path, revision: str, drafter_revision: str | None = None) -> None:
    """The tree's shipped recipe with its model and drafter revisions pinned (as hub_standin.recipe_copy does)."""
    text = (CHECKOUT / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml").read_text()
    text = text.replace('model_revision = "unpinned"', f'model_revision = "{revision}"', 1)
    text = text.replace('\nrevision = "unpinned"  #', f'\nrevision = "{drafter_revision or revision}"  #', 1)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)


def _bench_reports() -> None:
    """Two bench --json documents (bench/report.py's contract, as checks/unit/test_compare.py writes them), and a
    third whose settings differ (temperature)."""
    settings = {"url": URL, "model": "m", "concurrency": [1, 2], "rounds": 3, "max_tokens": 512, "temperature": 1.0,
                "top_p": 0.95, "categories": ["code"]}

    def cell(concurrency, category, tok, length, steps, flags=()):
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        withheld = bool(flags)
        return {"concurrency": concurrency, "category": category, "output_tok_s": None if withheld else mean(tok),
                "per_stream_tok_s": None, "ttft_first_chunk_p50_s": None, "ttft_content_p50_s": None,
                "ttft_content_p95_s": None, "itl_p50_s": None, "itl_p95_s": None, "itl_p99_s": None,
                "tpot_p50_s": None, "errors": 0, "drafts": 100, "draft_tokens": 400, "accepted_tokens": 175,
                "acceptance_length": None if withheld else mean(length), "per_position": None,
                "steps_per_s": None if withheld else mean(steps),
                "rounds": [{"output_tok_s": t, "acceptance_length": a, "steps_per_s": s}
                           for t, a, s in zip(tok, length, steps)],
                "flags": list(flags)}

    def write(name, cells, **over):
        (W / name).write_text(json.dumps({"suite_version": "1", "settings": {**settings, **over}, "cells": cells},
                                         indent=2))

    a = [cell(1, "code", [98, 100, 102], [2.70, 2.75, 2.80], [9.0, 9.1, 9.2]),
         cell(2, "code", [150, 160, 170], [2.7, 2.7, 2.7], [8.0, 8.0, 8.0])]
    b = [cell(1, "code", [119, 120, 121], [2.72, 2.78, 2.84], [9.0, 9.1, 9.2]),
         cell(2, "code", [150, 160, 170], [1.0, 1.0, 1.0], [8, 8, 8], flags=["spec_decode_collapse"])]
    write("bench-a.json", a)
    write("bench-b.json", b)
    write("bench-cold.json", b, temperature=0.0)


def build_world(tree: Path) -> dict:
    """Make the world anew; return the hub stand-in's repos."""
    if ROOT.exists():
        shutil.rmtree(ROOT)
    ROOT.mkdir(parents=True)
    _copy_tree(tree, CHECKOUT)
    EMPTY.mkdir()
    sys.path.insert(0, str(CHECKS))
    import hostfix
    import imagefix
    import shipfix
    import standins
    import synth

    for d in ("home", "state", "cache", "data", "config", "empty-root"):
        (W / d).mkdir(parents=True)
    (W / "calls.jsonl").touch()
    standins.install(W / "bin")
    (W / "bin-nodocker").mkdir()
    for name in standins.PROGRAMS:
        if name not in ("docker", "podman"):
            shutil.copy2(W / "bin" / name, W / "bin-nodocker" / name)
    # a checkpoint to strip, as checks/unit/test_dry_run.py makes it
    synth.write_model_dir(W / "flat")
    synth.cache_from_dir(W / "flat", W / "models/hub", repo_id="org/model")
    shutil.rmtree(W / "flat")
    # HF_HOME: the shipped recipe's stripped model and drafter (hostfix), and the lab recipe's
    hostfix.write_hub(W / "hf")
    _write_lab_hub(W / "hf")
    synth.write_model_dir(W / "flat")  # the unstripped model too, at the revision a pinned recipe names
    synth.cache_from_dir(W / "flat", W / "hf/hub", repo_id="LibertAIDAI/GLM-5.3-Flash-NVFP4")
    shutil.rmtree(W / "flat")
    _pinned_recipe(W / "recipes/pinned.toml", synth.REVISION)
    # ship's hosts (checks/shipfix.py): each a HOME of its own; the recipe's placeholder worker is one of them
    shipfix.install(W / "bin-ship")
    for host in ("w1", "worker"):
        (W / "hosts" / host).mkdir(parents=True)
    # a fixture base image (OCI layout, and as an oci-archive), made the same every time
    layers = [(kind, [(n, k, _fixed_bytes(len(p)) if n == "opt/filler.bin" else p) for n, k, p in entries])
              for kind, entries in imagefix.default_layers()]
    imagefix.write_base(W / "base", layers=layers)
    imagefix.layout_to_oci_archive(W / "base", W / "base.tar")
    # the overlay's source checkout, its overlay.toml pinned to it, and one unpinned
    imagefix.write_overlay_source(W / "src")
    imagefix.write_overlay(W / "overlay", pinned_from=W / "src/overlay-dflash2")
    imagefix.write_overlay(W / "overlay-unpinned")
    # host roots: a tuned head, and one tune has not seen
    hostfix.write_host(W / "hostroot")
    hostfix.write_host(W / "hostroot-untuned", tuned=False)
    _bench_reports()
    # the hub stand-in's repos (the recipe's model and drafter, one commit each), and the recipe pinned to them
    from hub_standin import DRAFTER, MODEL, synthetic_repos

    repos = synthetic_repos(W / "hub-repos")
    _pinned_recipe(W / "recipes/hub-pinned.toml", repos[MODEL].refs["main"], repos[DRAFTER].refs["main"])
    return repos


def base_env(path: str) -> dict[str, str]:
    bins = {"standins": f"{W}/bin", "nodocker": f"{W}/bin-nodocker", "ship": f"{W}/bin-ship:{W}/bin"}[path]
    env = {
        "PATH": f"{bins}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(W / "home"), "USER": "parity", "LOGNAME": "parity",
        "TZ": "UTC", "COLUMNS": "100", "LINES": "40", "NO_COLOR": "1", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONPATH": str(CHECKOUT / "python"), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "XDG_STATE_HOME": str(W / "state"), "XDG_CACHE_HOME": str(W / "cache"), "XDG_DATA_HOME": str(W / "data"),
        "XDG_CONFIG_HOME": str(W / "config"),
        "SPARKSTACK_STATE_DIR": str(W / "state/sparkstack"), "SPARKSTACK_CACHE_DIR": str(W / "cache/sparkstack"),
        "HF_HOME": str(W / "hf"), "HF_ENDPOINT": DEAD_URL, "HF_HUB_DISABLE_TELEMETRY": "1",
        "SPARKSTACK_REGISTRY_MIRROR": DEAD_URL, "SPARKSTACK_REGISTRY_TIMEOUT": "5",
        "SOURCE_DATE_EPOCH": "0",
        # the stand-ins (checks/standins.py): where they record, and the worker's uid (as test_dry_run sets it)
        "RECORD_LOG": str(W / "calls.jsonl"), "STANDIN_REMOTE_UID": "1000",
        # shipfix's ssh: its hosts, and where it records
        "FAKE_TARGETS": json.dumps({"w1": {"home": str(W / "hosts/w1")},
                                    "user@worker-node": {"home": str(W / "hosts/worker")}}, sort_keys=True),
        "FAKE_LOG": str(W / "ship-calls.jsonl"),
    }
    if path == "nodocker":
        env["DOCKER_HOST"] = f"unix://{W}/no-docker.sock"
    return env


def _env_for(case: Case, hub_url: str) -> dict[str, str]:
    env = base_env(case.path)
    for k, v in case.env:
        v = v.replace(HUB, hub_url)
        if v == "":
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _check_import(python: str) -> None:
    proc = subprocess.run([python, "-c", "import sparkstack; print(sparkstack.__file__)"], cwd=EMPTY,
                          env=base_env("standins"), capture_output=True, text=True)
    want = str(CHECKOUT / "python/sparkstack/__init__.py")
    if proc.returncode != 0 or proc.stdout.strip() != want:
        sys.exit(f"outputs_parity: `import sparkstack` loads {proc.stdout.strip() or proc.stderr.strip()!r}, "
                 f"not {want}: an installed copy shadows PYTHONPATH")


# ---------------------------------------------------------------- capture / diff


def normalise(case: Case, data: bytes) -> bytes:
    for commands, pattern, replacement, _why in NORMALISE:
        if commands is None or case.argv[:1] and case.argv[0] in commands:
            data = pattern.sub(replacement, data)
    return data


def render(case: Case, code: int | str, stdout: bytes, stderr: bytes) -> bytes:
    head = [f"case: {case.name}", "argv: sparkstack " + shlex.join(case.argv), f"cwd: {case.cwd}",
            f"path: {case.path}", "env: " + (" ".join(f"{k}={v}" if v else f"-{k}" for k, v in case.env) or "(base)"),
            f"exit: {code}", f"--- stdout ({len(stdout)} bytes)"]
    return ("\n".join(head) + "\n").encode() + stdout + f"\n--- stderr ({len(stderr)} bytes)\n".encode() + stderr


def capture(tree: Path, outdir: Path, python: str) -> int:
    tree = tree.resolve()
    if not (tree / "python/sparkstack/cli.py").is_file():
        sys.exit(f"outputs_parity: {tree} has no python/sparkstack/cli.py")
    print(f"building the world under {ROOT} from {tree} ...", file=sys.stderr)
    repos = build_world(tree)
    _check_import(python)
    from hub_standin import HubStandin

    hub = HubStandin(repos).start()
    all_cases = cases()
    names = [c.name for c in all_cases]
    assert len(set(names)) == len(names), "case names must be unique"
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in outdir.glob("*" + SUFFIX):
        stale.unlink()
    try:
        for i, case in enumerate(all_cases, 1):
            try:
                proc = subprocess.run([python, "-m", "sparkstack.cli", *case.argv], cwd=case.cwd,
                                      env=_env_for(case, hub.url), stdin=subprocess.DEVNULL, capture_output=True,
                                      timeout=CASE_TIMEOUT_S)
                code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as exc:
                code, stdout, stderr = f"timeout after {CASE_TIMEOUT_S} s", exc.stdout or b"", exc.stderr or b""
            shown = [normalise(case, out.replace(hub.url.encode(), HUB_SHOWN)) for out in (stdout, stderr)]
            (outdir / (case.name + SUFFIX)).write_bytes(render(case, code, *shown))
            print(f"[{i}/{len(all_cases)}] {case.name}: exit {code}", file=sys.stderr)
    finally:
        hub.stop()
    (outdir / INDEX).write_text(f"tree: {tree}\nworld: {ROOT}\npython: {python}\ncases: {len(names)}\n" +
                                "".join(n + "\n" for n in names))
    print(f"captured {len(all_cases)} cases to {outdir}", file=sys.stderr)
    return 0


def diff(a: Path, b: Path) -> int:
    names_a = {p.name[:-len(SUFFIX)] for p in a.glob("*" + SUFFIX)}
    names_b = {p.name[:-len(SUFFIX)] for p in b.glob("*" + SUFFIX)}
    if not names_a and not names_b:
        sys.exit(f"outputs_parity: no {SUFFIX} files in {a} or {b}")
    same = differ = missing = 0
    for name in sorted(names_a | names_b):
        if name not in names_b or name not in names_a:
            print(f"{name}: only in {a if name in names_a else b}")
            missing += 1
            continue
        da, db = (a / (name + SUFFIX)).read_bytes(), (b / (name + SUFFIX)).read_bytes()
        if da == db:
            print(f"{name}: same")
            same += 1
            continue
        differ += 1
        print(f"{name}: differs")
        ta = da.decode("utf-8", "backslashreplace").splitlines(keepends=True)
        tb = db.decode("utf-8", "backslashreplace").splitlines(keepends=True)
        for line in difflib.unified_diff(ta, tb, str(a / (name + SUFFIX)), str(b / (name + SUFFIX))):
            sys.stdout.write(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    print(f"\n{same} same, {differ} differ, {missing} only on one side ({same + differ + missing} cases)")
    return 1 if differ or missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture", help="run the cases against TREE's sparkstack; write OUTDIR")
    cap.add_argument("tree", type=Path)
    cap.add_argument("outdir", type=Path)
    cap.add_argument("--python", default=sys.executable,
                     help="interpreter with sparkstack's dependencies (default: this one)")
    dif = sub.add_parser("diff", help="compare two captures; exit 1 if any case differs")
    dif.add_argument("a", type=Path)
    dif.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "capture":
        return capture(args.tree, args.outdir.absolute(), args.python)
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())

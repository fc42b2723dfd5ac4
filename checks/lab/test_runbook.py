"""The README's runbook (its lab transcript: docs/runbook-lab.md), walked end to end on the two-host lab: fetch,
strip, pin, build, ship, tune, launch all, verify, bench, each the way a user runs it (from one directory, on the
head, as a user whose HOME is its own).

- fetch: the hub stand-in (checks/hub_standin.py) through HF_ENDPOINT, a synthetic checkpoint with an MTP layer;
- pin base: the registry stand-in (checks/registry_standin.py) through SPARKSTACK_REGISTRY_MIRROR, serving the
  lab's stand-in engine base; pin overlay: that base's overlay (the stand-in engine as the one file it installs);
- build: `image build` of that base and overlay; ship: to the lab's worker over its real sshd;
- tune: against a host root per machine (the worker's own is mounted at the same path inside its mount
  namespace) with recording `sysctl` and `nvidia-smi` stand-ins on each machine's PATH: the lab shares this
  machine's kernel, so nothing reaches the real /proc/sys or /etc;
- launch all: the stand-in engine on both ranks, printing vLLM's boot lines; verify and bench against the head's API.

Each step checks its own essentials on the thing itself (the recipe file, the caches, the worker's docker and hub,
the host roots, the stand-ins' records, the engine's counters), with figures derived from what the stand-ins were
given. With SPARKSTACK_RUNBOOK_TRANSCRIPT=FILE, every step's command line and output go to FILE, from which the
runbook's lab transcript in docs/runbook-lab.md is made (the head user's HOME shown as ~, the test's directory as
the current one).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import shiplab
import standins
import synth
from clirun import sparkstack_cmd
from hostfix import BOOT_ID, meminfo, write_host
from imagefix import layout_digests
from hub_standin import DRAFTER, MODEL, HubStandin, synthetic_repos
from huggingface_hub import scan_cache_dir
from registry_standin import Repo, Standin
from safetensors import safe_open
from test_boot_lab import HEAD_SCRIPT, WORKER_SCRIPT
from test_launch_lab import lab_recipe

BASE_REF = "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"
STRIPPED = "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP"
API = "http://127.0.0.1:8888"  # the recipe's API_PORT, on the head
PAGE_CACHE_KIB = 8_912_896  # 8.5 GiB of page cache on each machine: tune drops it
PATTERN = (4, 2, 1, 0)  # accepted tokens per draft step, cycling: the stand-in engine is given it
TUNE_ACTS = [["sysctl", "-w", "vm.swappiness=0"], ["nvidia-smi", "-pm", "1"], ["nvidia-smi", "-lgc", "0,2000"],
             ["sysctl", "-w", "vm.drop_caches=3"]]


class Runbook:
    """Runs each step as the user would (`sparkstack ...` from `work`), keeps its command line and output."""

    def __init__(self, work: Path, home: Path, env: dict, netns: str) -> None:
        self.work, self.home, self.env, self.netns = work, home, env, netns
        self.steps: list[tuple[str, str, str]] = []
        self.transcript = os.environ.get("SPARKSTACK_RUNBOOK_TRANSCRIPT")

    def shown(self, text: str) -> str:
        return text.replace(str(self.home), "~").replace(f"{self.work}/", "").replace(str(self.work), ".")

    def run(self, label: str, *args: str, on_head: bool = False, shown_env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        """One step; on_head: inside the head's network namespace (where the worker and the API are)."""
        prefix = ["ip", "netns", "exec", self.netns] if on_head else []
        proc = subprocess.run([*prefix, *sparkstack_cmd(), *args], cwd=self.work, env={**self.env, **(shown_env or {})},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
        line = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in (shown_env or {}).items()), "sparkstack", shlex.join(args)])
        self.steps.append((label, self.shown(line), self.shown(proc.stdout)))
        if self.transcript:
            Path(self.transcript).write_text(
                "# checks/lab/test_runbook.py: each step's command and output (stdout and stderr, interleaved)\n"
                + "".join(f"\n## {label}\n$ {cmd}\n{out}" for label, cmd, out in self.steps))
        assert "Traceback" not in proc.stdout, proc.stdout
        assert proc.returncode == 0, f"{label}: exit {proc.returncode}\n{proc.stdout}"
        return proc


@pytest.fixture
def runbook_world(lab, standin_image, tmp_path_factory):
    """Stand-ins up, the recipe and the two host roots written, the tools in place on both machines; afterwards
    the pair stopped and the worker left as it was (its mounts, its HOME)."""
    tar, _ = standin_image
    fixture = tar.parent  # the stand-in engine's base, overlay and source (conftest's standin_image)
    work = tmp_path_factory.mktemp("runbook")
    home = work / "home"
    hub = HubStandin(synthetic_repos(work / "repos")).start()
    served = Repo()
    served.add_layout(fixture / "base")
    served.tags["sm121-v8"] = layout_digests(fixture / "base")["manifest"]
    registry = Standin({"tonyd2wild/vllm-glm53-flash": served}).start()

    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0", "STANDIN_ACCEPT_PATTERN": ",".join(map(str, PATTERN)),
                                    "STANDIN_BOOT_SCRIPT": json.dumps({"0": HEAD_SCRIPT, "1": WORKER_SCRIPT})})
    recipe.rename(work / "my-recipe.toml")
    (work / "ssh_config").symlink_to(lab.ssh_config)
    (work / "base").symlink_to(fixture / "base")
    (work / "src").symlink_to(fixture / "src")
    (work / "overlay").mkdir()
    text = (fixture / "overlay/overlay.toml").read_text()
    sha = hashlib.sha256((fixture / "src/overlay-dflash2/standin_engine.py").read_bytes()).hexdigest()
    # Unpinned, as shipped (pin overlay fills it in), and with a source of its own: an image no dockerd holds yet.
    assert text.count(sha) == 1 and text.count('repo = "sparkstack/lab"') == 1
    (work / "overlay/overlay.toml").write_text(
        text.replace(sha, "unpinned").replace('repo = "sparkstack/lab"', 'repo = "sparkstack/runbook"'))

    roots = {"head": work / "hostroot", "worker": work / "worker-hostroot"}
    recorder = work / "recorder"
    standins.install(recorder)
    tools = {}
    for name, root in roots.items():
        write_host(root, tuned=False)
        (root / "proc/meminfo").write_text(meminfo(Cached=PAGE_CACHE_KIB))
        (root / "machine").write_text(name)
        tools[name] = standins.recording_tools(work / f"{name}-tools", recorder, work / f"{name}-record.jsonl", roots["head"])

    env = shiplab.head_env(home, {
        "HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": "", "HF_HUB_CACHE": "",
        "SPARKSTACK_REGISTRY_MIRROR": registry.url, "VLLM_API_KEY": "lab-runbook-key",
        "PATH": f"{tools['head']}:{os.environ['PATH']}"})
    with lab.worker.left_as_found():  # after the pair is stopped
        mounts = []
        try:
            # The worker's own host root at the path the head's has, and its tools first on its PATH: in its mount
            # namespace only, so the head (and this machine) never see either.
            for src, dest in ((roots["worker"], roots["head"]), (tools["worker"], Path("/usr/local/sbin"))):
                lab.worker.machine("mount", "--bind", str(src), str(dest))
                mounts.append(dest)
            yield {"lab": lab, "work": work, "home": home, "hub": hub, "registry": registry, "fixture": fixture,
                   "roots": roots, "book": Runbook(work, home, env, lab.head.netns)}
        finally:
            subprocess.run(["ip", "netns", "exec", lab.head.netns, *sparkstack_cmd(), "launch", "stop", "--recipe",
                            "my-recipe.toml", "--ssh-config", "ssh_config"], cwd=work, env=env, capture_output=True, check=False)
            for dest in reversed(mounts):
                lab.worker.machine("umount", str(dest), check=False)
            registry.stop()
            hub.stop()


def test_the_runbook_from_nothing_to_a_verified_measured_pair(runbook_world):
    lab, work, home, book = runbook_world["lab"], runbook_world["work"], runbook_world["home"], runbook_world["book"]
    hf_hub = home / ".cache/huggingface/hub"
    recipe = work / "my-recipe.toml"
    pinned = {repo: runbook_world["hub"].repos[repo].refs["main"] for repo in (MODEL, DRAFTER)}

    # fetch: --resolve pins the commits main names now, then exactly those land in the head's cache.
    book.run("fetch --resolve", "fetch", "--resolve", "--recipe", "my-recipe.toml",
             shown_env={"HF_ENDPOINT": runbook_world["hub"].url})
    pins = tomllib.loads(recipe.read_text())
    assert (pins["model_revision"], pins["drafter"]["revision"]) == (pinned[MODEL], pinned[DRAFTER])
    book.run("fetch", "fetch", "--recipe", "my-recipe.toml", shown_env={"HF_ENDPOINT": runbook_world["hub"].url})
    scan = scan_cache_dir(hf_hub)
    assert scan.warnings == []
    assert {r.repo_id: {x.commit_hash for x in r.revisions} for r in scan.repos} == {k: {v} for k, v in pinned.items()}

    # strip: the MTP layer leaves the shards themselves; the stripped entry keeps the pinned commit.
    book.run("strip --dry-run", "strip", str(hf_hub / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4"), "--dry-run")
    assert not (hf_hub / STRIPPED).exists()
    book.run("strip", "strip", str(hf_hub / "models--LibertAIDAI--GLM-5.3-Flash-NVFP4"))
    snap = hf_hub / STRIPPED / "snapshots" / pinned[MODEL]
    assert (hf_hub / STRIPPED / "refs/main").read_text() == pinned[MODEL]
    kept = set()
    for shard in snap.glob("*.safetensors"):
        with safe_open(shard, "np") as f:
            kept |= set(f.keys())
    assert kept == {s.name for specs in synth.DEFAULT_SHARDS.values() for s in specs if not s.mtp}
    config = json.loads((snap / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == config["text_config"]["num_nextn_predict_layers"] == 0

    # pin: the base by digest from the registry, and the overlay's file hashes from its source.
    book.run("pin base", "pin", "base", BASE_REF, "--platform", "linux/amd64", "--pins", "pins.json",
             shown_env={"SPARKSTACK_REGISTRY_MIRROR": runbook_world["registry"].url})
    base = layout_digests(runbook_world["fixture"] / "base")
    got = json.loads((work / "pins.json").read_text())["platforms"]["linux/amd64"]
    assert (got["manifest"]["digest"], got["config"]["digest"], [d["digest"] for d in got["layers"]]) == \
        (base["manifest"], base["config"], base["layers"])
    book.run("pin overlay", "pin", "overlay", "--overlay", "overlay", "--overlay-src", "src")
    engine = runbook_world["fixture"] / "src/overlay-dflash2/standin_engine.py"
    (install,) = tomllib.loads((work / "overlay/overlay.toml").read_text())["install"]
    assert install["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()

    # build: the pinned base's layers, reused by digest, plus one new layer.
    book.run("build", "image", "build", "--base", "base", "--overlay", "overlay", "--overlay-src", "src",
             "--platform", "linux/amd64", "--link-base", "symlink", "--out", "image")
    image = layout_digests(work / "image")
    assert image["layers"][:-1] == base["layers"] and len(image["layers"]) == len(base["layers"]) + 1

    # ship: the worker's docker holds the image by its config digest, and its hub the two entries at their commits.
    assert lab.worker.docker("image", "inspect", image["config"], check=False).returncode != 0
    book.run("ship", "ship", "--recipe", "my-recipe.toml", "--image", "image", "--ssh-config", "ssh_config",
             on_head=True)
    held = lab.worker.docker("image", "inspect", "--format", "{{.Id}}", image["config"], check=False)
    assert held.stdout.strip() == image["config"], held.stderr
    scan = scan_cache_dir(lab.worker.path(shiplab.WORKER_HUB))
    assert scan.warnings == []
    assert {r.repo_id: {x.commit_hash for x in r.revisions} for r in scan.repos} == \
        {MODEL + "-no-MTP": {pinned[MODEL]}, DRAFTER: {pinned[DRAFTER]}}

    # tune: each machine's own settings, through its own stand-ins. First make sure that is what runs there.
    roots = runbook_world["roots"]
    where = lab.ssh("sh", "-c", f"command -v sysctl; command -v nvidia-smi; cat {roots['head']}/machine")
    assert where.stdout.split() == ["/usr/local/sbin/sysctl", "/usr/local/sbin/nvidia-smi", "worker"], where.stdout
    assert shutil.which("sysctl", path=book.env["PATH"]) == str(work / "head-tools/sysctl")
    book.run("tune", "tune", "all", "--recipe", "my-recipe.toml", "--host-root", "hostroot", "--ssh-config",
             "ssh_config", on_head=True)
    for machine, root in roots.items():
        acts = [r for r in standins.recorded(work / f"{machine}-record.jsonl") if "--query-gpu" not in " ".join(r)]
        assert acts == TUNE_ACTS, (machine, acts)
        assert (root / "proc/sys/vm/swappiness").read_text() == "0\n"
        assert (root / "etc/sysctl.d/zz-sparkstack-tune.conf").read_text().splitlines()[-1] == "vm.swappiness = 0"
        stamp = (root / "run/sparkstack/clock-cap").read_text().splitlines()
        assert {"clock_cap=0,2000", f"boot_id={BOOT_ID}"} <= set(stamp), stamp

    # launch all: worker first, then the head, both on the built image; every rank's boot lines read.
    proc = book.run("launch all", "launch", "all", "--recipe", "my-recipe.toml", "--image", "image", "--profile",
                    "lab", "--host-root", "hostroot", "--ssh-config", "ssh_config", "--worker-delay", "0.5",
                    "--health-interval", "0.3", on_head=True)
    assert not [line for line in proc.stdout.splitlines() if line.startswith("fail")], proc.stdout
    for host, name in ((lab.head, "glm53-tony-rank0"), (lab.worker, "glm53-tony-rank1")):
        state = host.docker("inspect", "--format", "{{.State.Status}} {{.Image}}", name).stdout.split()
        assert state == ["running", image["config"]], (name, state)
    pool = round(5.12 * 2**30)  # the worker's figure in WORKER_SCRIPT, the smaller of the two
    assert f"KV pool (minimum across ranks 0, 1: rank 1): {pool:,} B" in proc.stdout

    # verify: every check passes against the head's API.
    proc = book.run("verify", "verify", API, on_head=True)
    assert {line.split()[0] for line in proc.stdout.splitlines()} == {"pass"}, proc.stdout

    # bench: one cell per concurrency, each with the stand-in's acceptance figures.
    proc = book.run("bench", "bench", API, "--concurrency", "1,2", "--rounds", "1", "--category", "count",
                    on_head=True)
    length = 1 + sum(PATTERN) / len(PATTERN)
    rates = "/".join(f"{sum(a > i for a in PATTERN) / len(PATTERN):.2f}" for i in range(4))
    rows = [line for line in proc.stdout.splitlines() if "│ count" in line]
    assert len(rows) == 2 and all(f"{length:.2f}" in r and rates in r for r in rows), proc.stdout

"""Preflight: every check that can be made before a container starts. One line each: pass, fail or warn.

Host facts are read below a root prefix (`--host-root`), so tests can supply a
fake /sys and /proc. The facts `sparkstack tune` sets (tune.facts) are read on the
head always, and on the workers (over ssh, read-only) when a runner is given for
them, as are the checks that need docker on a rank (apply, or `--probe`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkstack.checkline import check_line
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import SnapshotState, probe_argv, probe_result, ref_file, snapshot_dir, snapshot_state
from sparkstack.launch import argv_gate
from sparkstack.launch.gatecache import GateCache, cached_line, gate_cache
from sparkstack.launch.kv import plan_launch_kv
from sparkstack.launch.plan import LaunchPlan, RankPlan
from sparkstack.recipe import KNOB_DEFAULTS
from sparkstack.remote import UNREACHABLE, Runner, docker_answer, failure_line, unreachable_reason
from sparkstack.safetensors_header import read_header
from sparkstack.strip.mtp import mtp_keys, mtp_levels_left, num_hidden_layers
from sparkstack.tune.facts import HostFacts, read_facts
from sparkstack.units import GIB

CHAT_TEMPLATE = "chat_template_mm.jinja"
# Runtime gates when the image carries none in its labels: the overlay's build gates (overlays/dflash2/overlay.toml).
DEFAULT_GATES = (
    ("python3", "-c", "from vllm.model_executor.models.registry import ModelRegistry; "
                      "assert 'DFlash2DraftModel' in ModelRegistry.get_supported_archs()"),
    ("python3", "-c", "import vllm.model_executor.models.qwen3_dflash2"),
    ("python3", "-c", "import vllm.v1.worker.gpu.spec_decode.dflash2.speculator"),
)

# The InstantTensor variant's own gates: its wheel drags NCCL down to 2.29.7, fatal on the fabric, so
# the image must hold the re-pinned 2.30.7; and the loader `--load-format instanttensor` names must import.
NCCL_PIN = "2.30.7"
INSTANTTENSOR_GATES = (
    ("python3", "-c", "from importlib.metadata import version; v = version('nvidia-nccl-cu13'); "
                      f"assert v == '{NCCL_PIN}', 'nvidia-nccl-cu13 is ' + v + ', not {NCCL_PIN} (2.29.7 is fatal on the fabric)'"),
    ("python3", "-c", "import instanttensor"),
)


def load_format_gates(plan: LaunchPlan) -> list[tuple[str, ...]]:
    """Gates the argv itself asks for: a launch that loads with instanttensor needs the InstantTensor variant's,
    whatever the image's labels say."""
    argv = list(plan.ranks[0].engine_argv)
    i = argv.index("--load-format") if "--load-format" in argv else -1
    return list(INSTANTTENSOR_GATES) if 0 <= i < len(argv) - 1 and argv[i + 1] == "instanttensor" else []


# Run inside the image as `python3 -c ARGV_GATE --sparkstack-gates SPEC` (run_gates): the image's own `vllm serve`
# parser, abbreviations off, judges each engine argv, then the tool and reasoning parser names against the image's
# registries (0 accepted, 1 refused with a line naming the option, 2 no parser in the image); the runtime gates run
# from the same process. One result line for all.
ARGV_GATE = Path(argv_gate.__file__).read_text()  # sent as it is on disk, byte for byte


@dataclass(frozen=True)
class PreflightCheck:
    name: str
    status: str  # pass | fail | warn | skip
    detail: str
    rank: int | None = None
    host: str = ""  # the machine the check is about, as its runner names it ("local", "user@worker")

    def line(self) -> str:
        where = "" if self.rank is None else f"[rank {self.rank}{' on ' + self.host if self.host else ''}] "
        return check_line(self.status, self.name, self.detail, where)

    def to_json(self) -> dict:
        return {"check": self.name, "status": self.status, "detail": self.detail, "rank": self.rank,
                "host": self.host or None}


@dataclass(frozen=True)
class Thresholds:
    min_free_disk_gib: float = 5.0




def _read(root: Path, rel: str) -> str | None:
    try:
        return (root / rel.lstrip("/")).read_text()
    except OSError:
        return None


@dataclass(frozen=True)
class FabricFacts:
    """What the fabric checks read on one rank, under its host root: the same files on the head (read here) and on
    a worker (over its ssh, read-only: one `grep` of the files, one `find` of the directories)."""

    operstate: str | None  # sys/class/net/NIC/operstate; None: no such NIC
    netdevs: tuple[str, ...]  # sys/class/net
    hcas: tuple[str, ...]  # sys/class/infiniband
    hca_netdevs: tuple[str, ...] | None  # sys/class/infiniband/HCA/device/net; None: no such HCA
    fib_trie: str  # proc/net/fib_trie
    route: str  # proc/net/route


def _fabric_paths(root: str, nic: str, hca: str) -> dict[str, str]:
    # Directories end in "/": a host root may hold them as symlinks, which `find` only enters with the slash.
    return {"operstate": os.path.join(root, f"sys/class/net/{nic}/operstate"),
            "netdevs": os.path.join(root, "sys/class/net") + "/",
            "hcas": os.path.join(root, "sys/class/infiniband") + "/",
            "hca_netdevs": os.path.join(root, f"sys/class/infiniband/{hca}/device/net") + "/",
            "fib_trie": os.path.join(root, "proc/net/fib_trie"), "route": os.path.join(root, "proc/net/route")}


def read_fabric(runner: Runner, root: str, nic: str, hca: str) -> FabricFacts:
    """A rank's fabric facts through its runner (here, or over ssh); a failed connection raises SparkstackError."""
    paths = _fabric_paths(root, nic, hca)
    texts = runner.read_texts([paths["operstate"], paths["fib_trie"], paths["route"]])
    dirs = runner.list_dirs([paths["netdevs"], paths["hcas"], paths["hca_netdevs"]])
    hcas = tuple(dirs[paths["hcas"]])
    return FabricFacts(texts[paths["operstate"]], tuple(dirs[paths["netdevs"]]), hcas,
                       tuple(dirs[paths["hca_netdevs"]]) if hca in hcas else None,
                       texts[paths["fib_trie"]] or "", texts[paths["route"]] or "")


def nic_verdict(f: FabricFacts, nic: str, rank: int) -> PreflightCheck:
    if f.operstate is None:
        return PreflightCheck("nic", "fail", f"{nic} does not exist (have: {', '.join(f.netdevs) or 'none'}); set CX_NIC, "
                                             "or nic of this rank's [[nodes]], to the fabric port", rank)
    state = f.operstate.strip()
    # operstate, not `ip link | grep UP`: a down link can still carry the UP flag.
    if state != "up":
        return PreflightCheck("nic", "fail", f"{nic} operstate is {state!r}, not 'up'; check its cable, then "
                                             f"`ip link set {nic} up`", rank)
    return PreflightCheck("nic", "pass", f"{nic} is up", rank)


def hca_verdict(f: FabricFacts, hca: str, nic: str, rank: int) -> PreflightCheck:
    if f.hca_netdevs is None:
        return PreflightCheck("hca", "fail", f"RDMA device {hca} does not exist (have: {', '.join(f.hcas) or 'none'}); "
                                             "set CX_HCA, or hca of this rank's [[nodes]] (`ibdev2netdev` pairs them)",
                              rank)
    if nic not in f.hca_netdevs:
        return PreflightCheck("hca", "fail", f"{hca} maps to {', '.join(f.hca_netdevs) or 'no netdev'}, not {nic}; set "
                                             "CX_HCA to the RDMA device of the fabric port (`ibdev2netdev` pairs them)",
                              rank)
    return PreflightCheck("hca", "pass", f"{hca} <-> {nic}", rank)


def fabric_ip_verdict(f: FabricFacts, ip: str, nic: str, rank: int) -> PreflightCheck:
    if ip not in _ips_in(f.fib_trie):
        return PreflightCheck("fabric-ip", "fail", f"{ip} is not an address of this host; set fabric_ip of this "
                                                   f"rank's [[nodes]] to its address on {nic} (`ip -4 addr show {nic}`)",
                              rank)
    addr = struct.unpack("<I", socket.inet_aton(ip))[0]
    if not any(addr & mask == net for net, mask in _routes_in(f.route, nic)):
        return PreflightCheck("fabric-ip", "fail", f"{ip} is local but its subnet is not on {nic}; the fabric address "
                                                   f"belongs on the fabric port (`ip -4 route show dev {nic}`)", rank)
    return PreflightCheck("fabric-ip", "pass", f"{ip} on {nic}", rank)


def fabric_checks(f: FabricFacts, ip: str, nic: str, hca: str, rank: int) -> list[PreflightCheck]:
    """The fabric's three one-line verdicts for one rank: its NIC is up, its HCA maps to it, its address is on it."""
    return [nic_verdict(f, nic, rank), hca_verdict(f, hca, nic, rank), fabric_ip_verdict(f, ip, nic, rank)]


def worker_fabric_checks(plan: LaunchPlan, runners: dict[int, Runner], root: Path) -> list[PreflightCheck]:
    """Every rank reached over ssh gets the head's fabric checks, on its own NIC, HCA and address: the blog's
    launcher fails fast unless the link is up on both sides; a worker's down or renamed port would otherwise show
    up as an NCCL hang minutes into the boot."""
    checks = []
    for rank in plan.ranks:
        if rank.ssh is None:
            continue
        try:
            facts = read_fabric(runners[rank.rank], str(root.absolute()), rank.nic, rank.hca)
        except SparkstackError as exc:
            checks.append(PreflightCheck("fabric", "fail", f"cannot read the fabric facts: {exc}", rank.rank))
            continue
        checks += fabric_checks(facts, rank.fabric_ip, rank.nic, rank.hca, rank.rank)
    return checks


def check_nic(root: Path, nic: str, rank: int) -> PreflightCheck:
    return nic_verdict(read_fabric(Runner(), str(root), nic, ""), nic, rank)


def check_hca(root: Path, hca: str, nic: str, rank: int) -> PreflightCheck:
    return hca_verdict(read_fabric(Runner(), str(root), nic, hca), hca, nic, rank)


def _ips_in(text: str) -> set[str]:
    """Addresses a host owns, from its /proc/net/fib_trie (the `/32 host LOCAL` leaves)."""
    ips, last = set(), None
    for line in text.splitlines():
        words = line.split()
        if words[:1] in (["|--"], ["+--"]) and len(words) > 1:
            last = words[1]
        elif "/32 host LOCAL" in line and last:
            ips.add(last)
    return ips


def _routes_in(text: str, nic: str) -> list[tuple[int, int]]:
    """(network, mask) pairs routed through `nic`, from a /proc/net/route."""
    out = []
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[0] == nic:
            # The kernel prints the network-order u32 as host-order hex; inet_aton + "<I" matches it on x86/arm64.
            out.append((int(f[1], 16), int(f[7], 16)))
    return out


def check_fabric_ip(root: Path, ip: str, nic: str, rank: int) -> PreflightCheck:
    return fabric_ip_verdict(read_fabric(Runner(), str(root), nic, ""), ip, nic, rank)


def check_master_addr(root: Path, addr: str, fabric_ip: str) -> PreflightCheck:
    """The workers meet rank 0 at MASTER_ADDR: an address rank 0's host does not hold leaves them waiting."""
    if addr == fabric_ip:
        return PreflightCheck("master-addr", "pass", f"MASTER_ADDR {addr} is rank 0's fabric address", 0)
    if ":" in addr:  # /proc/net/fib_trie holds IPv4 only
        return PreflightCheck("master-addr", "skip", f"MASTER_ADDR {addr} is IPv6: preflight reads IPv4 addresses only", 0)
    if addr not in _ips_in(read_fabric(Runner(), str(root), "", "").fib_trie):
        return PreflightCheck("master-addr", "fail", f"MASTER_ADDR {addr} is not an address of this host: the workers "
                                                     f"would wait for a rank 0 that is not there (set MASTER_ADDR="
                                                     f"{fabric_ip}, rank 0's fabric address)", 0)
    return PreflightCheck("master-addr", "pass", f"MASTER_ADDR {addr} is an address of this host", 0)


def listening_ports(root: Path) -> set[int]:
    ports = set()
    for name in ("proc/net/tcp", "proc/net/tcp6"):
        for line in (_read(root, name) or "").splitlines()[1:]:
            f = line.split()
            if len(f) > 3 and f[3] == "0A":  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def check_ports(root: Path, ports: dict[str, int], rank: int) -> PreflightCheck:
    busy = listening_ports(root)
    taken = [f"{name} {port}" for name, port in ports.items() if port in busy]
    if taken:
        return PreflightCheck("ports", "fail", f"already listening: {', '.join(taken)}", rank)
    return PreflightCheck("ports", "pass", ", ".join(f"{n} {p} free" for n, p in ports.items()), rank)


def check_memory(facts: HostFacts, utilization: float, gpu_memory_gib: float, rank: int) -> PreflightCheck:
    """vLLM's own rule: it refuses to start when free memory is under utilization x the GPU's memory."""
    avail, need = facts.memory.available, utilization * gpu_memory_gib * GIB
    rule = f"{utilization:g} x {gpu_memory_gib:g} GiB = {need / GIB:.2f} GiB"
    if avail is None:
        return PreflightCheck("memory", "warn", f"cannot read MemAvailable on {facts.where}; vLLM needs {rule}", rank)
    if avail < need:
        # MemAvailable already counts the page cache the kernel can reclaim: dropping it would not raise it.
        return PreflightCheck("memory", "fail", f"MemAvailable {avail / GIB:.2f} GiB < {rule}: vLLM would refuse to start; "
                                       "stop other containers or processes using memory to free "
                                       f"{(need - avail) / GIB:.2f} GiB more on {facts.where}", rank)
    return PreflightCheck("memory", "pass", f"MemAvailable {avail / GIB:.2f} GiB >= {rule}", rank)


def host_checks(facts: HostFacts, plan: LaunchPlan, rank: int) -> list[PreflightCheck]:
    """The facts `sparkstack tune` sets, and free memory by vLLM's rule, on one rank."""
    checks = [check_memory(facts, plan.gpu_memory_utilization, plan.recipe.gpu_memory_gib, rank)]
    if facts.swappiness != "0":
        checks.append(PreflightCheck("swappiness", "fail", f"vm.swappiness is {facts.swappiness or 'unreadable'}; set 0 "
                                                  "(`sparkstack tune`)", rank))
    else:
        checks.append(PreflightCheck("swappiness", "pass", "vm.swappiness = 0", rank))
    persisted = facts.persisted_swappiness
    if persisted is None or persisted.value != "0":
        now = "not set at boot" if persisted is None else f"{persisted.value} at boot (from {persisted.file})"
        checks.append(PreflightCheck("swappiness-persisted", "warn", f"vm.swappiness is {now}: a reboot loses 0 "
                                                            "(`sparkstack tune` persists it)", rank))
    else:
        checks.append(PreflightCheck("swappiness-persisted", "pass", f"0 at boot (from {persisted.file})", rank))
    swap = ", ".join(facts.swaps)
    checks.append(PreflightCheck("swap", "pass", f"on: {swap}" if swap else "off", rank))
    if facts.gpus is None:
        checks.append(PreflightCheck("gpu", "warn", f"{facts.gpu_problem}: persistence mode and clock cap unknown", rank))
        return checks
    modes = ", ".join(facts.gpus.persistence)
    on = all(m == "Enabled" for m in facts.gpus.persistence)
    checks.append(PreflightCheck("persistence-mode", "pass" if on else "warn",
                        modes if on else f"{modes}: the clock cap may not hold (`sparkstack tune`)", rank))
    want = plan.recipe.clock_cap
    unmet = facts.clock_cap_unmet(want)
    if unmet is None:
        checks.append(PreflightCheck("clock-cap", "pass", f"{want} MHz, set this boot by sparkstack tune", rank))
    else:
        checks.append(PreflightCheck("clock-cap", "warn", f"{unmet}; the published numbers were measured at {want} "
                                                 "(`sparkstack tune`)", rank))
    return checks


def rank_host_checks(plan: LaunchPlan, runner: Runner, root: Path, rank: int) -> list[PreflightCheck]:
    try:
        return host_checks(read_facts(runner, str(root.absolute())), plan, rank)
    except SparkstackError as exc:
        return [PreflightCheck("host-facts", "fail", f"cannot read the host facts: {exc}", rank)]


def check_disk(path: Path, t: Thresholds, rank: int) -> PreflightCheck:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < t.min_free_disk_gib * GIB:
        return PreflightCheck("disk", "warn", f"{free / GIB:.1f} GiB free under {probe}", rank)
    return PreflightCheck("disk", "pass", f"{free / GIB:.1f} GiB free under {probe}", rank)


# What makes a missing or partial snapshot on the head: the served model is the stripped copy of the fetched one.
SNAPSHOT_REMEDY = {"model": "make it with `sparkstack fetch`, then `sparkstack strip`",
                   "drafter": "fetch it with `sparkstack fetch`"}


def check_snapshot(hub: Path, cache_name: str, revision: str | None, label: str, want_template: bool,
                   serves_mtp_reason: str | None = None) -> list[PreflightCheck]:
    """The snapshot exists and every shard the index names is there, at the size its header implies."""
    if revision is None:
        return [PreflightCheck(f"{label}-snapshot", "fail", f"{ref_file(hub / cache_name)} is missing or unreadable; "
                                                            f"{SNAPSHOT_REMEDY[label]}")]
    state = snapshot_state(hub / cache_name, revision)
    checks = [PreflightCheck(f"{label}-snapshot", "pass" if state.complete else "fail",
                             state.detail + ("" if state.complete else f"; {SNAPSHOT_REMEDY[label]}"))]
    if state.complete and want_template:
        ok = state.has(CHAT_TEMPLATE)
        checks.append(PreflightCheck("chat-template", "pass" if ok else "warn",
                            f"{CHAT_TEMPLATE} present" if ok else f"{CHAT_TEMPLATE} missing: image requests will return 500"))
        snap = snapshot_dir(hub / cache_name, revision)
        config = _read_config(snap)
        strip = _mtp_strip_check(snap, config, state)
        if serves_mtp_reason is not None:
            strip = mtp_served_check(config, strip, serves_mtp_reason)
        checks += [_modelopt_check(snap, config), strip]
    return checks


def _read_config(snap: Path) -> dict | None:
    try:
        config = json.loads((snap / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return config if isinstance(config, dict) else None


def _modelopt_check(snap: Path, config: dict | None) -> PreflightCheck:
    quant = (config or {}).get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    method = method if isinstance(method, str) else ""
    # quant_method is "modelopt" (vLLM's own names add a suffix: modelopt_fp4); older exports only ship hf_quant_config.json.
    if method.lower().startswith("modelopt") or (snap / "hf_quant_config.json").exists():
        return PreflightCheck("quantization", "warn", f"ModelOpt checkpoint (quant_method {method or 'from hf_quant_config.json'}): "
                                             "may emit corrupted token ids (vLLM #54150); the compressed-tensors "
                                             "build avoids it at ~25% lower step rate")
    return PreflightCheck("quantization", "pass", f"quant_method {method}" if method else "not quantized by ModelOpt")


def _mtp_strip_check(snap: Path, config: dict | None, state: SnapshotState) -> PreflightCheck:
    """The served snapshot must be stripped: the loader reads every shard file, so MTP tensors on disk still load."""
    if config is None:
        return PreflightCheck("mtp-strip", "fail", f"{snap / 'config.json'} is missing or not a JSON object")
    left = mtp_levels_left(config)  # strip's own rule
    if left:
        return PreflightCheck("mtp-strip", "fail", f"{'; '.join(left)}, not 0: MTP is not stripped (run `sparkstack strip`)")
    try:
        layers = num_hidden_layers(config).value
        shards = sorted(f for f in state.files if f.endswith(".safetensors"))
        for shard in shards:
            # the names snapshot_state read already; a shard the index does not name is read here
            names = state.tensor_names.get(shard)
            if names is None:
                names = [t.name for t in read_header(snap / shard, shard).tensors]
            keys = mtp_keys(names, layers)
            if keys:
                return PreflightCheck("mtp-strip", "fail", f"{shard} still holds {len(keys)} MTP tensor(s), e.g. {keys[0]} "
                                                  "(the loader reads every shard file; run `sparkstack strip` without --index-only)")
    except SparkstackError as exc:
        return PreflightCheck("mtp-strip", "fail", str(exc))
    return PreflightCheck("mtp-strip", "pass", f"num_nextn_predict_layers = 0, no MTP tensor in {len(shards)} shard(s)")


def mtp_served_check(config: dict | None, strip: PreflightCheck, reason: str) -> PreflightCheck:
    """A recipe that serves its MTP layers on purpose: not stripped is what it asks for. Still a failure when the
    config says 0 MTP layers while shards hold them: then the loader does not skip them and the load fails."""
    if strip.status == "pass":
        return PreflightCheck("mtp-strip", "pass", f"{strip.detail} (the recipe would serve MTP on purpose)")
    left = mtp_levels_left(config) if config is not None else []
    if not left:
        return strip
    return PreflightCheck("mtp-strip", "pass", f"served with its MTP layers on purpose ({'; '.join(left)}): {reason}")


def local_checks(plan: LaunchPlan, host_root: Path, force: bool, environ: dict, t: Thresholds,
                 launching: tuple[int, ...] | None = None) -> list[PreflightCheck]:
    """The recipe's checks, and rank 0's on this host when this launch starts it (`launching`: None is all)."""
    head = plan.ranks[0]
    checks = []
    if plan.recipe.blocked:
        checks.append(PreflightCheck("recipe", "warn" if force else "fail",
                            f"{plan.recipe.name} is blocked: {plan.recipe.blocked_reason}" + (" (--force)" if force else "")))
    else:
        checks.append(PreflightCheck("recipe", "pass", f"{plan.recipe.name} is ok"))
    placeholder_host = KNOB_DEFAULTS["WORKER_SSH"].rpartition("@")[2]  # what README's step 0 has the user replace
    for rank in plan.ranks:
        if rank.ssh is not None and rank.ssh.rpartition("@")[2] == placeholder_host and (
                launching is None or rank.rank in launching):
            checks.append(PreflightCheck("worker-ssh", "warn", f"{rank.ssh} is the shipped placeholder: set WORKER_SSH "
                                                               "to your worker (WORKER_SSH=you@your-worker)", rank.rank))
    if launching is not None and 0 not in launching:  # its host's facts decide nothing about the ranks started
        checks.append(PreflightCheck("head", "skip", "rank 0 is not started by this launch: its NIC, ports, disk and "
                                                     "snapshots are not checked", 0))
    else:
        checks += [
            check_nic(host_root, head.nic, 0),
            check_hca(host_root, head.hca, head.nic, 0),
            check_fabric_ip(host_root, head.fabric_ip, head.nic, 0),
            *([check_master_addr(host_root, plan.knobs["MASTER_ADDR"], head.fabric_ip)] if len(plan.ranks) > 1 else []),
            check_ports(host_root, {"API port": plan.api_port, "master port": int(plan.knobs["MASTER_PORT"])}, 0),
            *rank_host_checks(plan, Runner(), host_root, 0),
            check_disk(Path(head.hub), t, 0),
        ]
        hub = Path(head.hub)
        checks += check_snapshot(hub, plan.knobs["MODEL_CACHE_NAME"], plan.model_revision, "model", want_template=True,
                                 serves_mtp_reason=plan.recipe.serves_mtp_reason)
        if plan.recipe.drafter_cache_knob:
            checks += check_snapshot(hub, plan.knobs[plan.recipe.drafter_cache_knob], plan.drafter_revision, "drafter",
                                     False)
    checks += revision_checks(plan)
    checks.append(kv_check(plan))
    if "VLLM_API_KEY" not in environ:
        checks.append(PreflightCheck("api-key", "warn", "the API binds 0.0.0.0 with no VLLM_API_KEY set: anyone on the network can use it"))
    else:
        checks.append(PreflightCheck("api-key", "pass", "VLLM_API_KEY is passed to the container by name"))
    return checks


def revision_checks(plan: LaunchPlan) -> list[PreflightCheck]:
    """A pinned snapshot is served whatever refs/main says; say so when refs/main names another one."""
    checks = []
    for s in plan.served:
        if not s.pinned:
            continue
        if s.ref_main in (None, s.revision):
            checks.append(PreflightCheck(f"{s.label}-revision", "pass", f"{s.cache_name}: serving the pinned {s.revision[:12]}"))
        else:
            checks.append(PreflightCheck(f"{s.label}-revision", "warn", f"{s.cache_name}: serving the pinned {s.revision[:12]}, but "
                                f"refs/main names {s.ref_main[:12]}: strip and ship follow refs/main (run `sparkstack "
                                "fetch`, and strip again for a stripped entry)"))
    return checks


def worker_snapshot_checks(plan: LaunchPlan, runners: dict[int, Runner]) -> list[PreflightCheck]:
    """Each rank reached over ssh holds the very snapshots the argv names, whole: checked there with its own
    python3, reading only (a rank on this machine shares the head's hub, checked above)."""
    checks = []
    for rank in plan.ranks:
        if rank.ssh is None:
            continue
        runner = runners[rank.rank]
        for s in plan.served:
            if s.revision is None:
                continue  # the head's check names what is missing
            proc = runner.run(probe_argv(rank.hub, s.cache_name, s.revision), timeout=120)
            found = probe_result(proc.stdout) if proc.returncode == 0 else None
            if found is None:
                checks.append(PreflightCheck(f"{s.label}-snapshot", "fail", f"cannot check {s.cache_name} on {runner.label}: "
                                                                   f"{failure_line(proc)}", rank.rank))
                continue
            complete, detail = found
            checks.append(PreflightCheck(f"{s.label}-snapshot", "pass" if complete else "fail",
                                f"{s.cache_name}@{s.revision[:12]}: {detail}" + (
                                    "" if complete else f"; run `sparkstack ship {rank.host}`"), rank.rank))
    return checks


def kv_check(plan: LaunchPlan) -> PreflightCheck:
    kv = plan_launch_kv(plan)
    if kv.page_unification.ok is False:
        return PreflightCheck("kv-plan", "fail", f"KV pages do not unify: {kv.page_unification.reason}")
    if kv.tokens is None:
        return PreflightCheck("kv-plan", "warn", "no KV pin or no measured per-token cost: the pool size is up to the profiler")
    if kv.coverage < 1:  # vLLM refuses a pool that holds no max-model-len sequence (launch refuses it at plan)
        return PreflightCheck("kv-plan", "fail", f"{kv.tokens:,} tokens cover {kv.coverage:.2f}x of max-model-len: "
                                                 "vLLM would refuse to start")
    return PreflightCheck("kv-plan", "pass", f"{kv.tokens:,} tokens = {kv.coverage:.2f}x max-model-len")


HEAD_IMAGE_REMEDY = ("build and load it on this machine: `nix build .#image && sparkstack image load result`, or "
                     "`sparkstack image build --out image ...` then `sparkstack launch ... --image image`")


def _image_check(plan: LaunchPlan, rank: RankPlan, runner: Runner, image_id: str | None, detail: str) -> PreflightCheck:
    """Is the image this plan runs on this rank? With --image LAYOUT its config digest must match exactly."""
    want = plan.image_config_digest
    if image_id is None:
        if want and rank.rank == 0 and plan.image_layout is not None:
            return PreflightCheck("image", "pass", f"{plan.image} not here yet: launch loads it from {plan.image_layout}", 0)
        remedy = f"run `sparkstack ship {rank.host}` on the head" if rank.rank else HEAD_IMAGE_REMEDY
        return PreflightCheck("image", "fail", f"{plan.image} is not present on {runner.label} ({detail}); {remedy}",
                              rank.rank)
    if want and image_id != want:
        ship = f"; run `sparkstack ship {rank.host}`" if rank.rank else ""
        return PreflightCheck("image", "fail", f"{plan.image} on {runner.label} is {image_id[:19]}, not the built "
                                      f"{want[:19]}{ship}", rank.rank)
    return PreflightCheck("image", "pass", f"{plan.image} = {image_id[:19]}", rank.rank)


def docker_checks(plan: LaunchPlan, runners: dict[int, Runner], gates: bool,
                  launching: tuple[int, ...] | None = None) -> list[PreflightCheck]:
    """Per-rank checks that need docker: the image (same config digest everywhere), stale containers, gates.
    `launching`: the ranks this launch starts (None: all). A rank launched alone checks its own name for a stale
    container; each other rank is the peer it joins, which the design card's order (rank 1, then rank 0) expects
    to be running already, on the same image."""
    checks, digests, peers = [], {}, {}
    for rank in plan.ranks:
        r = runners[rank.rank]
        proc = r.run_docker("image", "inspect", "--format", "{{.Id}}", plan.image, timeout=30)
        if docker_answer(proc) == UNREACHABLE:  # nothing is known of this rank: not "image absent"
            checks.append(PreflightCheck("docker", "fail", f"{r.label} unreachable: {unreachable_reason(r, proc)}",
                                         rank.rank))
            continue
        image_id = proc.stdout.strip() if proc.returncode == 0 else None
        if image_id:
            digests[rank.rank] = image_id
        checks.append(_image_check(plan, rank, r, image_id, failure_line(proc)))
        if launching is not None and rank.rank not in launching:
            peers[rank.rank] = r.run_docker("inspect", "--type", "container", "--format", "{{.State.Status}} {{.Image}}",
                                            rank.name, timeout=30)
            continue
        checks.append(stale_container_check(rank, r))
    identity = dict(digests)
    if plan.image_config_digest and 0 not in identity and plan.image_layout is not None:
        identity[0] = plan.image_config_digest  # the head will hold exactly this once launch loads it
    if len(set(identity.values())) > 1:
        detail = ", ".join(f"rank {k}: {v[:19]}" for k, v in sorted(identity.items()))
        checks.append(PreflightCheck("image-identity", "fail", f"ranks run different images ({detail}); ship one image to all"))
    elif len(identity) == len(plan.ranks):
        checks.append(PreflightCheck("image-identity", "pass", f"every rank has {next(iter(identity.values()))[:19]}"))
    expected = next(iter(set(identity.values()))) if len(set(identity.values())) == 1 else None
    for rank_no, proc in sorted(peers.items()):
        checks.append(_peer_check(plan.ranks[rank_no], proc, expected))
    at = gate_rank(launching)
    if gates and at in digests:
        checks += all_gate_checks(plan, runners[at], digests[at])
    return checks


def all_gate_checks(plan: LaunchPlan, runner: Runner, image_id: str | None) -> list[PreflightCheck]:
    """The vLLM argv gate for every rank, then the runtime gates, on `runner`'s copy of the image (`image_id`, its
    config digest: what a pass is remembered by), all in one throwaway container."""
    cache = gate_cache()
    gates = runtime_gates(plan, runner)
    asked = [argv_gate_argv(rank) for rank in plan.ranks] + ([] if isinstance(gates, PreflightCheck) else gates)
    ran = run_gates(runner, plan.image, asked, image_id, cache)  # one container for all that are not cached
    return argv_gate_checks(plan, runner, image_id, cache, ran) + gate_checks(plan, runner, image_id, cache, gates, ran)


STALE_FORMAT = '{{.State}} {{.Label "org.sparkstack.rank"}}'  # `docker ps`: empty when no container has the name


def stale_container_check(rank: RankPlan, runner: Runner) -> PreflightCheck:
    """A container already named as this rank. One sparkstack started for this rank (its rank label) and not
    running is left from an earlier run: launch removes it before the rank starts, as the seed's `docker rm -f`
    did (a warn, said). A running one is refused: it may serve, and `launch N stop` is the deliberate way. One
    without the label is not ours: refused, named, never removed."""
    proc = runner.run_docker("ps", "-a", "--filter", f"name=^{rank.name}$", "--format", STALE_FORMAT, timeout=30)
    if proc.returncode == 0 and not proc.stdout.strip():
        return PreflightCheck("stale-container", "pass", f"no container named {rank.name}", rank.rank)
    if proc.returncode != 0:
        return PreflightCheck("stale-container", "fail", f"cannot ask {runner.label} for {rank.name}: "
                                                         f"{unreachable_reason(runner, proc)}", rank.rank)
    state, _, label = proc.stdout.strip().splitlines()[0].partition(" ")
    if label != str(rank.rank):
        return PreflightCheck("stale-container", "fail", f"a container named {rank.name} ({state}) on {runner.label} was "
                                                         f"not started by sparkstack as rank {rank.rank} (label "
                                                         f"org.sparkstack.rank={label if label not in ('', '<no value>') else 'absent'}); "
                                                         f"remove or rename it yourself", rank.rank)
    if state == "running":
        return PreflightCheck("stale-container", "fail", f"{rank.name} is running already on {runner.label}; stop it "
                                                         f"first: `sparkstack launch {rank.rank} stop`", rank.rank)
    return PreflightCheck("stale-container", "warn", f"{rank.name} ({state}) is left from an earlier launch: removed "
                                                     f"before rank {rank.rank} starts", rank.rank)


def gate_rank(launching: tuple[int, ...] | None) -> int:
    """Where the gates run: on the head, unless this launch starts workers only (`launch 1`, before the head):
    then on the first of them, which holds the image already (ship loaded it), so the head is not touched."""
    return 0 if not launching or 0 in launching else min(launching)


def _peer_check(rank: RankPlan, proc, image: str | None) -> PreflightCheck:
    """A rank this launch does not start, but meets at the rendezvous. The design card's order is the workers
    first, then the head: a worker launched before the head waits for it; a head launched alone needs its
    workers running already, on its image."""
    said = proc.stdout.split() if proc.returncode == 0 else []
    if docker_answer(proc) == UNREACHABLE:  # only docker's own "no such container" means there is none
        return PreflightCheck("peer", "warn", f"cannot tell whether {rank.name} runs: {failure_line(proc)}", rank.rank)
    restart = ("`sparkstack launch stop`, then the workers (`sparkstack launch 1` ...), then `sparkstack launch 0`")
    if rank.rank == 0:  # a worker launched alone
        if len(said) != 2:
            return PreflightCheck("peer", "pass", f"no container {rank.name} yet: the head starts next (`sparkstack launch 0`), "
                                         "and the rank(s) launched now wait for it at the rendezvous", rank.rank)
        return PreflightCheck("peer", "warn", f"{rank.name} is {said[0]} already: a worker joins the head only while the head "
                                     f"waits at the rendezvous; if it serves already, {restart}", rank.rank)
    # A head launched before its workers is not wrong (vLLM's rendezvous waits for them), only out of the order:
    # said, not refused.
    if len(said) != 2:
        return PreflightCheck("peer", "warn", f"no container {rank.name}: the head waits for it at the rendezvous until its "
                                     f"boot times out; the order is the workers first (`sparkstack launch {rank.rank}`)",
                     rank.rank)
    state, running_image = said
    if state != "running":
        return PreflightCheck("peer", "warn", f"{rank.name} is {state}: the head waits for it at the rendezvous; {restart}",
                     rank.rank)
    if image is not None and running_image != image:
        return PreflightCheck("peer", "fail", f"{rank.name} runs image {running_image[:19]}, this launch {image[:19]}: "
                                     f"ranks on different images; {restart}, after shipping one image to all",
                     rank.rank)
    return PreflightCheck("peer", "pass", f"{rank.name} is running{f' on {image[:19]}' if image else ''}: this launch joins it",
                 rank.rank)


Ran = tuple[int | None, str, str]  # a gate's (exit code, stdout, stderr); None and its cached line when it is not run


def argv_gate_argv(rank: RankPlan) -> tuple[str, ...]:
    """The argv gate for one rank, as a pass of it is kept (gatecache's key: the script's text and the engine argv)."""
    return ("python3", "-c", ARGV_GATE, *rank.engine_argv)


def run_gates(runner: Runner, image: str, argvs: Sequence[Sequence[str]], image_id: str | None,
              cache: GateCache | None) -> dict[tuple[str, ...], Ran]:
    """Each gate's answer. The ones this image passed before with this very argv come from the cache (gatecache);
    the rest run together in one throwaway container, one python process, so the image's vLLM is imported once
    (argv_gate.batch) rather than once per gate: on a Spark each import is tens of seconds."""
    out: dict[tuple[str, ...], Ran] = {}
    pending = []
    for argv in map(tuple, argvs):
        passed = cache.passed(image_id, argv) if cache is not None and image_id else None
        if passed:
            out[argv] = (None, cached_line(passed, image_id), "")
        elif argv not in pending:
            pending.append(argv)
    if not pending:
        return out
    answers, ran = _batch(runner, image, pending)
    if answers is None and len(pending) > 1:  # the batch broke: each gate alone, so the one that broke it is named
        answers = []
        for argv in pending:
            alone, ran = _batch(runner, image, [argv])
            answers.append(alone[0] if alone else _failure(ran))
    out.update(zip(pending, answers or [_failure(ran)]))
    return out


def _batch(runner: Runner, image: str, gates: list[tuple[str, ...]]) -> tuple[list[Ran] | None, subprocess.CompletedProcess]:
    """`gates` run together in one container (argv_gate's batch): their answers in order, or None when the batch
    gave no well-formed answer for each; and the container's run."""
    judged = [a for a in gates if a[:3] == ("python3", "-c", ARGV_GATE)]
    others = [a for a in gates if a not in judged]
    spec = {"argvs": [list(a[3:]) for a in judged], "gates": [list(a) for a in others]}
    ran = runner.run_docker("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", ARGV_GATE,
                            argv_gate.BATCH, json.dumps(spec), timeout=300 + 60 * len(gates))
    said = [ln for ln in ran.stdout.splitlines() if ln.startswith(argv_gate.RESULT)]
    try:
        doc = json.loads(said[-1][len(argv_gate.RESULT):]) if ran.returncode == 0 and said else {}
        argvs, rest = doc["argvs"], doc["gates"]
    except (TypeError, ValueError, KeyError, RecursionError):
        return None, ran
    shaped = (isinstance(argvs, list) and isinstance(rest, list) and len(argvs) == len(judged) and len(rest) == len(others)
              and all(_shaped(a, 2) for a in argvs) and all(_shaped(g, 3) for g in rest))
    if not shaped:
        return None, ran
    by_argv = dict(zip(judged, [(code, line + "\n", "") for code, line in argvs]))
    by_argv.update(zip(others, [tuple(g) for g in rest]))
    return [by_argv[a] for a in gates], ran


def _failure(ran: subprocess.CompletedProcess) -> Ran:
    """A gate whose container gave no answer: its failure, as the container ended."""
    printed = [ln for ln in ran.stdout.splitlines() if ln.strip()]
    why = ran.stderr if ran.stderr.strip() else \
        f"no result line from the gates' python{f' (it printed: {printed[-1][:120]})' if printed else ''}\n"
    return (ran.returncode or 1, "", why)


def _shaped(answer, strings: int) -> bool:
    """[int code, str, ...]: `strings` fields in all, the code a true int (not a bool, not null)."""
    return (isinstance(answer, list) and len(answer) == strings and type(answer[0]) is int
            and all(isinstance(x, str) for x in answer[1:]))


def argv_gate_checks(plan: LaunchPlan, runner: Runner, image_id: str | None = None,
                     cache: GateCache | None = None, ran: dict[tuple[str, ...], Ran] | None = None) -> list[PreflightCheck]:
    """Each rank's engine argv, judged in a throwaway container by the image's own vLLM parser (ARGV_GATE): seconds,
    no GPU, before a boot that takes 15 minutes. Every rank runs the one image, so the head judges them all. With
    `cache`, a pass is remembered for this image (`image_id`) and argv, and not asked again. `ran`: the answers
    already had (all_gate_checks asks every gate at once)."""
    argvs = [argv_gate_argv(rank) for rank in plan.ranks]
    ran = ran if ran is not None else run_gates(runner, plan.image, argvs, image_id, cache)
    out = []
    for rank, argv in zip(plan.ranks, argvs):
        code, stdout, stderr = ran[argv]
        if code is None:
            out.append(PreflightCheck("vllm-argv", "pass", stdout, rank.rank))
            continue
        said = stdout.strip().splitlines()
        line = said[-1] if said else failure_line(subprocess.CompletedProcess(argv, code, stdout, stderr))
        out.append(PreflightCheck("vllm-argv", "pass" if code == 0 else "fail",
                         line if code in (0, 1, 2) and said else f"the argv gate did not run: {line}",
                         rank.rank))
        if code == 0 and cache is not None and image_id:
            cache.record(image_id, argv, line)
    return out


def _gates_from_label(label: str) -> list[tuple[str, ...]] | None:
    """The image's runtime gates, or None when the label is not a JSON list of non-empty string lists."""
    try:
        doc = json.loads(label)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, list) or not all(
            isinstance(g, list) and g and all(isinstance(a, str) and a for a in g) for g in doc):
        return None
    return [tuple(g) for g in doc]


def runtime_gates(plan: LaunchPlan, runner: Runner) -> list[tuple[str, ...]] | PreflightCheck:
    """The image's runtime gates (its label, else the overlay's defaults) and those its argv asks for; a failed
    check when the label is not a list of argv lists (then nothing it names runs)."""
    proc = runner.run_docker("image", "inspect", "--format", '{{index .Config.Labels "org.sparkstack.gates.runtime"}}',
                             plan.image, timeout=30)
    label = proc.stdout.strip() if proc.returncode == 0 else ""
    gates = _gates_from_label(label) if label else list(DEFAULT_GATES)
    if gates is None:
        return PreflightCheck("gate", "fail", f"{plan.image}: label org.sparkstack.gates.runtime is not a list of argv lists "
                                      "of strings; refusing to run it", 0)
    return gates + [g for g in load_format_gates(plan) if g not in gates]


def gate_checks(plan: LaunchPlan, runner: Runner, image_id: str | None = None,
                cache: GateCache | None = None, gates: list[tuple[str, ...]] | PreflightCheck | None = None,
                ran: dict[tuple[str, ...], Ran] | None = None) -> list[PreflightCheck]:
    """The runtime gates' checks, one per gate. `gates` and `ran`: as all_gate_checks had them already."""
    gates = gates if gates is not None else runtime_gates(plan, runner)
    if isinstance(gates, PreflightCheck):
        return [gates]
    ran = ran if ran is not None else run_gates(runner, plan.image, gates, image_id, cache)
    out = []
    for gate in gates:
        code, stdout, stderr = ran[tuple(gate)]
        label = gate[-1][:60]
        if code is None:
            out.append(PreflightCheck("gate", "pass", stdout, 0))
            continue
        done = subprocess.CompletedProcess(gate, code, stdout, stderr)
        out.append(PreflightCheck("gate", "pass" if code == 0 else "fail",
                         label if code == 0 else f"{label}: {failure_line(done)}", 0))
        if code == 0 and cache is not None and image_id:
            cache.record(image_id, gate, label)
    return out


def reach_checks(plan: LaunchPlan, runners: dict[int, Runner]) -> list[PreflightCheck]:
    """Each rank reached over ssh answers `true` first; the one that does not is one fail line, and is asked
    nothing more (`fail  [rank 1 on me@w] ssh: me@w unreachable: ssh to me@w failed (...)`)."""
    checks = []
    for rank in plan.ranks:
        if rank.ssh is None:
            continue
        runner = runners[rank.rank]
        proc = runner.run(["true"], timeout=runner.connect_timeout_s + 20)
        if proc.returncode != 0:
            checks.append(PreflightCheck("ssh", "fail", f"{runner.label} unreachable: {unreachable_reason(runner, proc)}",
                                         rank.rank))
    return checks


def run_preflight(plan: LaunchPlan, host_root: Path, runners: dict[int, Runner] | None, force: bool, gates: bool,
                  environ: dict, thresholds: Thresholds = Thresholds(),
                  on_check: Callable[[PreflightCheck], None] | None = None, dry_run: bool = False,
                  launching: tuple[int, ...] | None = None) -> list[PreflightCheck]:
    """Under `dry_run`, runners may only be asked read-only questions: the gates, which start a container, are skipped."""
    checks = local_checks(plan, host_root, force, environ, thresholds, launching)
    labels = {rank.rank: rank.ssh or "local" for rank in plan.ranks}  # as its runner names it
    if runners is not None:
        checks += reach_checks(plan, runners)
        if any(c.name == "ssh" and c.status == "fail" for c in checks):
            # one line for a worker that does not answer, not one ConnectTimeout per question asked of it
            dead = {c.rank for c in checks if c.name == "ssh" and c.status == "fail"}
            plan = dataclasses.replace(plan, ranks=tuple(r for r in plan.ranks if r.rank not in dead))
        for rank in plan.ranks[1:]:
            checks += rank_host_checks(plan, runners[rank.rank], host_root, rank.rank)
        checks += worker_fabric_checks(plan, runners, host_root)
        checks += worker_snapshot_checks(plan, runners)
        checks += docker_checks(plan, runners, gates and not dry_run, launching)
        if gates and not dry_run and not any(c.name in ("gate", "vllm-argv") for c in checks):
            checks.append(PreflightCheck("gate", "skip", f"the head does not hold {plan.image} yet: the gates run once launch "
                                                "has loaded it, before any rank starts", 0))
        if gates and dry_run:
            checks.append(PreflightCheck("gate", "skip", "the runtime gates and the vLLM argv gate start a throwaway container: "
                                                "not under --dry-run", 0))
    else:
        checks.append(PreflightCheck("image", "skip", "docker checks: a dry run asks no docker "
                                                      "(`sparkstack launch ... --dry-run --probe` does)"))
    checks = [dataclasses.replace(c, host=labels.get(c.rank, "")) if c.rank is not None and not c.host else c
              for c in checks]
    if on_check:
        for c in checks:
            on_check(c)
    return checks


def context_refusal(plan: LaunchPlan, environ) -> str | None:
    """The one line refusing a max-model-len past the served model's context (its config.json's
    max_position_embeddings), which vLLM refuses at start; None when within it, or when the head's snapshot is not
    here to read (then the KV check is the bound). A config with rope_scaling is left to vLLM: it may stretch it."""
    from sparkstack.launch.kv import kv_inputs

    entry = Path(plan.ranks[0].hub) / plan.knobs["MODEL_CACHE_NAME"]
    revision = plan.model_revision
    if revision is None:
        try:
            revision = ref_file(entry).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
    snap = snapshot_dir(entry, revision)
    config = _read_config(snap) if revision and "/" not in revision else None
    limit = (config or {}).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or (config or {}).get("rope_scaling"):
        return None
    asked = kv_inputs(plan).max_model_len
    if asked <= limit:
        return None
    given = f"MAX_MODEL_LEN={environ['MAX_MODEL_LEN']}" if environ.get("MAX_MODEL_LEN") else f"--max-model-len {asked}"
    return (f"{given}: past the model's context, max_position_embeddings {limit:,} in {snap / 'config.json'}: vLLM "
            f"refuses a longer max-model-len at start; use at most {limit:,}")

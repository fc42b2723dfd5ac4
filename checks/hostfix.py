"""Fake host roots (/sys, /proc) and HF caches for launch's preflight and the lab's launch tests."""

import shutil
from pathlib import Path

import synth

NIC, HCA = "enp1s0f1np1", "rocep1s0f1"
MODEL_CACHE, DRAFT_CACHE = "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP", "models--incoai--GLM-5.3-Flash-DFlash2"
# Both ranks' fabric addresses: in the unit tests the ssh stand-in runs the worker's reads here, on this same tree,
# so it stands for both machines (the lab gives each its own: checks/lab/test_fabric_lab.py).
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 10.0.0.0/24 2 0 2
        |-- 10.0.0.1
           /32 host LOCAL
        |-- 10.0.0.2
           /32 host LOCAL
  +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
"""
ROUTE = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
         f"{NIC}\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


BOOT_ID = "5f0c7c2e-3d1b-4c55-9a8e-0d6f2a9b1c11"
MEMINFO = {"MemTotal": 127000000, "MemFree": 118000000, "MemAvailable": 120000000, "Buffers": 100000,
           "Cached": 900000, "Shmem": 200000}  # kB


def meminfo(**kib: int) -> str:
    return "".join(f"{k + ':':<16}{v:>9} kB\n" for k, v in {**MEMINFO, **kib}.items())


def write_host(root: Path, tuned: bool = True) -> Path:
    """A healthy Spark head, as far as /sys, /proc, /etc/sysctl.d and /run tell; `tuned=False`: one that
    `sparkstack tune` has not seen (swappiness 60 and not persisted, no clock cap recorded)."""
    (root / f"sys/class/net/{NIC}").mkdir(parents=True)
    (root / f"sys/class/net/{NIC}/operstate").write_text("up\n")
    (root / f"sys/class/infiniband/{HCA}/device/net/{NIC}").mkdir(parents=True)
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/fib_trie").write_text(FIB_TRIE)
    (root / "proc/net/route").write_text(ROUTE)
    (root / "proc/net/tcp").write_text(TCP_HEADER)
    (root / "proc/meminfo").write_text(meminfo())
    (root / "proc/swaps").write_text("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n")
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/swappiness").write_text("0\n" if tuned else "60\n")
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text(BOOT_ID + "\n")
    (root / "etc/sysctl.d").mkdir(parents=True)
    if tuned:  # swappiness persisted by the admin's own file; the clock cap recorded as tune records it (docs/commands/tune.md)
        (root / "etc/sysctl.d/60-swappiness.conf").write_text("vm.swappiness=0\n")
        (root / "run/sparkstack").mkdir(parents=True)
        (root / "run/sparkstack/clock-cap").write_text(f"# cap\nclock_cap=0,2000\nboot_id={BOOT_ID}\n")
    return root


def write_hub(home: Path) -> Path:
    """The cache entries launch serves. The model entry is stripped: no tensor synth declares MTP, no MTP layer."""
    flat = home / "flat"
    stripped = {name: [s for s in specs if not s.mtp] for name, specs in synth.DEFAULT_SHARDS.items()}
    config = synth.base_config(True)
    for level in (config, config["text_config"]):
        level.update(num_nextn_predict_layers=0, index_share_for_mtp_iteration=False)
    synth.write_model_dir(flat, shards={name: specs for name, specs in stripped.items() if specs}, config=config)
    synth.cache_from_dir(flat, home / "hub", repo_id="LibertAIDAI/GLM-5.3-Flash-NVFP4-no-MTP")
    dflat = home / "dflat"
    synth.write_model_dir(dflat, index=False, shards={"model.safetensors": synth.DEFAULT_SHARDS["model-00001-of-00003.safetensors"]})
    synth.cache_from_dir(dflat, home / "hub", repo_id="incoai/GLM-5.3-Flash-DFlash2")
    shutil.rmtree(flat)
    shutil.rmtree(dflat)
    return home

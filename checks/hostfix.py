"""Fake host roots (/sys, /proc) and HF caches for launch's preflight and the lab's launch tests."""

import shutil
from pathlib import Path

import synth

NIC, HCA = "enp1s0f1np1", "rocep1s0f1"
MODEL_CACHE, DRAFT_CACHE = "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP", "models--incoai--GLM-5.3-Flash-DFlash2"
FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 10.0.0.0/24 2 0 2
        |-- 10.0.0.1
           /32 host LOCAL
  +-- 127.0.0.0/8 2 0 2
        |-- 127.0.0.1
           /32 host LOCAL
"""
ROUTE = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
         f"{NIC}\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def write_host(root: Path) -> Path:
    """A healthy Spark head, as far as /sys and /proc tell."""
    (root / f"sys/class/net/{NIC}").mkdir(parents=True)
    (root / f"sys/class/net/{NIC}/operstate").write_text("up\n")
    (root / f"sys/class/infiniband/{HCA}/device/net/{NIC}").mkdir(parents=True)
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/fib_trie").write_text(FIB_TRIE)
    (root / "proc/net/route").write_text(ROUTE)
    (root / "proc/net/tcp").write_text(TCP_HEADER)
    (root / "proc/meminfo").write_text("MemTotal:       127000000 kB\nMemAvailable:   120000000 kB\n")
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/swappiness").write_text("0\n")
    return root


def write_hub(home: Path) -> Path:
    flat = home / "flat"
    synth.write_model_dir(flat)
    synth.cache_from_dir(flat, home / "hub", repo_id="LibertAIDAI/GLM-5.3-Flash-NVFP4-no-MTP")
    dflat = home / "dflat"
    synth.write_model_dir(dflat, index=False, shards={"model.safetensors": synth.DEFAULT_SHARDS["model-00001-of-00003.safetensors"]})
    synth.cache_from_dir(dflat, home / "hub", repo_id="incoai/GLM-5.3-Flash-DFlash2")
    shutil.rmtree(flat)
    shutil.rmtree(dflat)
    return home

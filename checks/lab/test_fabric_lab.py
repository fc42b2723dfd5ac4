"""The worker's fabric, checked over its real sshd as the head's is checked here: its veth set down, renamed, or
given the wrong address, each found by preflight as a one-line verdict on rank 1. The lab is shared by every lab
test of the session: each change is undone before the test ends.

The host root both ranks read is the lab's prepared one (tune's facts) with the live kernel's views linked in:
`sys/class/net` and `proc/net/{fib_trie,route}` name what the reading machine sees (the head here, the worker over
ssh, each in its own namespace), and the RDMA device's `device/net` is the machine's virtual netdevs (the lab has
no RDMA device; a veth is what stands for the CX7 port)."""

import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from hostfix import HCA, write_host
from lab import FABRIC_IF

RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"
RENAMED = "enp1s0f9np9"


@pytest.fixture(scope="module")
def fabric_world(lab, tmp_path_factory):
    work = tmp_path_factory.mktemp("fabric")
    root = write_host(work / "hostroot")
    (root / "sys/class/net").rename(work / "fake-net")
    (root / "sys/class/net").symlink_to("/sys/class/net")
    for name in ("fib_trie", "route"):
        (root / "proc/net" / name).unlink()
        (root / "proc/net" / name).symlink_to(f"/proc/net/{name}")
    device = root / f"sys/class/infiniband/{HCA}/device"
    (device / "net" / FABRIC_IF).rmdir()
    (device / "net").rmdir()
    device.rmdir()
    device.symlink_to("/sys/devices/virtual")  # its net/ lists the machine's virtual netdevs by their current names
    text = RECIPE.read_text()
    nodes = (f'[[nodes]]\nhost = "head"\nfabric_ip = "10.0.0.1"\ndocker_host = "{lab.head.dockerd.host}"\n\n'
             f'[[nodes]]\nhost = "worker"\nssh = "worker"\nfabric_ip = "10.0.0.2"\n'
             f'docker_host = "{lab.worker.dockerd.host}"\n\n')
    text = text[:text.index("[[nodes]]")] + nodes + text[text.index("# KV geometry"):]
    recipe = work / "recipe.toml"
    recipe.write_text(text)
    return lab, root, recipe, work


def preflight(world) -> dict:
    lab, root, recipe, work = world
    proc = lab.head.run(sys.executable, "-m", "sparkstack.cli", "launch", "all", "--dry-run", "--probe", "--json",
                        "--recipe", str(recipe), "--profile", "lab", "--host-root", str(root), "--ssh-config",
                        str(lab.ssh_config), check=False, timeout=300,
                        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HF_HOME": str(work / "hf"),
                             "HOME": str(work), "SPARKSTACK_STATE_DIR": str(work / "state")})
    assert "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    return {(c["check"], c["rank"]): c for c in doc["preflight"] if c["check"] in ("nic", "hca", "fabric-ip", "fabric")}


@contextmanager
def worker_link(lab, *steps):
    """Run `ip` steps on the worker's fabric veth, and put it back as the lab made it afterwards."""
    w = lab.worker
    try:
        for step in steps:
            w.run("ip", *step)
        yield
    finally:
        names = w.run("ip", "-o", "link", "show").stdout
        if RENAMED in names:
            w.run("ip", "link", "set", RENAMED, "down")
            w.run("ip", "link", "set", RENAMED, "name", FABRIC_IF)
        addrs = w.run("ip", "-o", "-4", "addr", "show", "dev", FABRIC_IF).stdout
        for word in addrs.split():
            if word.startswith("10.0.0.") and word != f"{w.fabric_ip}/24":
                w.run("ip", "addr", "del", word, "dev", FABRIC_IF)
        if f"{w.fabric_ip}/24" not in addrs:
            w.run("ip", "addr", "add", f"{w.fabric_ip}/24", "dev", FABRIC_IF)
        w.run("ip", "link", "set", FABRIC_IF, "up")


def statuses(checks: dict, rank: int) -> dict:
    return {name: c["status"] for (name, r), c in checks.items() if r == rank}


def test_a_healthy_worker_passes_the_heads_fabric_checks(fabric_world):
    checks = preflight(fabric_world)
    assert statuses(checks, 0) == {"nic": "pass", "hca": "pass", "fabric-ip": "pass"}, checks
    assert statuses(checks, 1) == {"nic": "pass", "hca": "pass", "fabric-ip": "pass"}, checks
    assert checks[("fabric-ip", 1)]["detail"] == f"10.0.0.2 on {FABRIC_IF}"
    assert checks[("hca", 1)]["detail"] == f"{HCA} <-> {FABRIC_IF}"


def test_a_worker_port_set_down_fails_on_rank_1(fabric_world):
    lab = fabric_world[0]
    with worker_link(lab, ("link", "set", FABRIC_IF, "down")):
        checks = preflight(fabric_world)
    assert checks[("nic", 1)]["status"] == "fail"
    assert checks[("nic", 1)]["detail"] == (f"{FABRIC_IF} operstate is 'down', not 'up'; check its cable, then "
                                            f"`ip link set {FABRIC_IF} up`")
    assert preflight(fabric_world)[("nic", 1)]["status"] == "pass"  # put back


def test_a_renamed_worker_port_fails_nic_hca_and_address_on_rank_1(fabric_world):
    lab = fabric_world[0]
    with worker_link(lab, ("link", "set", FABRIC_IF, "down"), ("link", "set", FABRIC_IF, "name", RENAMED),
                     ("link", "set", RENAMED, "up")):
        checks = preflight(fabric_world)
    assert statuses(checks, 1) == {"nic": "fail", "hca": "fail", "fabric-ip": "fail"}, checks
    assert checks[("nic", 1)]["detail"].startswith(f"{FABRIC_IF} does not exist (have: ")
    assert RENAMED in checks[("nic", 1)]["detail"] and RENAMED in checks[("hca", 1)]["detail"]
    assert checks[("fabric-ip", 1)]["detail"] == (f"10.0.0.2 is local but its subnet is not on {FABRIC_IF}; the fabric "
                                                  f"address belongs on the fabric port (`ip -4 route show dev {FABRIC_IF}`)")
    assert statuses(checks, 0)["hca"] == "pass"  # the head's own port kept its name


def test_a_worker_port_with_the_wrong_address_fails_on_rank_1(fabric_world):
    lab = fabric_world[0]
    with worker_link(lab, ("addr", "del", "10.0.0.2/24", "dev", FABRIC_IF),
                     ("addr", "add", "10.0.0.9/24", "dev", FABRIC_IF)):
        checks = preflight(fabric_world)
    assert checks[("fabric-ip", 1)]["status"] == "fail"
    assert checks[("fabric-ip", 1)]["detail"] == (f"10.0.0.2 is not an address of this host; set fabric_ip of this "
                                                  f"rank's [[nodes]] to its address on {FABRIC_IF} "
                                                  f"(`ip -4 addr show {FABRIC_IF}`)")
    assert statuses(checks, 1)["nic"] == "pass" and statuses(checks, 0) == {"nic": "pass", "hca": "pass",
                                                                          "fabric-ip": "pass"}
    assert preflight(fabric_world)[("fabric-ip", 1)]["status"] == "pass"  # put back

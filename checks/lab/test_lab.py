"""The two-host lab itself: real dockerd, sshd, rsync and podman between network namespaces."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from clirun import start
from conftest import require
from lab import FABRIC, FABRIC_IF, lab_leftovers, state_dir

HERE = Path(__file__).parent


def test_both_hosts_load_the_standin_image(lab_with_image):
    lab, result = lab_with_image
    for host in lab.hosts.values():
        got = host.docker("image", "inspect", "--format", "{{.Id}}", result["name"]).stdout.strip()
        assert got == result["config_digest"], host.name


@pytest.fixture
def podman_store():
    store = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))  # podman wants a runroot under 50 characters
    yield ["podman", "--root", str(store / "r"), "--runroot", str(store / "rr"), "--storage-driver", "vfs",
           "--events-backend", "file", "--cgroup-manager", "cgroupfs"]
    subprocess.run(["rm", "-rf", str(store)])


def test_podman_loads_the_standin_image(standin_image, podman_store):
    require("podman")
    tar, result = standin_image
    p = subprocess.run(podman_store + ["load", "-i", str(tar)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(podman_store + ["image", "inspect", "--format", "{{.Id}}", result["name"]], capture_output=True, text=True)
    assert "sha256:" + p.stdout.strip() == result["config_digest"]


PROBE = ("import socket; print(open('/sys/class/net/{nic}/operstate').read().strip()); "
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('{peer}', 9)); print(s.getsockname()[0])")


@pytest.mark.parametrize("name, peer", [("head", "worker"), ("worker", "head")])
def test_container_sees_its_hosts_fabric_nic(lab_with_image, name, peer):
    lab, result = lab_with_image
    host = lab.hosts[name]
    out = host.docker("run", "--rm", "--pull", "never", "--network", "host", "--entrypoint", "python3",
                      result["name"], "-c", PROBE.format(nic=FABRIC_IF, peer=FABRIC[peer])).stdout.split()
    assert out == ["up", FABRIC[name]]


def test_ssh_to_worker_with_strict_host_keys(lab):
    assert lab.ssh("cat", "/proc/sys/kernel/hostname").returncode == 0
    # The worker answers inside its own namespace: its fabric address is there.
    assert FABRIC["worker"] in lab.ssh("cat", "/proc/net/fib_trie").stdout
    # A wrong host key in known_hosts is refused.
    bad = lab.ssh_dir / "bad_config"
    wrong_known = lab.ssh_dir / "wrong_known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(lab.ssh_dir / "other_key")], check=True)
    pub = (lab.ssh_dir / "other_key.pub").read_text().split()
    wrong_known.write_text(f"{lab.worker.mgmt_ip} {pub[0]} {pub[1]}\n")
    bad.write_text(lab.ssh_config.read_text().replace(str(lab.ssh_dir / "known_hosts"), str(wrong_known)))
    proc = lab.ssh("true", check=False, config=bad)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr


def test_the_worker_is_a_machine_of_its_own(lab):
    """No sparkstack there, its own HOME (a size-limited tmpfs the head cannot see into), sshd on the fabric too."""
    proc = lab.ssh("python3", "-c", "import sparkstack", check=False)
    assert proc.returncode != 0 and "No module named 'sparkstack'" in proc.stderr
    marker = Path.home() / f".sparkstack-lab-{lab.tag}"
    marker.write_text("written on the head\n")
    try:
        assert lab.ssh("test", "-e", str(marker), check=False).returncode == 1
        assert lab.ssh("printenv", "HOME").stdout.strip() == "/root"
        fs = lab.ssh("stat", "-f", "-c", "%T %b %S", "/root").stdout.split()
        assert fs[0] == "tmpfs" and int(fs[1]) * int(fs[2]) == lab.worker.home_mib << 20
        lab.ssh("sh", "-c", "echo mine > /root/only-here")
        assert not (Path.home() / "only-here").exists() or (Path.home() / "only-here").read_text() != "mine\n"
    finally:
        marker.unlink()
    # The same host key answers on the fabric address, checked under the management name (HostKeyAlias).
    proc = lab.head.run("ssh", "-F", str(lab.ssh_config), "-o", f"HostName={FABRIC['worker']}",
                        "-o", f"HostKeyAlias={lab.worker.mgmt_ip}", "worker", "cat /proc/net/fib_trie", check=False)
    assert proc.returncode == 0, proc.stderr
    assert FABRIC["worker"] in proc.stdout


def test_rsync_copies_a_tree_and_a_second_run_sends_nothing(lab):
    src = lab.root / "rsync-src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(os.urandom(1 << 20))
    (src / "sub" / "b.txt").write_text("hello\n")
    dst = lab.root / "rsync-dst" / "deep"
    rsh = f"ssh -F {lab.ssh_config}"
    cmd = ["rsync", "-a", "--mkpath", "--itemize-changes", "-e", rsh, f"{src}/", f"worker:{dst}/"]
    first = lab.head.run(*cmd)
    assert "a.bin" in first.stdout and "sub/b.txt" in first.stdout
    theirs = lab.ssh("sha256sum", str(dst / "a.bin"), str(dst / "sub" / "b.txt")).stdout.split()
    import hashlib
    assert theirs[0] == hashlib.sha256((src / "a.bin").read_bytes()).hexdigest()
    assert theirs[2] == hashlib.sha256(b"hello\n").hexdigest()
    second = lab.head.run(*cmd)
    assert second.stdout.strip() == ""


def test_fabric_down_leaves_management_ssh_working(lab):
    lab.head.run("ip", "link", "set", FABRIC_IF, "down")
    try:
        state = lab.head.run("cat", f"/sys/class/net/{FABRIC_IF}/operstate").stdout.strip()
        assert state == "down"
        assert lab.ssh("true").returncode == 0
        ping = lab.head.run(sys.executable, "-c", f"import socket; socket.create_connection(('{FABRIC['worker']}', 22), 2)",
                            check=False)
        assert ping.returncode != 0  # the fabric really is down
    finally:
        lab.head.run("ip", "link", "set", FABRIC_IF, "up")
        deadline = time.monotonic() + 10
        while lab.head.run("cat", f"/sys/class/net/{FABRIC_IF}/operstate").stdout.strip() != "up":
            assert time.monotonic() < deadline, "fabric did not come back up"
            time.sleep(0.1)


def _http(lab, code: str) -> subprocess.CompletedProcess:
    """Run a client snippet on the head, where the engine's port is."""
    return lab.head.run(sys.executable, "-c", code, check=False)


def test_standin_engine_serves_health_metrics_and_chat(lab_with_image):
    lab, result = lab_with_image
    record = lab.root / "standin-record"
    record.mkdir(exist_ok=True)
    name = "standin-probe"
    lab.head.docker("run", "-d", "--name", name, "--pull", "never", "--network", "host",
                    "-e", "STANDIN_HEALTH_DELAY=1", "-e", "STANDIN_RECORD=/rec/record.json", "-v", f"{record}:/rec",
                    result["name"], "/models/x", "--port", "18888", "--served-model-name", "test/model",
                    "--speculative-config", '{"method":"dflash","model":"/d","num_speculative_tokens":4}')
    try:
        code = r'''
import json, time, requests
from prometheus_client.parser import text_string_to_metric_families
base = "http://127.0.0.1:18888"
deadline = time.time() + 30
while True:
    try:
        if requests.get(base + "/health", timeout=1).status_code == 200:
            break
    except requests.ConnectionError:
        pass
    assert time.time() < deadline, "never healthy"
    time.sleep(0.2)
r = requests.post(base + "/v1/chat/completions", json={"model": "test/model", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 1000}, stream=True, timeout=10)
chunks = [json.loads(l[6:]) for l in r.iter_lines(decode_unicode=True) if l.startswith("data: ") and l != "data: [DONE]"]
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
fams = {f.name: f for f in text_string_to_metric_families(requests.get(base + "/metrics", timeout=5).text)}
drafts = [s.value for s in fams["vllm:spec_decode_num_drafts"].samples if s.name.endswith("_total")][0]
pos = sorted(s.labels["position"] for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples if s.name.endswith("_total"))
print(json.dumps({"text": text, "drafts": drafts, "positions": pos}))
'''
        proc = _http(lab, code)
        logs = lab.head.docker("logs", name)
        assert proc.returncode == 0, proc.stderr + logs.stdout + logs.stderr
        out = json.loads(proc.stdout)
        # Behaviour's defaults: the pattern 4,2,1,0 run 3 times per request, one draft per step
        assert out["text"].startswith(" alpha bravo") and out["drafts"] == 4 * 3
        assert out["positions"] == ["0", "1", "2", "3"]
        logs = lab.head.docker("logs", name).stdout
        assert "Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)" in logs
        rec = json.loads((record / "record.json").read_text())
        assert rec["argv"][:3] == ["/models/x", "--port", "18888"] and rec["env"]["STANDIN_HEALTH_DELAY"] == "1"
    finally:
        lab.head.docker("rm", "-f", name, check=False)


def test_lab_leaves_nothing_behind(tmp_path):
    """A whole lab session in a child pytest, ended by a failing test and by Ctrl-C: nothing may remain."""
    require("ip", "dockerd", "sshd")
    for mode in ("fail", "interrupt"):
        root, tag = tmp_path / mode, f"t{mode[0]}{os.getpid()}"
        env = dict(os.environ, SPARKSTACK_LAB_ROOT=str(root), SPARKSTACK_LAB_TAG=tag, SPARKSTACK_LAB_CHILD=mode)
        child = start([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
                       str(HERE / "lab_child_session.py")], env=env,
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE.parents[1])
        deadline = time.monotonic() + 60
        while not (root / "ready").exists():
            if child.poll() is not None or time.monotonic() > deadline:
                child.kill()
                pytest.fail(f"the child lab never came up:\n{child.communicate()[0]}")
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in state_dir(tag).rglob("*.pid")]
        assert len(pids) >= 3 and lab_leftovers(tag, pids), "the child's lab should be up"
        if mode == "interrupt":
            child.send_signal(signal.SIGINT)
        else:
            (root / "go").write_text("fail now")
        out, _ = child.communicate(timeout=120)
        assert child.returncode != 0, out
        assert lab_leftovers(tag, pids) == [], out


def test_stopping_the_lab_signals_no_one_else(tmp_path, monkeypatch):
    """A stop sweeps what is left in a worker's mount namespace once its sshd is gone. The kernel hands a freed
    namespace's inode number to the next one made, here a bystander's (in CI: a test beside us in `ip netns exec`,
    whose ship died of SIGTERM): the sweep must not take it for the worker's.

    The lab fixture also stops the lab twice (its teardown, then atexit's). The second stop must signal nobody: the
    daemons it stopped are reaped, and with pid_max at 32768 their numbers soon belong to other processes."""
    require("ip", "nsenter", "unshare", "dockerd", "docker", "sshd", "ssh", "ssh-keygen")
    import lab as lab_module
    from lab import Lab, new_tag

    bystanders = []

    def stop_pid(pid, *args, **kwargs):
        lab_module_stop_pid(pid, *args, **kwargs)
        if kwargs.get("expect") == b"sshd":  # the worker's namespace may be free now: a new one made here may reuse it
            bystanders.append(subprocess.Popen(["unshare", "-m", "sleep", "60"]))
            time.sleep(0.2)  # let it be in its namespace before the sweep looks

    lab_module_stop_pid = lab_module.stop_pid
    the_lab = Lab(tmp_path, tag=new_tag())
    try:
        the_lab.start()
    finally:
        monkeypatch.setattr(lab_module, "stop_pid", stop_pid)
        the_lab.stop()
        monkeypatch.undo()
    try:
        assert bystanders, "the stop never stopped an sshd"
        assert [b.poll() for b in bystanders] == [None] * len(bystanders), "the sweep signalled a bystander"
    finally:
        for b in bystanders:
            b.kill()
            b.wait()
    signalled = []

    def kill(pid, sig):
        signalled.append((pid, sig))
        raise ProcessLookupError  # as if nothing lived there: the spy itself never reaches a process

    monkeypatch.setattr(os, "kill", kill)
    the_lab.stop()
    assert signalled == []

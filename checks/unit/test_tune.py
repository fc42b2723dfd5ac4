"""`sparkstack tune` against a host-root prefix and recording stand-ins (nvidia-smi, sysctl, sudo, id, ssh).

Both ranks read and write the same prepared tree: rank 1 is reached through the ssh stand-in, which runs its
command here as a "remote" call (STANDIN_REMOTE_* settings answer for it). Nothing here touches the real
/proc/sys or /etc: sysctl and nvidia-smi are stand-ins, and every file path is under the host root.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import hostfix
import pytest
import standins
from clirun import gone, sparkstack_cmd, start
from inprocess_engine import wait_for

TUNE_FILE = "etc/sysctl.d/zz-sparkstack-tune.conf"  # where docs/commands/tune.md says tune persists swappiness
RECIPE = Path(__file__).parents[2] / "recipes/glm53-flash-dflash2-nvfp4/recipe.toml"


@pytest.fixture
def untuned_host(tmp_path):
    standins.install(tmp_path / "bin")
    root = hostfix.write_host(tmp_path / "root", tuned=False)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD_LOG": str(tmp_path / "calls.jsonl"),
           "STANDIN_REMOTE_RECORD_LOG": str(tmp_path / "worker-calls.jsonl"),
           "HF_HOME": str(hostfix.write_hub(tmp_path / "hf")), "STANDIN_UID": "0", "STANDIN_REMOTE_UID": "0"}
    return {"tmp": tmp_path, "root": root, "env": env}


def tune(untuned_host, *args, env=None, root=None):
    full = {**os.environ, **untuned_host["env"], **(env or {})}
    return subprocess.run(sparkstack_cmd() + ["tune", *map(str, args), "--host-root", str(root or untuned_host["root"])],
                          capture_output=True, text=True, env=full, timeout=120, check=False)


def forget(untuned_host) -> None:
    for log in ("RECORD_LOG", "STANDIN_REMOTE_RECORD_LOG"):
        Path(untuned_host["env"][log]).unlink(missing_ok=True)


def head_calls(untuned_host) -> list[list[str]]:
    return [c for c in standins.recorded(Path(untuned_host["env"]["RECORD_LOG"])) if c[0] != "ssh"]


def worker_calls(untuned_host) -> list[list[str]]:
    """What the ssh stand-in ran as rank 1."""
    return standins.recorded(Path(untuned_host["env"]["STANDIN_REMOTE_RECORD_LOG"]))


def invoked(ran: list[list[str]]) -> list[list[str]]:
    """The calls sparkstack made: without the command each `sudo -n` stand-in ran in turn (recorded after it)."""
    return [c for i, c in enumerate(ran) if not (i and ran[i - 1][:2] == ["sudo", "-n"] and ran[i - 1][2:] == c)]


def is_read(argv: list[str]) -> bool:
    return argv[0] == "id" or argv[0] == "nvidia-smi" and argv[1].startswith("--query-gpu=")


def acts(untuned_host) -> list[list[str]]:
    return [c for c in head_calls(untuned_host) + worker_calls(untuned_host) if not is_read(c)]


def test_tune_acts_on_every_rank_and_persists_swappiness(untuned_host):
    (untuned_host["root"] / "proc/meminfo").write_text(hostfix.meminfo(Cached=6 * 2**20, Shmem=2**20))  # 5 GiB droppable
    proc = tune(untuned_host)
    assert proc.returncode == 0, proc.stderr
    for ran in (head_calls(untuned_host), worker_calls(untuned_host)):
        assert ["sysctl", "-w", "vm.swappiness=0"] in ran
        assert ["nvidia-smi", "-lgc", "0,2000"] in ran
        assert ran.index(["sync"]) < ran.index(["sysctl", "-w", "vm.drop_caches=3"])  # launch's drop: sync first
    text = (untuned_host["root"] / TUNE_FILE).read_text()
    settings = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert text.startswith("# Written by sparkstack tune") and settings == ["vm.swappiness = 0"]
    assert sorted(p.name for p in (untuned_host["root"] / "etc/sysctl.d").iterdir()) == ["zz-sparkstack-tune.conf"]  # no temp left
    # The clock cap is recorded with this boot's id, so a re-run (and preflight) can tell it was set.
    stamp = (untuned_host["root"] / "run/sparkstack/clock-cap").read_text()
    assert "clock_cap=0,2000" in stamp.splitlines() and f"boot_id={hostfix.BOOT_ID}" in stamp.splitlines()


def test_a_tuned_host_is_up_to_date_and_nothing_is_done(untuned_host):
    root = hostfix.write_host(untuned_host["tmp"] / "tuned", tuned=True)
    proc = tune(untuned_host, root=root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["rank 0 (local): up to date", "rank 1 (user@worker-node): up to date"]
    assert acts(untuned_host) == []


def test_tune_twice_the_second_run_is_up_to_date(untuned_host):
    state = untuned_host["tmp"] / "gpu-state.json"
    env = {"STANDIN_SYSCTL_ROOT": str(untuned_host["root"]), "STANDIN_GPU_STATE": str(state),
           "STANDIN_GPU_PERSISTENCE_MODE": "Disabled"}
    first = tune(untuned_host, env=env)
    assert first.returncode == 0, first.stderr
    ran = head_calls(untuned_host)
    assert ran.index(["nvidia-smi", "-pm", "1"]) < ran.index(["nvidia-smi", "-lgc", "0,2000"])  # persistence first
    forget(untuned_host)
    second = tune(untuned_host, "--json", env=env)
    doc = json.loads(second.stdout)
    assert doc["up_to_date"] and doc["done"] == [] and acts(untuned_host) == []


def test_dry_run_reports_what_differs_and_acts_on_nothing(untuned_host):
    before = {p: p.read_bytes() for p in untuned_host["root"].rglob("*") if p.is_file()}
    proc = tune(untuned_host, "--dry-run", "--json")
    doc = json.loads(proc.stdout)
    steps = {r["rank"]: [s["step"] for s in r["steps"]] for r in doc["ranks"]}
    assert steps == {0: ["swappiness", "swappiness-persisted", "clock-cap"],
                     1: ["swappiness", "swappiness-persisted", "clock-cap"]}
    assert doc["ranks"][0]["facts"]["swappiness"] == "60"
    assert acts(untuned_host) == []
    assert {p: p.read_bytes() for p in untuned_host["root"].rglob("*") if p.is_file()} == before


def test_not_root_uses_sudo_n_root_does_not(untuned_host):
    proc = tune(untuned_host, env={"STANDIN_UID": "0", "STANDIN_REMOTE_UID": "1000"})
    assert proc.returncode == 0, proc.stderr
    local = [c for c in invoked(head_calls(untuned_host)) if not is_read(c)]
    remote = [c for c in invoked(worker_calls(untuned_host)) if not is_read(c)]
    assert remote and all(c[:2] == ["sudo", "-n"] for c in remote)  # every act on the worker, as the ssh user
    assert not any(c[0] == "sudo" for c in local) and ["sysctl", "-w", "vm.swappiness=0"] in local
    assert ["sudo", "-n", "sysctl", "-w", "vm.swappiness=0"] in remote


@pytest.mark.parametrize("how,said", [("refuse", "a password is required"), ("deny", "Sorry, user bob is not allowed")])
@pytest.mark.parametrize("rank,env,where", [
    ("0", {"STANDIN_UID": "1000", "STANDIN_SUDO": "{how}"}, "here"),
    ("1", {"STANDIN_REMOTE_UID": "1000", "STANDIN_REMOTE_SUDO": "{how}"}, "on user@worker-node"),
])
def test_a_refused_sudo_is_one_line_naming_the_command(untuned_host, rank, env, where, how, said):
    proc = tune(untuned_host, rank, env={k: v.format(how=how) for k, v in env.items()})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"sparkstack: error: rank {rank} ")
    assert said in proc.stderr and "sudo -n refused swappiness" in proc.stderr
    assert proc.stderr.rstrip().endswith(f"run it {where} yourself: sudo sysctl -w vm.swappiness=0")
    ran = head_calls(untuned_host) + worker_calls(untuned_host)
    assert [c for c in ran if c[0] == "sysctl"] == []  # nothing ran past the refusing sudo


def test_the_by_hand_line_for_the_file_writes_what_tune_writes(untuned_host):
    """A refusal at the persisted file names a shell line; run as root, it leaves exactly tune's own file."""
    (untuned_host["root"] / "proc/sys/vm/swappiness").write_text("0\n")
    proc = tune(untuned_host, "0", env={"STANDIN_UID": "1000", "STANDIN_SUDO": "refuse"})
    line = proc.stderr.rstrip().split("yourself: ", 1)[1]
    assert "sudo tee" in line and "\n" not in line
    env = {**os.environ, **untuned_host["env"]}  # the sudo stand-in runs the command: we are root here
    subprocess.run(["bash", "-c", line], check=True, env=env)
    by_hand = (untuned_host["root"] / TUNE_FILE).read_text()
    (untuned_host["root"] / TUNE_FILE).unlink()
    assert tune(untuned_host, "0").returncode == 0
    assert (untuned_host["root"] / TUNE_FILE).read_text() == by_hand
    forget(untuned_host)
    assert "rank 0 (local): up to date" in tune(untuned_host, "0").stdout  # and tune takes that file as its own


def test_the_by_hand_line_for_the_clock_cap_records_it_so_tune_converges(untuned_host):
    """The clock cap by hand (sudo refused) must also leave the stamp, or tune and preflight never see it set."""
    root = hostfix.write_host(untuned_host["tmp"] / "tuned", tuned=True)
    (root / "run/sparkstack/clock-cap").unlink()
    proc = tune(untuned_host, "0", root=root, env={"STANDIN_UID": "1000", "STANDIN_SUDO": "refuse"})
    assert proc.returncode == 1 and "sudo -n refused clock-cap" in proc.stderr
    line = proc.stderr.rstrip().split("yourself: ", 1)[1]
    subprocess.run(["bash", "-c", line], check=True, env={**os.environ, **untuned_host["env"]})  # as root, through sudo
    assert ["nvidia-smi", "-lgc", "0,2000"] in head_calls(untuned_host)
    forget(untuned_host)
    proc = tune(untuned_host, "0", root=root)
    assert proc.returncode == 0 and proc.stdout == "rank 0 (local): up to date\n", proc.stdout + proc.stderr
    assert acts(untuned_host) == []


@pytest.mark.parametrize("text", ["vm.swappiness = 10\n",
                                  # our header, with the user's own line: not a file tune wrote
                                  None])
def test_a_file_tune_did_not_write_is_left_alone_and_the_rest_is_done(untuned_host, text):
    ours = untuned_host["root"] / TUNE_FILE
    if text is None:
        assert tune(untuned_host, "0").returncode == 0
        text = ours.read_text().replace("vm.swappiness = 0", "kernel.foo = 1")  # header kept, swappiness dropped
    ours.write_text(text)
    forget(untuned_host)
    proc = tune(untuned_host)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "is not what sparkstack tune writes" in proc.stderr and TUNE_FILE in proc.stderr
    assert ours.read_text() == text
    for ran in (head_calls(untuned_host), worker_calls(untuned_host)):  # the other steps still done, on every rank
        assert ["sysctl", "-w", "vm.swappiness=0"] in ran


def test_ubuntus_sysctl_conf_setting_60_is_named_and_the_live_value_still_set(untuned_host):
    """Ubuntu links /etc/sysctl.d/99-sysctl.conf -> ../sysctl.conf; procps reads sysctl.conf after every file."""
    (untuned_host["root"] / "etc/sysctl.conf").write_text("vm.swappiness=60\n")
    (untuned_host["root"] / "etc/sysctl.d/99-sysctl.conf").symlink_to("../sysctl.conf")
    proc = tune(untuned_host, "0")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert f"{untuned_host['root'] / 'etc/sysctl.conf'} sets vm.swappiness = 60" in proc.stderr
    assert ["sysctl", "-w", "vm.swappiness=0"] in head_calls(untuned_host)
    assert not (untuned_host["root"] / TUNE_FILE).exists()


def test_the_file_that_wins_is_blamed_not_an_earlier_foreign_one(untuned_host):
    (untuned_host["root"] / TUNE_FILE).write_text("vm.swappiness = 0\n")  # foreign, but overridden by a later file
    (untuned_host["root"] / "etc/sysctl.d/zzz-later.conf").write_text("vm.swappiness = 60\n")
    proc = tune(untuned_host, "0")
    assert proc.returncode == 1 and "zzz-later.conf sets vm.swappiness = 60" in proc.stderr
    assert "zz-sparkstack-tune.conf" not in proc.stderr


def test_persisted_value_follows_systemd_precedence(untuned_host):
    """A name in /etc/sysctl.d hides the same name in /usr/lib/sysctl.d; what is already 0 at boot is left alone."""
    lib = untuned_host["root"] / "usr/lib/sysctl.d"
    lib.mkdir(parents=True)
    (lib / "10-vendor.conf").write_text("vm.swappiness = 0\n")
    doc = json.loads(tune(untuned_host, "--dry-run", "--json").stdout)
    assert "swappiness-persisted" not in [s["step"] for s in doc["ranks"][0]["steps"]]
    (untuned_host["root"] / "etc/sysctl.d/10-vendor.conf").write_text("# masked\n")
    doc = json.loads(tune(untuned_host, "--dry-run", "--json").stdout)
    assert all("swappiness-persisted" in [s["step"] for s in r["steps"]] for r in doc["ranks"])


def test_clock_cap_comes_from_the_recipe_and_a_clock_above_it_is_capped_again(untuned_host, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE.read_text().replace('clock_cap = "0,2000"', 'clock_cap = "300,2200"'))
    assert tune(untuned_host, "0", "--recipe", recipe).returncode == 0
    assert ["nvidia-smi", "-lgc", "300,2200"] in head_calls(untuned_host)
    forget(untuned_host)
    doc = json.loads(tune(untuned_host, "0", "--recipe", recipe, "--dry-run", "--json").stdout)
    assert "clock-cap" not in [s["step"] for s in doc["ranks"][0]["steps"]]  # the recorded cap, this boot
    doc = json.loads(tune(untuned_host, "0", "--recipe", recipe, "--dry-run", "--json",
                          env={"STANDIN_GPU_CLOCKS_CURRENT_GRAPHICS": "2500"}).stdout)
    assert "clock-cap" in [s["step"] for s in doc["ranks"][0]["steps"]]  # 2500 MHz > 2200: not in force


def test_a_cap_recorded_before_a_reboot_is_set_again(untuned_host):
    """`nvidia-smi -lgc` does not survive a reboot: a stamp naming another boot id says nothing about now."""
    root = hostfix.write_host(untuned_host["tmp"] / "rebooted", tuned=True)
    assert json.loads(tune(untuned_host, "0", "--dry-run", "--json", root=root).stdout)["up_to_date"]  # this boot: tuned
    (root / "proc/sys/kernel/random/boot_id").write_text("0b7e2d4c-1111-4222-8333-944455556666\n")
    doc = json.loads(tune(untuned_host, "0", "--dry-run", "--json", root=root).stdout)
    (step,) = doc["ranks"][0]["steps"]
    assert step["step"] == "clock-cap" and step["now"] == "no cap set by sparkstack tune since boot"
    assert doc["ranks"][0]["facts"]["clock_cap_this_boot"] is None


def test_missing_nvidia_smi_is_reported_not_crashed_on(untuned_host):
    proc = tune(untuned_host, "1", env={"STANDIN_REMOTE_GPU": "absent"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(tune(untuned_host, "1", "--dry-run", "--json", env={"STANDIN_REMOTE_GPU": "absent"}).stdout)
    assert any("nvidia-smi is not installed on user@worker-node" in n for n in doc["ranks"][0]["notes"])
    assert [c for c in worker_calls(untuned_host) if c[0] == "nvidia-smi" and not is_read(c)] == []


def test_a_rank_whose_gpus_were_left_alone_is_never_up_to_date(untuned_host):
    """Without nvidia-smi, persistence mode and the clock cap were never set: said when acting, not just in a dry run."""
    root = hostfix.write_host(untuned_host["tmp"] / "tuned", tuned=True)
    proc = tune(untuned_host, root=root, env={"STANDIN_REMOTE_GPU": "absent"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "rank 0 (local): up to date",
        ("rank 1 (user@worker-node): note: nvidia-smi is not installed on user@worker-node: persistence mode and the "
         "clock cap are left alone")]
    doc = json.loads(tune(untuned_host, "--json", root=root, env={"STANDIN_REMOTE_GPU": "absent"}).stdout)
    assert [r["up_to_date"] for r in doc["ranks"]] == [True, False] and not doc["up_to_date"]


@pytest.mark.parametrize("cached_kib,shmem_kib,drops", [(3 * 2**20, 0, True), (2**20, 0, False),
                                                     (3 * 2**20, 3 * 2**19, False)])  # 1.5 GiB of it is tmpfs
def test_page_cache_is_dropped_only_when_there_is_some(untuned_host, cached_kib, shmem_kib, drops):
    """Droppable = Buffers + Cached - Shmem (tmpfs pages stay through a drop); tune drops at 2 GiB or more."""
    (untuned_host["root"] / "proc/meminfo").write_text(hostfix.meminfo(Buffers=0, Cached=cached_kib, Shmem=shmem_kib))
    assert tune(untuned_host, "0").returncode == 0
    assert (["sysctl", "-w", "vm.drop_caches=3"] in head_calls(untuned_host)) == drops


def test_a_dir_that_is_not_a_host_root_acts_on_nothing(untuned_host):
    """A mistyped --host-root: swappiness and the boot id cannot be read there, so every rank stops in one line."""
    typo = untuned_host["tmp"] / "typo"
    typo.mkdir()
    proc = tune(untuned_host, root=typo)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"cannot read {typo / 'proc/sys/vm/swappiness'}" in proc.stderr and "rank 1" in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert acts(untuned_host) == [] and list(typo.iterdir()) == []  # no sysctl, no nvidia-smi -lgc, no file
    assert "unreadable" not in proc.stdout + proc.stderr


def test_an_unreadable_boot_id_stops_that_rank_only(untuned_host):
    (untuned_host["root"] / "proc/sys/kernel/random/boot_id").unlink()
    proc = tune(untuned_host, "0")
    assert proc.returncode == 1 and "cannot read" in proc.stderr and "boot_id" in proc.stderr
    assert acts(untuned_host) == [] and not (untuned_host["root"] / "run/sparkstack/clock-cap").exists()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "term"])
def test_ctrl_c_says_what_is_true_of_tune(untuned_host, sig, code):
    """Interrupted inside a step (a `sync` that hangs): the steps said done stay done, a re-run does the rest.
    SIGTERM the same, and the hanging `sync` (a child) is stopped with it."""
    slow = untuned_host["tmp"] / "slow"
    slow.mkdir()
    started = untuned_host["tmp"] / "sync-started"
    (slow / "sync").write_text(f"#!/bin/sh\necho $$ > {started}.new && mv {started}.new {started}\nexec sleep 60\n")
    (slow / "sync").chmod(0o755)
    env = {**os.environ, **untuned_host["env"], "PATH": f"{slow}:{untuned_host['env']['PATH']}"}
    proc = start(sparkstack_cmd() + ["tune", "0", "--host-root", str(untuned_host["root"])], env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not started.exists() and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code and "Traceback" not in err, err
    assert "nothing half-written" not in err and "run tune again" in err
    wait_for("the hanging step stopped", lambda: gone(started.read_text().strip()))
    assert out == "rank 0 (local): swappiness: 60 -> 0\n"  # the one step done before the interrupted one


def test_json_on_failure_still_prints_the_document_with_what_was_done(untuned_host):
    (untuned_host["root"] / "etc/sysctl.conf").write_text("vm.swappiness = 60\n")  # a step tune will not do
    proc = tune(untuned_host, "0", "--json")
    assert proc.returncode == 1  # progress on stderr, then the one error line
    assert proc.stderr.splitlines()[-1].startswith("sparkstack: error: rank 0 (local): swappiness-persisted")
    doc = json.loads(proc.stdout)
    assert {"rank": 0, "step": "swappiness", "was": "60", "now": "0"} in doc["done"]
    assert len(doc["problems"]) == 1 and "etc/sysctl.conf sets vm.swappiness = 60" in doc["problems"][0]

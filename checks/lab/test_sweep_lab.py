"""`sparkstack sweep` on the two-host lab, with the stand-in engine on both ranks (issue 31's lab test).

One sweep of two knobs, NUM_SPEC_TOKENS=2,4 x GPU_MEM_UTIL=0.92,0.85, run from the head's network namespace as a
user runs it (from one directory, with a HOME of its own, so the record is under ~/.local/state/sparkstack):
1. the dry run: four cells in the product's order, five boots (no cell is the recipe as it stands: GPU_MEM_UTIL
   is 0.90 there, so the final relaunch boots);
2. the sweep, cut by Ctrl-C (SIGINT to its process group) while the last cell boots. The two 0.92 cells fail to
   boot: the stand-in prints vLLM's free-memory fatal line when its argv holds --gpu-memory-utilization 0.92
   (STANDIN_DIE_ON), and the sweep goes on past the first. The record and the lines say which cells are done,
   failed and cut;
3. the same sweep again: the three finished cells are kept (their launches' run records untouched, and the head's
   dockerd creates exactly two rank-0 containers: the cut cell's and the final relaunch's), the table holds every
   cell, and the recipe as it stands serves (the head engine's recorded argv);
4. the same sweep once more: nothing to run, no boot, the table again (as JSON, and drawn by --plot): per-position
   acceptance worked out by hand from the stand-in's acceptance pattern and each cell's n, and the boot's figures;
5. `--leave-last-up` on a second sweep: its first cell is what serves (no boot), its last stays serving.

With SPARKSTACK_SWEEP_TRANSCRIPT=FILE the runs' command lines and output go to FILE (the test's directory shown
as the current one, its HOME as ~): docs/commands/sweep.md's transcript is made from it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clirun import assert_planned, sparkstack_cmd, start
from hostfix import write_host, write_hub
from test_boot_lab import CONFIRMED, vllm
from test_launch_lab import lab_recipe

# The stand-in decodes with this acceptance pattern (accepted draft tokens per step, cycling; a count above the
# cell's n accepts the whole draft): STANDIN_ACCEPT_PATTERN below.
PATTERN = (4, 3, 1, 0)
# vLLM's check at startup (free-memory in launch/bootlines.py), as the head's EngineCore prints it.
FREE_MEMORY = ("(EngineCore_DP0 pid=1) ERROR 05-01 10:00:00 [core.py:1] ValueError: Free memory on device cuda:0 "
               "(110.20/121.69 GiB) on startup is less than desired GPU memory utilization (0.92, 111.95 GiB). "
               "Decrease GPU memory utilization or reduce GPU memory used by other processes.")
# Each rank's boot lines, as vLLM prints them, with no delays: the figures the table shows beside the bench's.
BOOT_SCRIPT = {
    "0": [[0, line] for line in (
        *CONFIRMED, vllm("kv-memory", kv_gib="9.54"), vllm("kv-tokens", proc="EngineCore_DP0", kv_tokens="989,727"),
        vllm("graphs-captured", seconds="14", gib="0.84"), vllm("engine-ready", proc="EngineCore_DP0"))],
    "1": [[0, vllm("kv-memory", proc="Worker_TP1", kv_gib="9.54")],
          [0, vllm("graphs-captured", proc="Worker_TP1", seconds="15", gib="0.86")]],
}
VARY = ("--vary", "NUM_SPEC_TOKENS=2,4", "--vary", "GPU_MEM_UTIL=0.92,0.85")
FAST = ("--worker-delay", "0.2", "--health-interval", "0.2", "--health-attempts", "150", "--bench-rounds", "1",
        "--bench-concurrency", "1", "--bench-category", "count", "--bench-max-tokens", "64")
RANK0 = "glm53-tony-rank0"


@pytest.fixture(scope="module")
def sweep_world(lab_with_image, tmp_path_factory):
    """A directory to run in: the lab recipe (the stand-in's settings in its [env]), a host root, the weights; a
    HOME of its own. Afterwards the pair is stopped."""
    lab, image = lab_with_image
    work = tmp_path_factory.mktemp("sweep")
    write_host(work / "hostroot")
    hf = write_hub(work / "hf")
    recipe = lab_recipe(lab, work, {"STANDIN_HEALTH_DELAY": "0", "STANDIN_ACCEPT_PATTERN": ",".join(map(str, PATTERN)),
                                    "STANDIN_CYCLES": "1", "STANDIN_STEP_DELAY": "0.001",
                                    "STANDIN_BOOT_SCRIPT": json.dumps(BOOT_SCRIPT),
                                    "STANDIN_DIE_ON": json.dumps({"--gpu-memory-utilization=0.92": FREE_MEMORY})})
    recipe.rename(work / "recipe.toml")
    (work / "ssh_config").symlink_to(lab.ssh_config)
    (work / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKSTACK_STATE_DIR", "XDG_STATE_HOME")}
    env.update(HOME=str(work / "home"), HF_HOME=str(hf), IMAGE=image["name"], VLLM_API_KEY="lab-sweep-key",
               PYTHONUNBUFFERED="1")  # stdout and stderr in one pipe, in a terminal's order
    w = {"lab": lab, "image": image, "work": work, "env": env, "home": work / "home"}
    try:
        yield w
    finally:
        stopped = sparkstack(w, *argv("launch stop"))
        assert stopped.returncode == 0, stopped.stderr


def argv(command: str, *args: str) -> list[str]:
    """`command` ("sweep", "launch stop") on the lab recipe, with the lab's options (launch's profile, host root,
    ssh config) after the rest."""
    return [*command.split(), "--recipe", "recipe.toml", *args, "--profile", "lab", "--host-root", "hostroot",
            "--ssh-config", "ssh_config"]


def head_argv(w, args) -> list[str]:
    return ["ip", "netns", "exec", w["lab"].head.netns, *sparkstack_cmd(), *args]


def sparkstack(w, *args: str, merged: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run in the head's network namespace, from the test's directory; `merged`: stderr into stdout, in the order
    a terminal shows them (the runs whose output the transcript keeps)."""
    proc = subprocess.run(head_argv(w, args), cwd=w["work"], env=w["env"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE, text=True, timeout=timeout)
    proc.stderr = proc.stderr or ""
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc


def shown(w, text: str) -> str:
    return text.replace(str(w["home"]), "~").replace(f"{w['work']}/", "").replace(str(w["work"]), ".")


def transcript(w, label: str, proc: subprocess.CompletedProcess) -> None:
    """With SPARKSTACK_SWEEP_TRANSCRIPT=FILE, the run's command line and what it showed."""
    path = os.environ.get("SPARKSTACK_SWEEP_TRANSCRIPT")
    if path:
        args = proc.args[proc.args.index("sparkstack.cli") + 1:]
        with open(path, "a") as f:
            f.write(f"\n## {label} (exit {proc.returncode})\n$ sparkstack {shlex.join(args)}\n"
                    f"{shown(w, proc.stdout)}{shown(w, proc.stderr)}")


def record(w) -> dict:
    (path,) = (w["home"] / ".local/state/sparkstack/sweeps").glob("????????????.json")
    return json.loads(path.read_text())


def statuses(doc: dict) -> dict[int, str]:
    return {c["index"] + 1: c["status"] for c in doc["cells"]}


def rank0_creates(w, since: float) -> int:
    """Containers named like rank 0 that the head's dockerd created since `since` (its event log): the boots."""
    events = w["lab"].head.docker("events", "--since", f"{since:.3f}", "--until", f"{time.time():.3f}", "--filter",
                                  "type=container", "--filter", "event=create", "--filter", f"container={RANK0}",
                                  "--format", "{{.Actor.Attributes.name}}")
    return events.stdout.split().count(RANK0)


def engine_argv(w) -> list[str]:
    """The argv the head's stand-in engine was started with (its own record, in the container)."""
    raw = w["lab"].head.docker("exec", RANK0, "cat", "/tmp/standin-record.json").stdout
    return json.loads(raw)["argv"]


def spec_tokens(args: list[str]) -> int:
    return json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"]


def test_sweep_two_knobs_a_failed_boot_a_ctrl_c_its_resume_and_the_final_relaunch(sweep_world):
    w = sweep_world
    lab, work = w["lab"], w["work"]
    t0 = time.monotonic()

    # 1. The plan: the product's order (no cell shares a boot, none is what serves or the recipe as it stands).
    proc = sparkstack(w, *argv("sweep", *VARY, *FAST, "--dry-run"), merged=True)
    transcript(w, "the plan (--dry-run)", proc)
    assert_planned(proc)
    proc = sparkstack(w, *argv("sweep", *VARY, *FAST, "--dry-run", "--json"))
    plan = json.loads(proc.stdout)
    assert [(c["index"], c["knobs"], c["boots"]) for c in plan["cells"]] == [
        (0, {"NUM_SPEC_TOKENS": "2", "GPU_MEM_UTIL": "0.92"}, True),
        (1, {"NUM_SPEC_TOKENS": "2", "GPU_MEM_UTIL": "0.85"}, True),
        (2, {"NUM_SPEC_TOKENS": "4", "GPU_MEM_UTIL": "0.92"}, True),
        (3, {"NUM_SPEC_TOKENS": "4", "GPU_MEM_UTIL": "0.85"}, True)]
    assert plan["boots"] == 5 and plan["final_boot"] and plan["finished_already"] == [] and plan["dry_run"]
    assert len({c["key"] for c in plan["cells"]}) == 4 and None not in {c["key"] for c in plan["cells"]}
    assert not (w["home"] / ".local/state/sparkstack/sweeps").exists()  # a dry run writes no record

    # 2. The sweep, cut by Ctrl-C while the last cell boots (the first and third have failed, the second is done).
    child = start(head_argv(w, argv("sweep", *VARY, *FAST, "--yes")), cwd=work, env=w["env"],
                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if statuses(record(w))[4] == "booting":
                    break
            except (ValueError, OSError, KeyError):
                pass  # no record yet, or one half written
            assert child.poll() is None, "the sweep ended before it could be cut: " + child.communicate()[0]
            assert time.monotonic() < deadline, "the sweep never reached its last cell"
            time.sleep(0.01)
    finally:
        os.killpg(child.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group, ssh and docker included
    out, _ = child.communicate(timeout=120)
    err = out  # one stream, as a terminal shows it: the progress lines are its stderr's
    cut = subprocess.CompletedProcess(child.args, child.returncode, out, "")
    transcript(w, "the sweep, cut by Ctrl-C while cell 4 boots", cut)
    assert child.returncode == 130, out
    assert "Traceback" not in err
    doc = record(w)
    assert statuses(doc) == {1: "failed", 2: "done", 3: "failed", 4: "cut"}, doc
    assert "done: 2 (NUM_SPEC_TOKENS=2 GPU_MEM_UTIL=0.85)" in err, err
    assert "failed: 1 (NUM_SPEC_TOKENS=2 GPU_MEM_UTIL=0.92), 3 (NUM_SPEC_TOKENS=4 GPU_MEM_UTIL=0.92)" in err, err
    assert "cut: 4 (NUM_SPEC_TOKENS=4 GPU_MEM_UTIL=0.85)" in err and "run the same sweep again" in err, err
    for cell in (doc["cells"][0], doc["cells"][2]):  # a failed boot is a row with its fatal line and diagnosis
        assert cell["failure"]["line"] == FREE_MEMORY.split("] ", 1)[1][:200], cell["failure"]  # launch keeps 200
        assert "lower GPU_MEM_UTIL" in cell["failure"]["diagnosis"] and cell["report"] is None
    assert "cell 1 (NUM_SPEC_TOKENS=2 GPU_MEM_UTIL=0.92): failed: " in out  # and the sweep went on
    done = doc["cells"][1]
    runs = w["home"] / ".local/state/sparkstack/runs"
    kept_run = (runs / f"{done['run_id']}.json").read_text()

    # 3. The same sweep again: the finished cells kept, the cut one run, then the recipe as it stands relaunched.
    since = time.time()
    proc = sparkstack(w, *argv("sweep", *VARY, *FAST, "--yes"), merged=True)
    transcript(w, "the same sweep again: it resumes", proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for n in (1, 2, 3):
        assert f"cell {n} (" in proc.stdout and "finished in an earlier run: kept" in proc.stdout
    assert rank0_creates(w, since) == 2  # the cut cell's boot and the final relaunch's: nothing else booted
    assert (runs / f"{done['run_id']}.json").read_text() == kept_run  # cell 2's launch was not run again
    doc = record(w)
    assert statuses(doc) == {1: "failed", 2: "done", 3: "failed", 4: "done"}
    assert doc["cells"][1] == done  # kept as it was: its boot, its report, its times
    serving = doc["serving"]
    assert serving["what"] == "recipe" and serving["cell"] is None
    assert f"serving: the recipe as it stands (run {serving['run_id']})" in proc.stdout
    # The recipe as it stands serves: launch's status, and the argv the head's engine got.
    status = json.loads(sparkstack(w, *argv("launch status", "--json")).stdout)
    assert status["last_run"]["id"] == serving["run_id"] == plan["baseline"]
    assert [r["state"] for r in status["ranks"]] == ["running", "running"] and status["ranks"][0]["health"] == 200
    args = engine_argv(w)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.90" and spec_tokens(args) == 4

    # 4. Once more: every cell finished, the recipe serving: no boot, no bench, the table.
    since = time.time()
    proc = sparkstack(w, *argv("sweep", *VARY, *FAST, "--yes", "--json", "--plot", "sweep.png"))
    assert proc.returncode == 0, proc.stderr
    assert rank0_creates(w, since) == 0 and "booting" not in proc.stderr
    assert (work / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = {c["index"] + 1: c for c in json.loads(proc.stdout)["table"]["cells"]}
    # By hand, from PATTERN = (4, 3, 1, 0): a step accepts min(count, n) of its n drafted tokens, and every
    # request runs the pattern once (STANDIN_CYCLES=1), so the figures are the pattern's whatever the prompt.
    # n = 2: accepted 2, 2, 1, 0 over 4 drafts: position 1 in 3 of 4 steps (0.75), position 2 in 2 (0.50);
    #        acceptance length 1 + 5/4 = 2.25.
    # n = 4: accepted 4, 3, 1, 0: positions 1..4 in 3, 2, 2, 1 steps of 4 (0.75/0.50/0.50/0.25);
    #        acceptance length 1 + 8/4 = 3.00.
    expected = {2: ([0.75, 0.50], 2.25), 4: ([0.75, 0.50, 0.50, 0.25], 3.00)}
    for n, cell in table.items():
        if n in (1, 3):
            assert cell["status"] == "failed" and cell["rows"] == [] and "Free memory on device" in \
                cell["failure"]["line"]
            continue
        (row,) = cell["rows"]
        per_position, length = expected[n]
        assert (row["concurrency"], row["category"]) == (1, "count")
        assert row["per_position"] == pytest.approx(per_position) and row["acceptance_length"] == pytest.approx(length)
        assert row["steps_per_s"] > 0 and row["output_tok_s"] > 0
        boot = cell["boot"]  # the head's figures, from BOOT_SCRIPT's lines
        assert (boot["kv_tokens"], boot["graph_capture_s"], boot["graph_capture_gib"]) == (989727, 14.0, 0.84)
        assert boot["ready_s"] >= 0 and boot["run_id"] == record(w)["cells"][n - 1]["run_id"]
    assert table[2]["rows"][0]["changes"] is None  # the first finished cell: the bands are against it
    assert table[4]["rows"][0]["changes"]["acceptance_length"]["change_pct"] == pytest.approx((3.00 / 2.25 - 1) * 100)

    # 5. --leave-last-up: a second sweep whose first cell is what serves now (no boot) and whose last stays up.
    leave = ("--vary", "NUM_SPEC_TOKENS=4,2", *FAST, "--leave-last-up")
    proc = sparkstack(w, *argv("sweep", *leave, "--dry-run"), merged=True)
    transcript(w, "a second sweep that leaves its last cell up (--dry-run)", proc)
    assert "1. cell 1: NUM_SPEC_TOKENS=4: no boot: what serves now" in proc.stdout, proc.stdout
    assert "then: the last cell is left serving (--leave-last-up)" in proc.stdout
    since = time.time()
    proc = sparkstack(w, *argv("sweep", *leave, "--yes"), merged=True)
    transcript(w, "a second sweep that leaves its last cell up", proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the pair serves this boot already" in proc.stdout
    assert rank0_creates(w, since) == 1 and "relaunching" not in proc.stdout
    assert "serving: cell 2 (run " in proc.stdout
    assert spec_tokens(engine_argv(w)) == 2
    print(f"\nsweep lab test: {time.monotonic() - t0:.1f} s")

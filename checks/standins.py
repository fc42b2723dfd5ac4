"""Recording stand-ins for the programs sparkstack drives (docker, podman, ssh, rsync, nvidia-smi, sysctl, sync,
sudo, id).

Each appends its argv as one JSON line to $RECORD_LOG. The ssh stand-in runs its remote command here, through
the same stand-ins, with STANDIN_REMOTE=1 set (and HOME=$STANDIN_REMOTE_HOME when that is set: the worker's own
home), so a test can tell a worker's docker from the head's. The docker
stand-in answers `image inspect` with $STANDIN_IMAGE_ID (or $STANDIN_REMOTE_IMAGE_ID on a "remote" call); an
empty value means "No such image" (exit 1); `inspect` gives a running container started at the time in
$STANDIN_STARTED_AT_FILE (else a fixed one). A container's org.sparkstack.rank label is the digits its name ends in
after "rank" (launch's default names), else absent.

With STANDIN_REMOTE_RECORD_LOG set, what the ssh stand-in runs records there instead.
Where a setting has a remote twin, STANDIN_REMOTE_X wins over STANDIN_X on a "remote" call:
- nvidia-smi answers `--query-gpu=a,b` (csv, no header) from STANDIN_GPU_<A> (field upper-cased, '.' -> '_';
  defaults: persistence_mode Enabled, clocks.current.graphics 1200), and a `-pm 1` it was given (kept in
  $STANDIN_GPU_STATE, a file, when set). STANDIN_GPU=absent makes it "not installed" (exit 127).
- sysctl `-w key=value` also writes value to $STANDIN_SYSCTL_ROOT/proc/sys/<key as a path> when that is set.
- sudo -n runs its command, or with STANDIN_SUDO=refuse says a password is required (exit 1); with
  STANDIN_SUDO=deny it answers as sudoers does for a user without a rule for that command (exit 1).
- id -u prints STANDIN_UID (default: the real effective uid).
"""

import json
import shlex
import sys
from pathlib import Path

PROGRAMS = ("docker", "podman", "ssh", "rsync", "nvidia-smi", "sysctl", "sync", "sudo", "id")
DEFAULT_ID = "sha256:" + "ab" * 32

RECORDER = r'''#!{python}
import json, os, shlex, subprocess, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["RECORD_LOG"], "a") as log:
    log.write(json.dumps([name] + sys.argv[1:]) + "\n")
if name == "ssh":
    args = sys.argv[1:]
    command = args[args.index("--") + 1]
    remote_log = os.environ.get("STANDIN_REMOTE_RECORD_LOG", os.environ["RECORD_LOG"])
    env = dict(os.environ, STANDIN_REMOTE="1", RECORD_LOG=remote_log)
    env["HOME"] = os.environ.get("STANDIN_REMOTE_HOME") or env.get("HOME", "")
    sys.exit(subprocess.call(shlex.split(command), env=env))


def setting(key, default=None):
    if os.environ.get("STANDIN_REMOTE") == "1" and "STANDIN_REMOTE_" + key in os.environ:
        return os.environ["STANDIN_REMOTE_" + key]
    return os.environ.get("STANDIN_" + key, default)


if name == "sudo":
    args = sys.argv[1:]
    if args[:1] == ["-n"]:
        args = args[1:]
    if setting("SUDO") == "refuse":
        print("sudo: a password is required", file=sys.stderr)
        sys.exit(1)
    if setting("SUDO") == "deny":
        print(f"Sorry, user bob is not allowed to execute '{' '.join(args)}' as root on spark.", file=sys.stderr)
        sys.exit(1)
    os.execvp(args[0], args)
if name == "id":
    print(setting("UID", str(os.geteuid())) if sys.argv[1:] == ["-u"] else "uid=0(root)")
    sys.exit(0)
if name == "nvidia-smi":
    if setting("GPU") == "absent":
        print("bash: line 1: nvidia-smi: command not found", file=sys.stderr)
        sys.exit(127)
    state_file = setting("GPU_STATE")
    state = json.load(open(state_file)) if state_file and os.path.exists(state_file) else {}
    args = sys.argv[1:]
    if args[:2] == ["-pm", "1"] and state_file:
        json.dump(dict(state, persistence_mode="Enabled"), open(state_file, "w"))
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    if query:
        defaults = {"persistence_mode": "Enabled", "clocks.current.graphics": "1200"}
        print(", ".join(state.get(f) or setting("GPU_" + f.upper().replace(".", "_"), defaults.get(f, "[N/A]"))
                        for f in query.split(",")))
    sys.exit(0)
if name == "sysctl":
    args = sys.argv[1:]
    root = os.environ.get("STANDIN_SYSCTL_ROOT")
    if root and args[:1] == ["-w"]:
        key, _, value = args[1].partition("=")
        with open(os.path.join(root, "proc/sys", key.replace(".", "/")), "w") as f:
            f.write(value + "\n")
    sys.exit(0)
if name in ("docker", "podman"):
    args = sys.argv[1:]
    if args[:1] == ["-H"]:
        args = args[2:]
    remote = os.environ.get("STANDIN_REMOTE") == "1"
    image_id = os.environ.get("STANDIN_REMOTE_IMAGE_ID" if remote else "STANDIN_IMAGE_ID", "{default_id}")
    if "org.sparkstack.gates.runtime" in " ".join(args):
        print(os.environ.get("STANDIN_GATES_LABEL", ""))  # empty: no label, the default gates
    elif args[:2] == ["image", "inspect"]:
        if not image_id:
            print("Error: No such image: " + args[-1], file=sys.stderr)
            sys.exit(1)
        print(image_id)
    elif args[:1] == ["inspect"] and "org.sparkstack.rank" in " ".join(args):
        import re
        owned = re.search(r"rank(\d+)$", args[-1])  # launch's default names end in the rank: glm53-tony-rankN
        state = "running " if "State.Status" in " ".join(args) else ""
        print(state + (owned.group(1) if owned else "<no value>"))
    elif args[:1] == ["inspect"]:
        started = "2026-11-29T00:00:00.000000000Z"
        if os.environ.get("STANDIN_STARTED_AT_FILE"):  # a test moves a container's start time by rewriting it
            started = open(os.environ["STANDIN_STARTED_AT_FILE"]).read().strip()
        print("running " + started + " " + (image_id or "{default_id}"))
    elif args[:1] == ["run"] and "--sparkstack-gates" in args:  # launch's gates, all in one container: each passes
        spec = json.loads(args[args.index("--sparkstack-gates") + 1])
        print("sparkstack-gates: " + json.dumps({
            "argvs": [[0, "vLLM accepts the argv (%d arguments)" % len(a)] for a in spec["argvs"]],
            "gates": [[0, "ok\n", ""] for _ in spec["gates"]]}))
    elif args[:1] == ["run"]:
        print("c0ffee")
sys.exit(0)
'''


def install(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in PROGRAMS:
        p = bin_dir / name
        p.write_text(RECORDER.replace("{python}", sys.executable).replace("{default_id}", DEFAULT_ID))
        p.chmod(0o755)


def recorded(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def recording_tools(dest: Path, recorder: Path, log: Path, root: Path) -> Path:
    """`sysctl` and `nvidia-smi` stand-ins (this module's) for one machine: what they are asked is logged to
    `log`, `sysctl -w` writes under `root` (never /proc/sys), the GPU starts in persistence mode Disabled."""
    dest.mkdir()
    settings = {"RECORD_LOG": log, "STANDIN_SYSCTL_ROOT": root, "STANDIN_GPU_STATE": log.with_suffix(".gpu.json"),
                "STANDIN_GPU_PERSISTENCE_MODE": "Disabled"}
    exports = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in settings.items())
    for name in ("sysctl", "nvidia-smi"):
        # python3 from PATH: the worker's own (the venv's interpreter lives under this machine's /root, which the
        # worker's HOME hides); the stand-ins need only the standard library.
        (dest / name).write_text(f'#!/bin/sh\nexport {exports}\nexec python3 {shlex.quote(str(recorder / name))} "$@"\n')
        (dest / name).chmod(0o755)
    return dest

"""Recording stand-ins for the programs sparkstack drives (docker, podman, ssh, rsync, nvidia-smi, sysctl, sync).

Each appends its argv as one JSON line to $RECORD_LOG. The ssh stand-in runs its remote command here, through
the same stand-ins, with STANDIN_REMOTE=1 set (and HOME=$STANDIN_REMOTE_HOME when that is set: the worker's own
home), so a test can tell a worker's docker from the head's. The docker
stand-in answers `image inspect` with $STANDIN_IMAGE_ID (or $STANDIN_REMOTE_IMAGE_ID on a "remote" call); an
empty value means "No such image" (exit 1). A container's org.sparkstack.rank label is the digits its name ends in
after "rank" (launch's default names), else absent.
"""

import json
import sys
from pathlib import Path

PROGRAMS = ("docker", "podman", "ssh", "rsync", "nvidia-smi", "sysctl", "sync")
DEFAULT_ID = "sha256:" + "ab" * 32

RECORDER = r'''#!{python}
import json, os, shlex, subprocess, sys
name = os.path.basename(sys.argv[0])
with open(os.environ["RECORD_LOG"], "a") as log:
    log.write(json.dumps([name] + sys.argv[1:]) + "\n")
if name == "ssh":
    args = sys.argv[1:]
    command = args[args.index("--") + 1]
    env = dict(os.environ, STANDIN_REMOTE="1")
    env["HOME"] = os.environ.get("STANDIN_REMOTE_HOME") or env.get("HOME", "")
    sys.exit(subprocess.call(shlex.split(command), env=env))
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
        print(owned.group(1) if owned else "<no value>")
    elif args[:1] == ["inspect"]:
        print("running 2026-11-29T00:00:00.000000000Z " + (image_id or "{default_id}"))
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

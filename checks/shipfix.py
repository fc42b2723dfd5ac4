"""A world for `sparkstack ship` without root: fake `ssh` and `docker` on PATH, one HOME per "host".

The fake ssh runs its remote command here, with HOME set to that target's own dir (so "what the host
has" is really separate from the head's files), and with XDG_DATA_HOME and HF_HOME unset, as a login
over ssh would be. A target may instead fail like ssh does (a wrong host key), or have no docker on
its PATH, or never answer ("stall": FILE, where it writes its pid). With "count_stdin", the fake ssh relays its stdin and logs how many bytes went to the host
("stdin_bytes"): what crossed the wire, every attempt included. The fake docker keeps "loaded" images
(and their layers' diff_ids) in a state file in that HOME; `load` reads its stdin as a tar stream,
records whether it was a pipe, checks every blobs/sha256/<hex> member against <hex>, and, like docker,
needs no file for a layer whose chain it already holds.
The lab (checks/lab/test_ship_lab.py) does the same against real sshd and dockerd.
"""

import json
import os
import sys
from pathlib import Path

FAKE_SSH = r'''#!{python}
import json, os, shlex, subprocess, sys
args = sys.argv[1:]
targets = json.loads(os.environ["FAKE_TARGETS"])
if "-G" in args:
    print("hostname " + args[-1].rpartition("@")[2]); print("port 22"); sys.exit(0)
i = args.index("--")
target, command = args[i - 1], args[i + 1]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"argv": ["ssh"] + args}) + "\n")
t = targets.get(target)
if t is None:
    print("ssh: Could not resolve hostname %s: Name or service not known" % target, file=sys.stderr)
    sys.exit(255)
if t.get("fail"):
    print(t["fail"], file=sys.stderr)
    sys.exit(255)
if t.get("stall"):  # a connection that never answers: says its pid (written whole), then waits to be stopped
    with open(t["stall"] + ".new", "w") as f:
        f.write(str(os.getpid()))
    os.rename(t["stall"] + ".new", t["stall"])
    import time
    time.sleep(3600)
env = {k: v for k, v in os.environ.items() if k not in ("XDG_DATA_HOME", "HF_HOME", "PYTHONPATH")}
env.update(HOME=t["home"], FAKE_STATE=os.path.join(t["home"], ".engine.json"))
if t.get("path") is not None:
    env["PATH"] = t["path"]
if not t.get("count_stdin"):
    sys.exit(subprocess.call(shlex.split(command), env=env))
# Relay stdin to the remote command, counting every byte that crosses "the wire" towards the host.
child = subprocess.Popen(shlex.split(command), env=env, stdin=subprocess.PIPE, bufsize=0)
crossed = 0
while True:
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    try:
        child.stdin.write(chunk)
    except BrokenPipeError:
        break
    crossed += len(chunk)
try:
    child.stdin.close()
except BrokenPipeError:
    pass
code = child.wait()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({"stdin_bytes": crossed, "target": target, "command": command}) + "\n")
sys.exit(code)
'''

FAKE_DOCKER = r'''#!{python}
import hashlib, json, os, stat, sys, tarfile
args = sys.argv[1:]
state_path = os.environ["FAKE_STATE"]
state = json.load(open(state_path)) if os.path.exists(state_path) else {"ids": [], "names": {}, "layers": {}}
call = {"argv": ["docker"] + args}
if args[:1] == ["-H"]:
    call["host"] = args[1]
    args = args[2:]
def save():
    json.dump(state, open(state_path, "w"))
def lookup(ref):
    if ref in state["ids"]:
        return ref
    return state["names"].get(ref)
code = 0
if args[0] == "version":
    print("20.10.0-fake")
elif args[:1] == ["images"]:
    print("\n".join(state["ids"]))
elif args[:2] == ["image", "inspect"] and "{{json .RootFS.Layers}}" in args:
    for ref in args[4:]:
        print(json.dumps(state["layers"].get(lookup(ref) or "", [])))
elif args[:2] == ["image", "inspect"]:
    found = lookup(args[-1])
    if found:
        print(found)
    else:
        print("Error: No such image: " + args[-1], file=sys.stderr)
        code = 1
elif args[0] == "tag":
    state["names"][args[2]] = lookup(args[1])
    save()
elif args[0] == "load":
    call["stdin_is_pipe"] = stat.S_ISFIFO(os.fstat(0).st_mode)
    members, datas = {}, {}
    try:
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
            for m in tar:
                data = tar.extractfile(m).read()
                members[m.name] = hashlib.sha256(data).hexdigest()
                if m.name == "manifest.json":
                    manifest = json.loads(data)
                datas[m.name] = data
        entry = manifest[0]
        bad = [n for n, h in members.items() if n.startswith("blobs/sha256/") and n.split("/")[-1] != h]
        diff_ids = json.loads(datas[entry["Config"]])["rootfs"]["diff_ids"]
        chains = {tuple(l[:i + 1]) for l in state["layers"].values() for i in range(len(l))}
        needed = [p for i, p in enumerate(entry["Layers"]) if tuple(diff_ids[:i + 1]) not in chains]
        missing = [p for p in [entry["Config"]] + needed if p not in members]
        call["layer_members"] = len([p for p in entry["Layers"] if p in members])
        assert not bad and not missing, (bad, missing)
    except Exception as exc:
        print("Error: unexpected EOF or bad archive: %s" % exc, file=sys.stderr)
        code = 1
    else:
        image_id = "sha256:" + members[entry["Config"]]
        state["ids"].append(image_id)
        state["layers"][image_id] = diff_ids
        for t in entry["RepoTags"] or []:
            state["names"][t] = image_id
        call["members"] = sorted(members)
        save()
        print("Loaded image ID: " + image_id)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(call) + "\n")
sys.exit(code)
'''


def install(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("ssh", FAKE_SSH), ("docker", FAKE_DOCKER)):
        (bin_dir / name).write_text(text.replace("{python}", sys.executable))
        (bin_dir / name).chmod(0o755)


def bare_path(dir_: Path) -> str:
    """A PATH holding only python3: a host with no docker installed."""
    dir_.mkdir(parents=True, exist_ok=True)
    link = dir_ / "python3"
    if not link.exists():
        link.symlink_to(sys.executable)
    return str(dir_)


def calls(log: Path) -> list[dict]:
    return [json.loads(l) for l in log.read_text().splitlines()] if log.exists() else []


# Knobs and locations a developer's shell may set, which would leak into a test's "head" or "host".
UNSET = ("XDG_DATA_HOME", "HF_HOME", "IMAGE", "MODEL_CACHE_NAME", "DRAFT_CACHE_NAME", "WORKER_SSH",
         "SPARKSTACK_RECIPES", "DOCKER_HOST")


def env_for(bin_dir: Path, head_home: Path, targets: dict, log: Path) -> dict:
    """The whole environment of a `sparkstack ship` run on the fake head."""
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(head_home), FAKE_TARGETS=json.dumps(targets),
               FAKE_LOG=str(log))
    return env

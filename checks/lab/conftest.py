"""Fixtures that need real daemons and root. They skip with a reason where that is impossible,
and fail instead of skipping when SPARKSTACK_REQUIRE_LAB is set (CI sets it)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from daemons import DaemonError, Dockerd  # noqa: E402


def unavailable(reason: str):
    if os.environ.get("SPARKSTACK_REQUIRE_LAB"):
        pytest.fail(f"lab requirement missing (SPARKSTACK_REQUIRE_LAB is set): {reason}")
    pytest.skip(reason)


def require(*tools: str) -> None:
    if os.geteuid() != 0:
        unavailable("the lab needs root")
    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory):
    """One private dockerd in this network namespace, for the whole session."""
    require("dockerd", "docker")
    d = Dockerd(tmp_path_factory.mktemp("dockerd"))
    try:
        d.start()
    except DaemonError as exc:
        d.stop()
        pytest.fail(str(exc))
    yield d
    d.stop()


@pytest.fixture(scope="session")
def python_rootfs_tar():
    """A minbase Debian rootfs with python3 and its standard library, as one layer tar (rootfs.py: debootstrap
    once, cached on this machine)."""
    require("debootstrap")
    import rootfs

    try:
        return rootfs.ensure().read_bytes()
    except rootfs.NoMirror as exc:
        unavailable(str(exc))
    except rootfs.RootfsError as exc:
        pytest.fail(str(exc))


# ---------------------------------------------------------------- the two-host lab

import atexit  # noqa: E402
import signal  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402

from lab import Lab, new_tag  # noqa: E402

STANDIN = Path(__file__).parent / "standin_engine.py"
STANDIN_DEST = "entrypoints/standin_engine.py"  # under the vLLM root
PARSER_SITE = "usr/lib/python3/dist-packages"  # on the base's python3's path
STANDIN_PARSER = {
    "vllm/__init__.py": "",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/launchers/__init__.py": "",
    "vllm/entrypoints/launchers/cli_args.py": (
        "def make_arg_parser(parser):\n"
        "    # the stand-in engine takes any argv: what is not an option of its own is kept, never refused\n"
        "    parser.parse_args = lambda args=None, namespace=None: parser.parse_known_args(args, namespace)[0]\n"
        "    return parser\n"),
    "vllm/utils/__init__.py": "",
    "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
}
# The stand-in image's runtime gates: its engine and its parser are where the container will look for them.
STANDIN_GATES = [["python3", "-c", "import vllm.entrypoints.launchers.cli_args"],
                 ["python3", "-c", f"import ast; ast.parse(open('/usr/local/lib/python3.12/dist-packages/vllm/"
                                   f"{STANDIN_DEST}').read())"]]


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """Head and worker namespaces with dockerd each, sshd on the worker. Torn down in every case."""
    require("ip", "nsenter", "unshare", "dockerd", "docker", "sshd", "ssh", "ssh-keygen", "rsync")
    root = Path(os.environ.get("SPARKSTACK_LAB_ROOT") or tmp_path_factory.mktemp("lab"))
    the_lab = Lab(root, tag=os.environ.get("SPARKSTACK_LAB_TAG") or new_tag())
    atexit.register(the_lab.stop)  # also on paths where pytest's own teardown does not run
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a plain `kill` still reaches atexit
    try:
        the_lab.start()
    except Exception as exc:
        the_lab.stop()
        pytest.fail(f"lab did not start: {exc}")
    print(f"\nlab up in {the_lab.startup_s:.2f} s")
    yield the_lab
    the_lab.stop()


@pytest.fixture(scope="session")
def standin_image(tmp_path_factory, python_rootfs_tar):
    """The stand-in engine image, built by sparkstack's own image builder. Returns (tar path, result)."""
    import imagefix as fx

    work = tmp_path_factory.mktemp("standin")
    base = work / "base"
    vllm_skeleton = [(f"{fx.VLLM}/__init__.py", "file", "")]
    for i in range(1, len(fx.VLLM.split("/"))):
        vllm_skeleton.insert(i - 1, ("/".join(fx.VLLM.split("/")[:i]), "dir", None))
    # The stand-in's own "vllm serve" parser, where the image's python3 imports it: launch's gates run by default,
    # and the argv gate asks the image's parser. The stand-in takes any argv (it records it), so its parser refuses
    # nothing; vLLM's real parser judges the argv in checks/engine/test_vllm_argv.py and test_argv_gate_lab.py.
    for path, text in STANDIN_PARSER.items():
        for d in fx._dirs(f"{PARSER_SITE}/{path}"):
            if d not in vllm_skeleton:
                vllm_skeleton.append(d)
        vllm_skeleton.append((f"{PARSER_SITE}/{path}", "file", text))
    fx.write_base(base, layers=[("none", python_rootfs_tar), ("gzip", vllm_skeleton)], arch="amd64",
                  entrypoint=["python3", f"/{fx.VLLM}/{STANDIN_DEST}"])
    src = work / "src" / "overlay-dflash2"
    src.mkdir(parents=True)
    (src / "standin_engine.py").write_bytes(STANDIN.read_bytes())
    sha = hashlib.sha256(STANDIN.read_bytes()).hexdigest()
    (work / "overlay").mkdir()
    (work / "overlay" / "overlay.toml").write_text(
        f'name = "standin"\n[image]\nname = "sparkstack/standin-engine"\n'
        f'[source]\nrepo = "sparkstack/lab"\nrev = "{fx.REV}"\nsubdir = "overlay-dflash2"\n'
        f'[[install]]\nsrc = "standin_engine.py"\ndest = "{STANDIN_DEST}"\nsha256 = "{sha}"\n'
        f'[gates]\nruntime = {json.dumps(STANDIN_GATES)}\n')
    out = work / "standin.tar"
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(base), "--overlay",
                           str(work / "overlay"), "--overlay-src", str(work / "src"), "--out", str(out),
                           "--platform", "linux/amd64", "--json"], capture_output=True, text=True,
                          env=dict(os.environ, SPARKSTACK_CACHE_DIR=str(work / "cache")))
    if proc.returncode != 0:
        pytest.fail(f"stand-in image build failed: {proc.stderr}")
    return out, json.loads(proc.stdout)["result"]


@pytest.fixture(scope="session")
def lab_with_image(lab, standin_image):
    """The lab with the stand-in image loaded into both hosts' dockerd."""
    tar, result = standin_image
    for host in lab.hosts.values():
        host.docker("load", "-i", str(tar))
    return lab, result

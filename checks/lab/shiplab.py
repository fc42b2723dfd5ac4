"""What the ship lab tests and the ship benchmark share: a runnable image, synthetic cache entries, a recipe
naming the lab's workers, and `sparkstack ship` run on the head as a user there would run it.

The image is busybox (so the worker's docker can really run it) under a fake vLLM root, plus an
overlay that installs one payload file: changing that file is the one-file overlay change.
Synthetic weights are valid safetensors files of random bytes, laid out as hub cache entries.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import imagefix as fx

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "cat", "echo", "sha256sum", "ls")
MIB = 1 << 20
HEAD_HUB = ".cache/huggingface/hub"  # under the head's HOME, as launch's default HF_HOME puts it
WORKER_HUB = "/root/.cache/huggingface/hub"


class _Random(io.RawIOBase):
    """`size` bytes from one random MiB, repeated: quick to make, and nothing here compresses anyway."""

    def __init__(self, size: int) -> None:
        self.left, self.block, self.pos = size, os.urandom(MIB), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left, MIB - self.pos)
        buf[:n] = self.block[self.pos:self.pos + n]
        self.pos = (self.pos + n) % MIB
        self.left -= n
        return n


def busybox_base(out: Path, filler_bytes: int = 0) -> Path:
    """An OCI layout: one plain layer with busybox, its applets, the vLLM root's dirs and a filler file."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    tmp = out / "layer.tmp"
    h = hashlib.sha256()

    class _Hashed(io.RawIOBase):
        def __init__(self, f):
            self.f = f

        def writable(self) -> bool:
            return True

        def write(self, b) -> int:
            h.update(b)
            return self.f.write(b)

    with open(tmp, "wb") as f, tarfile.open(fileobj=_Hashed(f), mode="w|", format=tarfile.GNU_FORMAT) as tar:
        def add(name, kind, payload=None, mode=0o755, size=0):
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1_700_000_000, mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload
                tar.addfile(info)
            else:
                info.size = size
                tar.addfile(info, payload)

        add("bin", "dir")
        add("bin/busybox", "file", open(BUSYBOX, "rb"), size=BUSYBOX.stat().st_size)
        for applet in APPLETS:
            add(f"bin/{applet}", "symlink", "busybox")
        parts = fx.VLLM.split("/")
        for i in range(1, len(parts) + 1):
            add("/".join(parts[:i]), "dir")
        add(f"{fx.VLLM}/__init__.py", "file", io.BytesIO(b""), mode=0o644)
        if filler_bytes:
            add("opt", "dir")
            add("opt/filler.bin", "file", _Random(filler_bytes), mode=0o644, size=filler_bytes)
    diff_id = "sha256:" + h.hexdigest()
    size = tmp.stat().st_size
    tmp.rename(blobs / diff_id.split(":")[1])

    def put(data: bytes) -> tuple[str, int]:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        return "sha256:" + d, len(data)

    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Env": ["PATH=/bin"], "Entrypoint": ["/bin/busybox"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                         "history": [{"created_by": "busybox base"}]}).encode()
    cfg, cfg_size = put(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg,
                                      "size": cfg_size},
                           "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": diff_id,
                                       "size": size}]}).encode()
    man, man_size = put(manifest)
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man, "size": man_size,
         "platform": {"os": "linux", "architecture": "amd64"}}]}))
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return out


def build_image(base: Path, work: Path, out: Path, payload: bytes, env: dict | None = None) -> dict:
    """`sparkstack image build` of the base plus an overlay installing payload.bin under the vLLM root."""
    src = work / f"{out.name}-src" / "overlay-dflash2"
    src.mkdir(parents=True)
    (src / "payload.bin").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    overlay = work / f"{out.name}-overlay"
    overlay.mkdir()
    (overlay / "overlay.toml").write_text(
        f'name = "shiplab"\n[image]\nname = "sparkstack/shiplab"\n'
        f'[source]\nrepo = "sparkstack/lab"\nrev = "{fx.REV}"\nsubdir = "overlay-dflash2"\n'
        f'[[install]]\nsrc = "payload.bin"\ndest = "payload.bin"\nsha256 = "{sha}"\n')
    proc = subprocess.run([sys.executable, "-m", "sparkstack.cli", "image", "build", "--base", str(base),
                           "--overlay", str(overlay), "--overlay-src", str(src.parent), "--out", str(out),
                           "--platform", "linux/amd64", "--json"], capture_output=True, text=True,
                          env={**os.environ, **(env or {}), "SPARKSTACK_CACHE_DIR": str(work / "oci-cache")})
    if proc.returncode != 0:
        raise RuntimeError(f"image build failed: {proc.stderr}")
    return json.loads(proc.stdout)["result"]


def blob_sizes(layout: Path) -> dict[str, int]:
    return {"sha256:" + p.name: p.stat().st_size for p in (layout / "blobs/sha256").iterdir()}


def write_entry(hub: Path, repo_id: str, shard_bytes: list[int], revision: str) -> Path:
    """A cache entry of valid safetensors shards of random bytes (named by sha256) and small files (git sha1)."""
    import synth

    flat = hub.parent / f"flat-{repo_id.replace('/', '--')}-{revision[:8]}"
    flat.mkdir(parents=True)
    weight_map = {}
    for i, size in enumerate(shard_bytes):
        name = f"model-{i + 1:05d}-of-{len(shard_bytes):05d}.safetensors"
        synth.write_raw_shard(flat / name, [(f"model.layers.{i}.w", size)], os.urandom(MIB))
        weight_map[f"model.layers.{i}.w"] = name
    (flat / "config.json").write_text(json.dumps({"num_hidden_layers": len(shard_bytes), "tag": revision}))
    (flat / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    entry = synth.cache_from_dir(flat, hub, repo_id=repo_id, revision=revision)
    shutil.rmtree(flat)
    return entry


def recipe(lab, work: Path, workers: list[str]) -> Path:
    """A plain recipe whose nodes are the lab's head and the named workers, each with its fabric IP and docker."""
    nodes = f'[[nodes]]\nhost = "head"\nfabric_ip = "{lab.head.fabric_ip}"\ndocker_host = "{lab.head.dockerd.host}"\n\n'
    for name in workers:
        w = lab.hosts[name]
        nodes += f'[[nodes]]\nhost = "{name}"\nssh = "{name}"\nfabric_ip = "{w.fabric_ip}"\n'
        if w.dockerd is not None:
            nodes += f'docker_host = "{w.dockerd.host}"\n'
        nodes += "\n"
    text = (f'engine = "vllm"\nname = "shiplab"\ndocker_image = "sparkstack/shiplab:none"\nmodel = "lab/model"\n'
            f'required_nodes = {len(workers) + 1}\ntensor_parallel_size = 2\npipeline_parallel_size = 1\n'
            f'distributed_backend = "mp"\nshm_size = "1g"\nargs = []\n\n{nodes}')
    path = work / f"recipe-{'-'.join(workers)}.toml"
    path.write_text(text)
    return path


def head_env(head_home: Path, extra: dict | None = None) -> dict:
    """The head user's environment: its own HOME (so ~ means the head's), no knob or location overrides."""
    drop = ("XDG_DATA_HOME", "HF_HOME", "IMAGE", "MODEL_CACHE_NAME", "DRAFT_CACHE_NAME", "SPARKSTACK_RECIPES")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["HOME"] = str(head_home)
    env.update(extra or {})
    return env


def ship(lab, env: dict, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    """`sparkstack ship` on the head, inside the head's network namespace."""
    return lab.head.run(sys.executable, "-m", "sparkstack.cli", "ship", *map(str, args), check=False, env=env,
                        timeout=timeout)


def ship_popen(lab, env: dict, *args) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", lab.head.netns, sys.executable, "-m", "sparkstack.cli", "ship",
                             *map(str, args)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

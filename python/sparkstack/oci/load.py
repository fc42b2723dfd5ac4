"""`image load`: stream an image into docker or podman as a docker-archive made on the fly, with no temp tar.

The archive is written straight into the engine's `load` (locally through a plumbum pipeline,
or across ssh's stdin to a rank): `manifest.json` first, then the config and each layer
blob, read from the image's own blobs (symlinked blobs are followed) and hashed as they
pass. A blob that does not match its digest kills the load before its tar can end, so the
engine never commits it. Afterwards the engine's image ID must equal the config digest.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sparkstack.errors import SparkstackError, UsageError
from sparkstack.oci.model import CONTAINERD_NAME, Image, digest_hex
from sparkstack.oci.source import BlobSource, DockerArchive, LayoutDir, TarArchive, open_image
from sparkstack.remote import Runner, failure_line
from sparkstack.units import human_bytes

ENGINES = ("docker", "podman")
CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE


# ---------------------------------------------------------------- the engine, read-only


def engine_argv(engine: str, runner: Runner, *args: str) -> list[str]:
    return runner.docker(*args) if engine == "docker" else ["podman", *args]


def _normal_id(text: str) -> str:
    text = text.strip()
    return text if text.startswith("sha256:") else f"sha256:{text}"


def engine_version(engine: str, runner: Runner) -> str:
    """The engine's server version; a one-line error when it cannot be reached (read-only)."""
    fmt = "{{.Server.Version}}" if engine == "docker" else "{{.Version}}"
    proc = runner.run(engine_argv(engine, runner, "version", "--format", fmt), timeout=60)
    if proc.returncode != 0:
        raise SparkstackError(f"{engine} on {runner.label} is not reachable: {failure_line(proc)}")
    return proc.stdout.strip()


def image_id(engine: str, runner: Runner, ref: str) -> str | None:
    """The ID the engine holds under `ref` (a name or an ID), or None when it holds none (read-only)."""
    proc = runner.run(engine_argv(engine, runner, "image", "inspect", "--format", "{{.Id}}", ref), timeout=60)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return _normal_id(proc.stdout.splitlines()[0])


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class LoadPlan:
    path: Path
    engine: str
    where: str
    engine_version: str
    name: str | None  # the tag to load under: index.json's io.containerd.image.name
    config_digest: str  # the image ID it must have once loaded
    manifest_digest: str
    layers: tuple[tuple[str, int], ...]  # (digest, size) in manifest order
    load_argv: tuple[str, ...]  # what runs, ssh included
    action: str  # "load", "tag" (the ID is there, the name is not) or "up to date"

    @property
    def up_to_date(self) -> bool:
        return self.action == "up to date"

    @property
    def bytes_to_send(self) -> int:
        if self.action != "load":
            return 0
        return sum(size for _, size in dict(self.layers).items())

    def to_json(self) -> dict:
        return {"path": str(self.path), "engine": self.engine, "where": self.where,
                "engine_version": self.engine_version, "name": self.name, "config_digest": self.config_digest,
                "manifest_digest": self.manifest_digest,
                "layers": [{"digest": d, "size": s} for d, s in self.layers], "action": self.action,
                "bytes_to_send": self.bytes_to_send, "load_argv": list(self.load_argv)}

    def lines(self) -> list[str]:
        """The human form (`image load --dry-run`)."""
        if self.up_to_date:
            return [f"up to date: {self.engine} on {self.where} holds {self.name or self.config_digest} "
                    f"as {self.config_digest}"]
        lines = [f"would {self.action} {self.name or '(untagged)'} into {self.engine} on {self.where}: "
                 f"image ID {self.config_digest}, {len(self.layers)} layers, {human_bytes(self.bytes_to_send)}"]
        if self.action == "load":
            lines.append(f"  stream into: {' '.join(self.load_argv)}")
        return lines


def _checked_name(name: str, src: BlobSource) -> str:
    """A name taken from someone's layout becomes an engine argument: it must read as an image reference."""
    if name.startswith("-") or len(name) > 255 or any(c.isspace() or not c.isprintable() for c in name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise SparkstackError(f"{src.label}: the image is named {shown!r}, which is not an image reference")
    return name


def image_name(src: BlobSource, image: Image) -> str | None:
    """index.json's io.containerd.image.name for this image (a docker archive: its first RepoTag)."""
    raw = None
    try:
        if isinstance(src, DockerArchive):
            tags = src.read_json("manifest.json")[0].get("RepoTags") or []
            raw = tags[0] if tags and isinstance(tags[0], str) else None
        elif isinstance(src, (LayoutDir, TarArchive)):
            entries = src.read_json("index.json").get("manifests") or []
            chosen = [e for e in entries if isinstance(e, dict) and e.get("digest") == image.manifest_digest]
            if not chosen and len(entries) == 1:  # a nested index: the name sits on its entry
                chosen = entries
            name = ((chosen[0].get("annotations") or {}).get(CONTAINERD_NAME)) if chosen else None
            raw = name if isinstance(name, str) and name else None
    except (AttributeError, IndexError, TypeError, SparkstackError):
        return None
    return None if raw is None else _checked_name(raw, src)


def check_engine_options(engine: str, docker_host: str | None) -> None:
    if engine not in ENGINES:
        raise UsageError(f"--engine {engine!r}: expected docker or podman")
    if docker_host and engine != "docker":
        raise UsageError("--docker-host applies to --engine docker only")


def plan_load(path: Path, engine: str, runner: Runner, platform: str | None = None) -> LoadPlan:
    """Read the image's documents and ask the engine (read-only) whether it already holds the image."""
    src, image = open_image(path, platform)
    try:
        name = image_name(src, image)
    finally:
        src.close()
    version = engine_version(engine, runner)
    held = image_id(engine, runner, image.config_digest) == image.config_digest
    if held and (name is None or image_id(engine, runner, name) == image.config_digest):
        action = "up to date"
    elif held:
        action = "tag"
    else:
        action = "load"
    layers = tuple((l.digest, l.size) for l in image.layers)
    argv = tuple(runner.argv(engine_argv(engine, runner, "load")))
    return LoadPlan(path, engine, runner.label, version, name, image.config_digest, image.manifest_digest, layers,
                    argv, action)


# ---------------------------------------------------------------- the stream


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(format=tarfile.GNU_FORMAT)  # GNU base-256 sizes carry blobs over 8 GiB


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


def docker_manifest(image: Image, name: str | None) -> bytes:
    """The docker-archive's manifest.json: blobs named by digest, as in an OCI layout."""
    return json.dumps([{
        "Config": f"blobs/sha256/{digest_hex(image.config_digest)}",
        "RepoTags": [name] if name else [],
        "Layers": [f"blobs/sha256/{digest_hex(l.digest)}" for l in image.layers],
    }]).encode()


def write_docker_archive(out: BinaryIO, src: BlobSource, image: Image, name: str | None,
                         on_progress: Callable[[int], None] | None = None) -> int:
    """Write the image as a docker-archive tar stream to `out`. Returns the bytes written.

    Each blob is hashed on the way; a mismatch raises before the blob's member is complete,
    so a reader of the stream never sees a whole, wrong archive."""
    written = 0

    def put(data: bytes | memoryview) -> None:
        nonlocal written
        out.write(data)
        written += len(data)

    manifest = docker_manifest(image, name)
    put(_tar_header("manifest.json", len(manifest)) + manifest + _padding(len(manifest)))
    config = src.read_blob(image.config_digest, image.manifest["config"]["size"], "config")  # size and digest checked
    put(_tar_header(f"blobs/sha256/{digest_hex(image.config_digest)}", len(config)) + config + _padding(len(config)))
    buf = bytearray(CHUNK)
    done = set()
    for layer in image.layers:
        if layer.digest in done:  # the same blob twice in one image is one member
            continue
        done.add(layer.digest)
        h = hashlib.sha256()
        with src.open_blob(layer.digest) as f:
            put(_tar_header(f"blobs/sha256/{digest_hex(layer.digest)}", layer.size))
            left = layer.size
            while left:
                n = f.readinto(memoryview(buf)[:min(CHUNK, left)])
                if not n:
                    raise SparkstackError(f"{src.label}: blob {layer.digest} is shorter than its {layer.size} bytes")
                view = memoryview(buf)[:n]
                h.update(view)
                left -= n
                if not left and "sha256:" + h.hexdigest() != layer.digest:
                    raise SparkstackError(f"{src.label}: blob {layer.digest} does not match its digest; load aborted")
                put(view)
                if on_progress:
                    on_progress(n)
            if f.read(1):
                raise SparkstackError(f"{src.label}: blob {layer.digest} is longer than its {layer.size} bytes")
        put(_padding(layer.size))
    put(b"\0" * (2 * _BLOCK))
    return written


# ---------------------------------------------------------------- apply


@dataclass(frozen=True)
class LoadResult:
    action: str
    image_id: str
    name: str | None
    bytes_sent: int
    seconds: float

    def to_json(self) -> dict:
        return dict(self.__dict__)

    def lines(self, plan: LoadPlan) -> list[str]:
        """The human form of what a load did."""
        if plan.up_to_date:
            return [f"up to date: {plan.engine} on {plan.where} holds {plan.name or plan.config_digest} as {self.image_id}"]
        verb = "loaded" if plan.action == "load" else "tagged"
        return [f"{verb} {plan.name or '(untagged)'} into {plan.engine} on {plan.where}: image ID {self.image_id}"
                + (f" ({human_bytes(self.bytes_sent)} streamed in {self.seconds:.1f} s)" if self.bytes_sent else "")]


def _drain(stream, sink: list[bytes]) -> threading.Thread:
    t = threading.Thread(target=lambda: sink.append(stream.read()), daemon=True)
    t.start()
    return t


def stream_into(argv: list[str], write: Callable[[BinaryIO], int]) -> tuple[int, str]:
    """Run `argv` and feed its stdin with `write`. Returns (bytes written, the loader's output).

    If `write` fails, the loader is killed before the stream can end cleanly."""
    proc = Runner().popen(argv)  # argv is whole already (ssh included): run it here
    out: list[bytes] = []
    err: list[bytes] = []
    threads = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
    sent = 0
    try:
        try:
            sent = write(proc.stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the loader stopped reading: its exit status and stderr say why
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    code = proc.wait()
    for t in threads:
        t.join(timeout=30)
    text = (b"".join(out) + b"\n" + b"".join(err)).decode(errors="replace").strip()
    if code != 0:
        lines = [l for l in b"".join(err).decode(errors="replace").splitlines() if l.strip()] or text.splitlines()
        raise SparkstackError(f"{argv[0]} exited {code}: {lines[-1].strip() if lines else 'no output'}")
    return sent, text


def apply_load(plan: LoadPlan, runner: Runner, platform: str | None = None,
               on_progress: Callable[[int], None] | None = None) -> LoadResult:
    t0 = time.monotonic()
    sent = 0
    if plan.action == "tag":
        proc = runner.run(engine_argv(plan.engine, runner, "tag", plan.config_digest, plan.name), timeout=120)
        if proc.returncode != 0:
            raise SparkstackError(f"{plan.engine} tag on {plan.where}: {failure_line(proc)}")
    elif plan.action == "load":
        src, image = open_image(plan.path, platform)
        try:
            if image.manifest_digest != plan.manifest_digest:
                raise SparkstackError(f"{plan.path}: the image changed since it was planned; run again")
            sent, _ = stream_into(list(plan.load_argv),
                                  lambda out: write_docker_archive(out, src, image, plan.name, on_progress))
        finally:
            src.close()
    ref = plan.name or plan.config_digest
    got = image_id(plan.engine, runner, ref)
    if got is None:
        raise SparkstackError(f"{plan.engine} on {plan.where} has no image {ref} after the {plan.action}")
    if got != plan.config_digest:
        raise SparkstackError(f"{plan.engine} on {plan.where} holds {ref} as {got}, not the config digest "
                              f"{plan.config_digest}")
    return LoadResult(plan.action, got, plan.name, sent, round(time.monotonic() - t0, 3))

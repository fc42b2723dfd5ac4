"""What the head has to ship, read from local inputs only: an image, cache entries, and the targets.

- An image comes from a built OCI layout (dir or archive) or from the head's own sparkstack image
  store ($XDG_DATA_HOME/sparkstack: `blobs/sha256/`, and one small OCI layout per image under
  `images/<config hex>/` whose `blobs` links to the shared blobs). It is never `docker save`.
- A cache entry is read through hfcache at refs/main: its blobs and the links that name them.
- A target is a recipe node (its ssh target, fabric address, docker_host and hub) or a plain ssh target.
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

from sparkstack import fsio
from sparkstack.deploy import Deployment
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.hfcache import entry_for_copy, hub_path
from sparkstack.oci.load import image_name
from sparkstack.oci.model import CONTAINERD_NAME, MANIFEST_V1, canonical_json, digest_hex, sha256_digest
from sparkstack.oci.source import BlobSource, DockerArchive, LayoutDir, TarArchive, open_image
from sparkstack.remote import Runner, host_key_alias
from sparkstack.ship.plan import Blob, EntryToShip, ImageToShip, Target

_DIGEST = re.compile(r"(sha256:)?[0-9a-f]{64}")
STORE_BLOBS = "blobs/sha256"  # relative to a store root, on the head and on every host


def store_dir() -> Path:
    """This machine's sparkstack store (the same place the helper uses on a host)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "sparkstack"


# ---------------------------------------------------------------- the image


def _extent(src: BlobSource, digest: str) -> tuple[Path, int]:
    """The file and offset holding a blob's bytes, so each stream can read (sendfile) it independently."""
    if isinstance(src, LayoutDir):
        return src.blob_file(digest).resolve(), 0
    if isinstance(src, DockerArchive) and digest in src.by_digest:
        return Path(src.label), src.members[src.by_digest[digest]].offset_data
    if isinstance(src, TarArchive):
        member = src.members.get(f"blobs/sha256/{digest_hex(digest)}")
        if member is None:
            raise SparkstackError(f"{src.label}: blob {digest} is missing")
        return Path(src.label), member.offset_data
    raise SparkstackError(f"{src.label}: cannot locate blob {digest}")


def _store_blob(key: str, digest: str, size: int, **where) -> Blob:
    return Blob(key, "store", STORE_BLOBS, digest_hex(digest), "sha256", digest_hex(digest), size, **where)


def image_to_ship(path: Path, platform: str | None) -> ImageToShip:
    """Read an image's documents (verified against their digests) and locate every blob's bytes."""
    src, image = open_image(path, platform)
    try:
        config = src.read_blob(image.config_digest, image.manifest["config"]["size"], "config")
        manifest = canonical_json(image.manifest)
        if sha256_digest(manifest) != image.manifest_digest:  # a layout's own manifest bytes, as stored
            with src.open_blob(image.manifest_digest) as f:
                manifest = f.read(4 << 20)
            if sha256_digest(manifest) != image.manifest_digest:
                raise SparkstackError(f"{path}: manifest {image.manifest_digest} does not match its digest")
        blobs = [_store_blob(image.manifest_digest, image.manifest_digest, len(manifest), data=manifest),
                 _store_blob(image.config_digest, image.config_digest, len(config), data=config)]
        seen = {image.manifest_digest, image.config_digest}
        for layer in image.layers:
            if layer.digest in seen:
                continue
            seen.add(layer.digest)
            file, offset = _extent(src, layer.digest)
            blobs.append(_store_blob(layer.digest, layer.digest, layer.size, source=file, offset=offset))
        name = image_name(src, image)
    finally:
        src.close()
    entry = {"mediaType": image.manifest.get("mediaType", MANIFEST_V1), "digest": image.manifest_digest,
             "size": len(manifest), "platform": _platform(image.platform)}
    if name:
        entry["annotations"] = {CONTAINERD_NAME: name}
    return ImageToShip(Path(path), image.config_digest, image.manifest_digest, name,
                       tuple(l.digest for l in image.layers), tuple(l.diff_id for l in image.layers), tuple(blobs), entry)


def _platform(text: str) -> dict:
    parts = text.split("/")
    out = {"os": parts[0], "architecture": parts[1] if len(parts) > 1 else ""}
    if len(parts) > 2:
        out["variant"] = parts[2]
    return out


def find_in_store(ref: str, store: Path | None = None) -> Path | None:
    """The head store's layout for a config digest, or for an image name recorded in its index."""
    images = (store or store_dir()) / "images"
    if _DIGEST.fullmatch(ref):
        d = images / ref.rpartition(":")[2]
        return d if (d / "index.json").is_file() else None
    if not images.is_dir():
        return None
    for d in sorted(images.iterdir()):
        try:
            entries = json.loads((d / "index.json").read_text()).get("manifests") or []
        except (OSError, ValueError, AttributeError):
            continue
        if any(isinstance(e, dict) and (e.get("annotations") or {}).get(CONTAINERD_NAME) == ref for e in entries):
            return d
    return None


def resolve_image(arg: str, from_flag: bool, head: Runner, platform: str | None) -> ImageToShip:
    """--image PATH|DIGEST, or (not from the flag) the IMAGE launch would run: a layout path, a name or digest
    the head's store records, or a reference whose ID the head's docker knows (asked read-only)."""
    path = Path(arg).expanduser()
    if path.exists():
        return image_to_ship(path.absolute(), platform)
    found = find_in_store(arg)
    if found is None and not _DIGEST.fullmatch(arg):
        from sparkstack.oci.load import image_id

        held = image_id("docker", head, arg)
        found = find_in_store(held) if held else None
    if found is None:
        what = "--image" if from_flag else "IMAGE (what launch would run)"
        raise SparkstackError(f"{what} {arg}: neither an OCI layout nor an image in the head's sparkstack store "
                              f"({store_dir() / 'images'}); pass --image PATH (a built layout), or --no-image")
    return image_to_ship(found, platform)


def remember_image(image: ImageToShip, store: Path | None = None) -> str | None:
    """Record a shipped layout in the head's store, so `--image DIGEST` finds it later. Blobs are hardlinked
    (symlinked to their real path where a hardlink is refused, as for Nix store files); never copied.
    Returns a line saying what changed, or None when the store already had it."""
    store = store or store_dir()
    layout = store / "images" / digest_hex(image.config_digest)
    if image.path.is_relative_to(store) or (layout / "index.json").is_file():
        return None
    blobs = store / STORE_BLOBS
    blobs.mkdir(parents=True, exist_ok=True)
    for b in image.blobs:
        dest = blobs / b.name
        if dest.exists():
            continue
        tmp = blobs / f".{b.name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        if b.data is not None:
            fsio.write_durable(tmp, b.data)
        elif b.offset != 0:
            return "not recorded in the head's store (an image archive: its blobs are tar members)"
        else:
            try:
                os.link(b.source, tmp)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    raise
                os.symlink(b.source, tmp)
        os.replace(tmp, dest)
    layout.mkdir(parents=True, exist_ok=True)
    if not os.path.lexists(layout / "blobs"):
        os.symlink("../../blobs", layout / "blobs")
    fsio.write_atomic(layout / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    fsio.write_atomic(layout / "index.json",
                      json.dumps({"schemaVersion": 2, "manifests": [image.index_entry]}, sort_keys=True).encode())
    return f"recorded in the head's store: {layout}"


# ---------------------------------------------------------------- cache entries


def entries_to_ship(hub: Path, names: tuple[str, ...]) -> tuple[EntryToShip, ...]:
    out = []
    for name in dict.fromkeys(names):
        layout, blobs = entry_for_copy(hub, name)
        out.append(EntryToShip(layout, tuple(
            Blob(f"{name}/{b.name}", "hub", layout.blobs_dir, b.name, b.algorithm, b.name, b.size, source=b.path)
            for b in blobs)))
    return tuple(out)


# ---------------------------------------------------------------- targets


def make_target(host: str, ssh: str, hub_home: str, docker_host: str | None, fabric_ip: str | None, via: str | None,
                ssh_config: Path | None) -> Target:
    """A host reached over ssh with bulk options; on its fabric address when asked (or by default when it has one),
    checking the same host key it has on the management network."""
    runner = Runner(ssh=ssh, ssh_config=ssh_config, docker_host=docker_host, bulk=True)
    chosen = via or ("fabric" if fabric_ip else "mgmt")
    if chosen == "fabric":
        if not fabric_ip:
            raise UsageError(f"--via fabric: {host} has no fabric address (only recipe nodes have one)")
        runner = runner.via(fabric_ip, host_key_alias(ssh, ssh_config))
    return Target(host, runner, chosen, hub_path(hub_home, remote=True), docker_host)


def _plain_target(value: str) -> str:
    """A HOST that is no recipe node is an ssh destination; one that looks like an option is refused."""
    if not value or value.startswith("-") or any(c.isspace() or not c.isprintable() for c in value):
        raise UsageError(f"HOST {value!r}: not a recipe node's host nor a plain ssh target")
    return value


def targets_from(deployment: Deployment, hosts: tuple[str, ...], via: str | None, ssh_config: Path | None) -> tuple[Target, ...]:
    """HOSTs by recipe node name (a plain ssh target otherwise); by default every worker node of the recipe."""
    ranks = {r.host: r for r in deployment.ranks}
    names = hosts or tuple(r.host for r in deployment.ranks if r.rank != 0)
    if not names:
        raise UsageError("the recipe has no worker nodes; name the hosts to ship to")
    home = deployment.knobs["HF_HOME"]
    out = []
    for name in dict.fromkeys(names):
        rank = ranks.get(name)
        if rank is None:
            out.append(make_target(name, _plain_target(name), home, None, None, via, ssh_config))
        elif rank.ssh is None:
            raise UsageError(f"{name} is rank {rank.rank}, this machine: nothing to ship to itself")
        else:
            out.append(make_target(name, rank.ssh, home, rank.docker_host, rank.fabric_ip, via, ssh_config))
    return tuple(out)



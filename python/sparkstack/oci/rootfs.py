"""The merged root filesystem of an image, as a container sees it: whiteouts, opaque dirs, links resolved inside."""

from __future__ import annotations

import posixpath
from collections.abc import Callable

from sparkstack.errors import SparkstackError
from sparkstack.oci.layers import Entry, LayerCache, LayerIndex, safe_member_path, scan_layer
from sparkstack.oci.model import Image
from sparkstack.oci.source import BlobSource, open_image

MAX_LINK_HOPS = 40

class RootFS:
    """The union of an image's layers, as a container sees it, for the paths asked of it."""

    def __init__(self, src: BlobSource, image: Image, cache: LayerCache | None = None,
                 on_progress: Callable[[int], None] | None = None) -> None:
        self.src, self.image = src, image
        self.cache = cache or LayerCache.default()
        self.on_progress = on_progress
        self.layers: list[LayerIndex] = []

    def index(self, capture: Callable[[str], bool]) -> None:
        """Load every layer's index, scanning (and verifying) only layers the cache does not know."""
        self.layers = []
        for layer in self.image.layers:
            cached = self.cache.load(layer.digest, self.src.blob_identity(layer.digest), layer.diff_id)
            self.layers.append(cached or scan_layer(self.src, layer, self.cache, capture, self.on_progress))

    def lookup(self, path: str) -> tuple[int, Entry] | None:
        """The topmost entry for an exact path, honouring whiteouts and opaque dirs; no link following."""
        ancestors = []
        d = posixpath.dirname(path)
        while d:
            ancestors.append(d)
            d = posixpath.dirname(d)
        for i in range(len(self.layers) - 1, -1, -1):
            entries = self.layers[i].entries
            e = entries.get(path)
            if e is not None and e.kind != "opaque":
                return None if e.kind == "whiteout" else (i, e)
            if e is not None and e.kind == "opaque":
                return (i, Entry(path, "dir", 0o755, 0, "", None))
            for a in ancestors:
                hidden = entries.get(a)
                if hidden is not None and hidden.kind in ("whiteout", "opaque", "file", "symlink", "hardlink"):
                    return None
        return None

    def resolve(self, path: str, follow_last: bool = True) -> str:
        """Resolve symlinks the way the container would; absolute links stay inside the root."""
        todo = [p for p in path.split("/") if p]
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == ".":
                continue
            if name == "..":
                if not done:
                    raise SparkstackError(f"{self.src.label}: {path!r} resolves outside the image root")
                done.pop()
                continue
            candidate = "/".join(done + [name])
            hit = self.lookup(candidate)
            if hit and hit[1].kind == "symlink" and (todo or follow_last):
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise SparkstackError(f"{self.src.label}: too many symlinks resolving {path!r}")
                target = hit[1].link
                if target.startswith("/"):
                    done = []
                todo = [p for p in target.split("/") if p] + todo
                continue
            done.append(name)
        return "/".join(done)

    def list_dir(self, directory: str) -> list[str]:
        """Names directly under `directory` in the merged view."""
        directory = self.resolve(directory)
        prefix = directory + "/" if directory else ""
        names = set()
        for layer in self.layers:
            for p in layer.entries:
                if p.startswith(prefix) and "/" not in p[len(prefix):]:
                    names.add(p[len(prefix):])
        return sorted(n for n in names if self.lookup(prefix + n) is not None)

    def read_files(self, paths: list[str]) -> dict[str, bytes | None]:
        """Contents of regular files (None where absent). Re-reads a layer only for contents not cached."""
        located: dict[str, tuple[int, Entry] | None] = {}
        for p in paths:
            located[p] = self._locate_file(p)
        contents = {p: self.cache.read_object(hit[1].sha256) for p, hit in located.items() if hit}
        missing_layers = {located[p][0] for p, data in contents.items() if data is None}
        for i in sorted(missing_layers):
            wanted = {hit[1].path for hit in located.values() if hit and hit[0] == i}
            self.layers[i] = scan_layer(self.src, self.image.layers[i], self.cache, wanted.__contains__, self.on_progress)
        out = {}
        for p, hit in located.items():
            data = contents.get(p) if hit else None
            if hit and data is None:
                data = self.cache.read_object(hit[1].sha256)
                if data is None:
                    raise SparkstackError(f"{self.src.label}: layer cache could not keep {p} (is {self.cache.root} writable?)")
            out[p] = data
        return out

    def _locate_file(self, path: str) -> tuple[int, Entry] | None:
        real = self.resolve(path)
        hit = self.lookup(real)
        if hit is None:
            return None
        i, e = hit
        if e.kind == "hardlink":
            target = safe_member_path(e.link, f"{self.src.label}: hardlink {e.path}")
            t = self.layers[i].entries.get(target)
            if t is None or t.kind != "file":
                raise SparkstackError(f"{self.src.label}: hardlink {e.path} points at {e.link!r}, not a file in its layer")
            return i, t
        if e.kind in ("device", "fifo", "other"):
            raise SparkstackError(f"{self.src.label}: {path} is a {e.kind} node; refusing to extract it")
        if e.kind != "file":
            raise SparkstackError(f"{self.src.label}: {path} is a {e.kind}, not a regular file")
        return hit


def open_rootfs(path, platform: str | None, paths: list[str], cache: LayerCache | None = None,
                on_progress: Callable[[int], None] | None = None) -> tuple[BlobSource, Image, RootFS]:
    """Open an image and index its layers, capturing the contents of `paths` on the way. The caller closes the source."""
    src, image = open_image(path, platform)
    try:
        rootfs = RootFS(src, image, cache, on_progress)
        wanted = set(paths)
        rootfs.index(wanted.__contains__)
    except BaseException:
        src.close()
        raise
    return src, image, rootfs

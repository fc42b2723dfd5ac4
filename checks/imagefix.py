"""Fixture base images and a fixture overlay, built here independently of sparkstack's own writer.

The base holds a fake vLLM tree whose files carry the anchors the fixture patch
scripts look for, spread over three layers (gzip or zstd, and plain) with a whiteout,
an opaque dir, and an absolute symlink inside the vLLM tree.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import textwrap
import zipfile
from pathlib import Path

import zstandard

VLLM = "usr/local/lib/python3.12/dist-packages/vllm"
SITE = "usr/local/lib/python3.12/dist-packages"
REV = "06b681991fb7ca6743c4fba535cdc7e8df78cd4b"

REGISTRY_PY = '''\
_SPECULATIVE_DECODING_MODELS = {
    "EagleLlamaForCausalLM": ("llama_eagle", "EagleLlamaForCausalLM"),
    "DFlashDraftModel": ("qwen3_dflash", "DFlashDraftModel"),
}


class ModelRegistry:
    @staticmethod
    def get_supported_archs():
        return list(_SPECULATIVE_DECODING_MODELS)
'''
SPEC_INIT_PY = '''\
def get_speculator(method):
    if method == "eagle":
        return "eagle"
    raise ValueError(method)
'''
GLM_MODEL_PY = '''\
class Glm5NextModel:
    def forward(self, hidden_states, positions):
        for layer in self.layers:
            hidden_states = layer(hidden_states, positions)
        return self.norm(hidden_states)
'''
KV_UTILS_PY = '''\
def unify_kv_cache_spec_page_size(specs):
    max_page = max(s.page_size_bytes for s in specs.values())
    for name, spec in specs.items():
        if max_page % spec.page_size_bytes != 0:
            raise NotImplementedError(f"{name}: page size is not divisible by the maximum page size and cannot be padded")
    return specs
'''
COORDINATOR_PY = '''\
class Coordinator:
    def __init__(self, groups):
        self.eagle_group_ids = set(range(len(groups)))
'''


def tar_bytes(entries: list[tuple]) -> bytes:
    """entries: (name, kind, payload) with kind file|dir|symlink|hardlink|char|fifo|whiteout|opaque."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if kind == "file":
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, payload
                tar.addfile(info)
            elif kind == "char":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
                tar.addfile(info)
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
                tar.addfile(info)
            else:
                raise ValueError(kind)
    return buf.getvalue()


def _dirs(path: str) -> list[tuple]:
    parts = path.split("/")
    return [("/".join(parts[:i]), "dir", None) for i in range(1, len(parts))]


def default_layers(registry: str = REGISTRY_PY, filler_bytes: int = 64 << 10,
                   compressions: tuple[str, str, str] = ("gzip", "gzip", "none")) -> list[tuple[str, list[tuple]]]:
    """Three layers: (compression, entries). Debian's umoci and docker 20.10 cannot read zstd layers,
    so zstd is opt-in (the reader tests use it)."""
    files1 = {
        f"{VLLM}/__init__.py": "",
        f"{VLLM}/model_executor/models/registry.py": registry,
        f"{VLLM}/model_executor/models/glm5next/nvidia/model.py": GLM_MODEL_PY,
        f"{VLLM}/v1/worker/gpu/spec_decode/__init__.py": SPEC_INIT_PY,
        f"{VLLM}/v1/core/kv_cache_utils.py": "OLD = 1\n",
        f"{VLLM}/v1/core/kv_cache_coordinator.py": COORDINATOR_PY,
        f"{VLLM}/stale.py": "gone soon\n",
        f"{VLLM}/old_dir/a.py": "hidden by an opaque dir\n",
        f"{SITE}/nvidia_nccl_cu13-2.29.7.dist-info/METADATA": "Name: nvidia-nccl-cu13\nVersion: 2.29.7\n",
        f"{SITE}/nvidia_nccl_cu13-2.29.7.dist-info/RECORD":
            "nvidia/nccl/lib/libnccl.so.2,,\nnvidia/nccl/include/nccl.h,,\n"
            "nvidia_nccl_cu13-2.29.7.dist-info/METADATA,,\nnvidia_nccl_cu13-2.29.7.dist-info/RECORD,,\n",
        f"{SITE}/nvidia/nccl/lib/libnccl.so.2": "nccl 2.29.7\n",
        f"{SITE}/nvidia/nccl/include/nccl.h": "old header\n",
        "usr/share/zoneinfo/UTC": "TZif\n",
    }
    layer1 = []
    for path in sorted(files1):
        layer1 += [d for d in _dirs(path) if d not in layer1]
        layer1.append((path, "file", files1[path]))
    layer1 += [("etc", "dir", None), ("etc/localtime", "symlink", "/usr/share/zoneinfo/UTC"),
               # An absolute link inside the tree: the GLM step reaches its file through it.
               (f"{VLLM}/models", "symlink", f"/{VLLM}/model_executor/models")]
    layer2 = _dirs(f"{VLLM}/v1/core/x") + [
        (f"{VLLM}/v1/core/kv_cache_utils.py", "file", KV_UTILS_PY),
        (f"{VLLM}/.wh.stale.py", "file", b""),
        (f"{VLLM}/old_dir", "dir", None),
        (f"{VLLM}/old_dir/.wh..wh..opq", "file", b""),
        (f"{VLLM}/old_dir/b.py", "file", "new content\n"),
    ]
    layer3 = [("opt", "dir", None), ("opt/filler.bin", "file", os.urandom(filler_bytes))]
    return list(zip(compressions, [layer1, layer2, layer3]))


def compress(kind: str, data: bytes) -> tuple[bytes, str]:
    if kind == "gzip":
        return gzip.compress(data, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"
    if kind == "zstd":
        return zstandard.ZstdCompressor().compress(data), "application/vnd.oci.image.layer.v1.tar+zstd"
    return data, "application/vnd.oci.image.layer.v1.tar"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_base(out: Path, layers=None, arch: str = "arm64", tag: str = "base",
               index_platform: bool = True, entrypoint: list[str] | None = None) -> dict:
    """Write an OCI layout dir. Returns {"config": digest, "manifest": digest, "layers": [digests]}."""
    layers = default_layers() if layers is None else layers
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        d = _sha(data)
        (blobs / d.split(":")[1]).write_bytes(data)
        return d

    descs, diff_ids = [], []
    for kind, entries in layers:
        raw = entries if isinstance(entries, bytes) else tar_bytes(entries)
        blob, media = compress(kind, raw)
        descs.append({"mediaType": media, "digest": put(blob), "size": len(blob)})
        diff_ids.append(_sha(raw))
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Labels": {"fixture": "base"},
                   **({"Entrypoint": entrypoint} if entrypoint else {})},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [{"created_by": f"fixture layer {i}"} for i in range(len(layers))],
    }).encode()
    cfg = put(config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg,
                                      "size": len(config)}, "layers": descs}).encode()
    man = put(manifest)
    desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": man, "size": len(manifest),
            "annotations": {"org.opencontainers.image.ref.name": tag}}
    if index_platform:
        desc["platform"] = {"os": "linux", "architecture": arch}
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    return {"config": cfg, "manifest": man, "layers": [d["digest"] for d in descs]}


def rootfs_tar(root: Path) -> bytes:
    """A whole directory tree (e.g. a debootstrap rootfs) as one layer's tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(root.iterdir()):
            tar.add(p, arcname=p.name)
    return buf.getvalue()


def layout_to_oci_archive(layout: Path, tar_path: Path) -> None:
    with tarfile.open(tar_path, "w") as tar:
        for p in sorted(layout.rglob("*")):
            tar.add(p, arcname=p.relative_to(layout).as_posix(), recursive=False)


def layout_to_docker_archive(layout: Path, tar_path: Path, edit=None) -> None:
    """A docker-save style archive: manifest.json naming config and layer files by path.

    `edit`, if given, maps the manifest.json document to another document, or to raw bytes."""
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text())
    blob = lambda d: (layout / "blobs/sha256" / d.split(":")[1]).read_bytes()  # noqa: E731
    with tarfile.open(tar_path, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        cfg_name = manifest["config"]["digest"].split(":")[1] + ".json"
        add(cfg_name, blob(manifest["config"]["digest"]))
        layer_names = []
        for i, l in enumerate(manifest["layers"]):
            name = f"layer{i}/layer.tar"
            add(name, blob(l["digest"]))
            layer_names.append(name)
        doc = [{"Config": cfg_name, "RepoTags": ["fixture/base:1"], "Layers": layer_names}]
        add("manifest.json", as_bytes(edit(doc) if edit else doc))


# ---------------------------------------------------------------- editing a layout's documents (hostile bases)


def as_bytes(doc) -> bytes:
    return doc if isinstance(doc, bytes) else json.dumps(doc).encode()


def blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def put_blob(layout: Path, data: bytes) -> str:
    d = _sha(data)
    (layout / "blobs" / "sha256" / d.split(":")[1]).write_bytes(data)
    return d


def read_doc(layout: Path, digest: str):
    return json.loads(blob_path(layout, digest).read_bytes())


def restack(layout: Path, config=None, manifest=None, index=None) -> None:
    """Rewrite the first image's documents bottom-up: config, manifest, then index.json.

    Each edit maps the parsed document to a new document or to raw bytes. Every blob written is
    re-pointed from its parent by its true digest and size, so the only defect is the edit's own.
    """
    idx = json.loads((layout / "index.json").read_text())
    desc = idx["manifests"][0]
    man = read_doc(layout, desc["digest"])
    if config is not None:
        data = as_bytes(config(read_doc(layout, man["config"]["digest"])))
        man["config"].update(digest=put_blob(layout, data), size=len(data))
    data = as_bytes(manifest(man) if manifest is not None else man)
    desc.update(digest=put_blob(layout, data), size=len(data))
    (layout / "index.json").write_bytes(as_bytes(index(idx) if index is not None else idx))


def replace_layer(layout: Path, i: int, blob: bytes, diff_id: str | None = None) -> str:
    """Swap layer i's blob for `blob` (and its diff_id, if given), re-pointing the manifest. Returns its digest."""
    digest = put_blob(layout, blob)

    def man(m):
        m["layers"][i].update(digest=digest, size=len(blob))
        return m

    def cfg(c):
        if diff_id is not None:
            c["rootfs"]["diff_ids"][i] = diff_id
        return c

    restack(layout, config=cfg, manifest=man)
    return digest


def first_manifest(layout: Path) -> dict:
    return read_doc(layout, json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])


def layout_digests(layout: Path) -> dict:
    """Manifest, config and layer digests of a single-image OCI layout, read from its files."""
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest = json.loads((layout / "blobs/sha256" / entry["digest"].split(":")[1]).read_text())
    return {"manifest": entry["digest"], "config": manifest["config"]["digest"],
            "layers": [layer["digest"] for layer in manifest["layers"]]}


# ---------------------------------------------------------------- the fixture overlay

APPLY_EDITS = '''
def apply(path, edits, dry_run=False):
    text = open(path).read()
    for marker, anchor, replacement in edits:
        if marker in text:
            continue
        n = text.count(anchor)
        if n != 1:
            raise SystemExit(f"{path}: anchor for {marker} found {n} times")
        text = text.replace(anchor, replacement)
    if not dry_run:
        open(path, "w").write(text)
'''

FIXTURE_SCRIPTS = {
    "patch_registry_and_select.py": APPLY_EDITS + '''
import sys

EDITS = {
    "model_executor/models/registry.py": [
        ("SM121-PORT registry", '    "DFlashDraftModel": ("qwen3_dflash", "DFlashDraftModel"),\\n',
         '    "DFlashDraftModel": ("qwen3_dflash", "DFlashDraftModel"),\\n'
         '    "DFlash2DraftModel": ("qwen3_dflash2", "DFlash2DraftModel"),  # SM121-PORT registry\\n'),
    ],
    "v1/worker/gpu/spec_decode/__init__.py": [
        ("SM121-PORT select", '    if method == "eagle":\\n',
         '    if method == "dflash2":  # SM121-PORT select\\n        return "dflash2"\\n    if method == "eagle":\\n'),
    ],
}

root = sys.argv[1]
for rel, edits in EDITS.items():
    apply(f"{root}/{rel}", edits)
''',
    "patch_glm_aux_capture.py": APPLY_EDITS + '''
import argparse

MARKER = "DFLASH2-AUX-CAPTURE"
EDITS = [
    (MARKER,
     "        for layer in self.layers:\\n"
     "            hidden_states = layer(hidden_states, positions)\\n",
     "        aux = []  # " + MARKER + "\\n"
     "        for i, layer in enumerate(self.layers):\\n"
     "            hidden_states = layer(hidden_states, positions)\\n"
     "            if i in (5, 14, 24, 33, 42):\\n"
     "                aux.append(hidden_states)\\n"),
]

ap = argparse.ArgumentParser()
ap.add_argument("--model-file", required=True)
ap.add_argument("--dry-run", action="store_true")
a = ap.parse_args()
apply(a.model_file, EDITS, a.dry_run)
''',
    "patch_glm5_drafter_group.py": APPLY_EDITS + '''
import argparse

MARKER = "DFLASH2-DRAFTER-GROUP"
ANCHOR = ("        if max_page % spec.page_size_bytes != 0:\\n"
          "            raise NotImplementedError(")
REPLACEMENT = ("        if max_page % spec.page_size_bytes != 0 and not getattr(spec, 'drafter', False):  # " + MARKER + "\\n"
               "            raise NotImplementedError(")
EDITS = [(MARKER, ANCHOR, REPLACEMENT)]

ap = argparse.ArgumentParser()
ap.add_argument("--kv-file", required=True)
ap.add_argument("--dry-run", action="store_true")
a = ap.parse_args()
apply(a.kv_file, EDITS, a.dry_run)
''',
    # No literal edit tuples: the drift report has to dry-run this one.
    "patch_prefix_cache_draft_group.py": '''
import sys
from pathlib import Path

p = Path(sys.argv[1])
s = p.read_text()
old = "        self.eagle_group_ids = set(range(len(groups)))\\n"
new = "        self.eagle_group_ids = {0} or set(range(len(groups)))  # PREFIX-CACHE-DRAFT\\n"
if "PREFIX-CACHE-DRAFT" not in s:
    if s.count(old) != 1:
        raise SystemExit("fallback match count: %d" % s.count(old))
    p.write_text(s.replace(old, new))
''',
}

OVERLAY_FILES = {
    "qwen3_dflash2.py": "class DFlash2DraftModel:\n    block_size = 8\n",
    "dflash2/__init__.py": "",
    "dflash2/speculator.py": "class DFlash2Speculator:\n    pass\n",
}


def write_overlay_source(root: Path, subdir: str = "overlay-dflash2") -> Path:
    """A checkout-shaped overlay source: root/<subdir>/... Returns root."""
    src = root / subdir
    for name, text in {**FIXTURE_SCRIPTS, **OVERLAY_FILES}.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    return root


def overlay_toml(pinned: dict[str, str] | None = None, wheels: list[str] = ()) -> str:
    """The fixture overlay.toml; `pinned` maps file -> sha256 (else "unpinned")."""
    sha = lambda f: (pinned or {}).get(f, "unpinned")  # noqa: E731
    installs = [("qwen3_dflash2.py", "model_executor/models/qwen3_dflash2.py"),
                ("dflash2/__init__.py", "v1/worker/gpu/spec_decode/dflash2/__init__.py"),
                ("dflash2/speculator.py", "v1/worker/gpu/spec_decode/dflash2/speculator.py")]
    text = textwrap.dedent(f'''\
        name = "dflash2-fixture"

        [image]
        name = "sparkstack/fixture"

        [source]
        repo = "example/overlay-fixture"
        rev = "{REV}"
        subdir = "overlay-dflash2"
        ''')
    for src, dest in installs:
        text += f'\n[[install]]\nsrc = "{src}"\ndest = "{dest}"\nsha256 = "{sha(src)}"\n'
    steps = [
        ("registry_and_select", "patch_registry_and_select.py", ["{vllm}"],
         ["model_executor/models/registry.py", "v1/worker/gpu/spec_decode/__init__.py"], ["SM121-PORT"], True),
        ("glm_aux_capture", "patch_glm_aux_capture.py", ["--model-file", "{file:models/glm5next/nvidia/model.py}"],
         ["models/glm5next/nvidia/model.py"], ["DFLASH2-AUX-CAPTURE"], True),
        ("glm5_drafter_group", "patch_glm5_drafter_group.py", ["--kv-file", "{file:v1/core/kv_cache_utils.py}"],
         ["v1/core/kv_cache_utils.py"], ["DFLASH2-DRAFTER-GROUP"], True),
        ("prefix_cache_draft_group", "patch_prefix_cache_draft_group.py", ["{file:v1/core/kv_cache_coordinator.py}"],
         ["v1/core/kv_cache_coordinator.py"], ["PREFIX-CACHE-DRAFT"], False),
    ]
    for name, script, args, touches, markers, enabled in steps:
        text += (f'\n[[steps]]\nname = "{name}"\nscript = "{script}"\nsha256 = "{sha(script)}"\n'
                 f"args = {json.dumps(args)}\ntouches = {json.dumps(touches)}\nmarkers = {json.dumps(markers)}\n"
                 f"enabled = {'true' if enabled else 'false'}\n")
    text += '\n[gates]\nruntime = [["python3", "-c", "import vllm.model_executor.models.qwen3_dflash2"]]\n'
    if wheels:
        text += '\n[variants.instanttensor]\nload_format = "instanttensor"\n'
        for w in wheels:
            text += f'\n[[variants.instanttensor.wheels]]\nfile = "{w}"\nsha256 = "{sha(w)}"\n'
    return text


def write_overlay(directory: Path, pinned_from: Path | None = None, wheels: list[str] = (), wheel_dir: Path | None = None) -> Path:
    """Write overlay.toml; with pinned_from (the overlay source subdir), pin every hash."""
    directory.mkdir(parents=True, exist_ok=True)
    pinned = None
    if pinned_from is not None:
        pinned = {p.relative_to(pinned_from).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in pinned_from.rglob("*") if p.is_file()}
        for w in wheels:
            pinned[w] = hashlib.sha256((wheel_dir / w).read_bytes()).hexdigest()
    (directory / "overlay.toml").write_text(overlay_toml(pinned, wheels))
    return directory


def make_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> str:
    """A minimal, valid wheel (purelib), built by hand. Returns its file name."""
    import base64

    dist = f"{name}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    contents[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: fixture\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    contents[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    fname = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(directory / fname, "w") as z:
        for path in sorted(contents):
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            z.writestr(info, contents[path])
    return fname


def tree_entries(work: Path, top: bool) -> list[tuple[str, bytes | None]]:
    """(archive name, bytes or None for a dir) of every entry under `work`, sorted."""
    out = []
    for p in sorted(work.rglob("*")):
        rel = p.relative_to(work).as_posix()
        name = f"{work.name}/{rel}" if top else rel
        out.append((name, None if p.is_dir() else p.read_bytes()))
    return ([(work.name, None)] if top else []) + out


def make_bundle(work: Path, out: Path, kind: str = "tar", top: bool = False) -> Path:
    """The blog's bundle of `work`, as a tar (deterministic: no times), tar.gz or zip; `top`: under one top dir."""
    entries = tree_entries(work, top)
    if kind == "zip":
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in entries:
                if data is None:
                    zf.writestr(name + "/", b"")
                else:
                    zf.writestr(name, data)
        return out
    with tarfile.open(out, "w:gz" if kind == "tar.gz" else "w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return out

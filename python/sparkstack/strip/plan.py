"""The strip plan: what to link, rewrite or drop, computed from headers and config alone."""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkstack import fsio, outputs
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import ModelSource, SourceFile, read_ref, snapshot_dir
from sparkstack.safetensors_header import (JsonRefused, ShardHeader, TensorEntry, encode_header, json_kind,
                                           read_header, strict_json)
from sparkstack.strip.mtp import config_without_mtp, is_mtp_key, num_hidden_layers, numbered_outside_text_stack
from sparkstack.text import quoted
from sparkstack.units import human_bytes

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
# Bump when the output for the same input would change, so old outputs stop counting as up to date.
FORMAT_VERSION = 3
COMMAND = "sparkstack strip"
SAMPLE_KEYS = 8


@dataclass(frozen=True)
class ShardPlan:
    relpath: str
    action: str  # "link" | "rewrite" | "drop"
    source: SourceFile
    header: ShardHeader
    kept: tuple[TensorEntry, ...]  # source entries, in source offset order
    dropped: tuple[str, ...]
    new_prefix: bytes = b""  # u64 length + header JSON, for "rewrite"
    new_tensors: tuple[TensorEntry, ...] = ()  # relocated entries, for "rewrite"

    @property
    def out_size(self) -> int:
        if self.action == "drop":
            return 0
        if self.action == "link":
            return self.source.size
        return len(self.new_prefix) + sum(t.nbytes for t in self.kept)


@dataclass(frozen=True)
class Destination:
    kind: str  # "cache" or "flat", same as the source
    root: Path  # the cache entry dir, or the flat model dir
    revision: str | None

    @property
    def model_dir(self) -> Path:
        return snapshot_dir(self.root, self.revision) if self.kind == "cache" else self.root

    @property
    def stamp(self) -> Path:
        name = f"strip-{self.revision}.json" if self.kind == "cache" else "strip.json"
        return self.root / ".sparkstack" / name


@dataclass(frozen=True)
class StripPlan:
    source: ModelSource
    dest: Destination
    index_only: bool
    num_layers: int
    num_layers_source: str
    shards: tuple[ShardPlan, ...]
    new_files: tuple[tuple[str, bytes], ...]  # relpath -> content (config, index)
    carried: tuple[SourceFile, ...]  # other files, linked as they are
    fingerprint: str
    up_to_date: bool
    warnings: tuple[str, ...]
    unindexed: tuple[str, ...] = ()  # --index-only: the MTP tensors the new index leaves out (the shards keep them)

    @property
    def mtp_keys(self) -> tuple[str, ...]:
        """The MTP tensors the output no longer serves: out of the shards, or under --index-only out of the index."""
        if self.index_only:
            return self.unindexed
        return tuple(sorted(k for s in self.shards for k in s.dropped))

    @property
    def bytes_to_write(self) -> int:
        return sum(s.out_size for s in self.shards if s.action == "rewrite") + sum(len(d) for _, d in self.new_files)

    @property
    def bytes_to_copy(self) -> int:
        """Tensor bytes the rewrite copies: what apply's progress counts (the headers are written, not copied)."""
        return sum(s.out_size - len(s.new_prefix) for s in self.shards if s.action == "rewrite")

    @property
    def bytes_freed(self) -> int:
        return sum(s.source.size - s.out_size for s in self.shards if s.action != "link")

    def to_json(self) -> dict[str, Any]:
        keys = self.mtp_keys
        return {
            "source": {"kind": self.source.kind, "path": str(self.source.root), "revision": self.source.revision},
            "dest": {"kind": self.dest.kind, "path": str(self.dest.root), "revision": self.dest.revision},
            "index_only": self.index_only,
            "num_hidden_layers": self.num_layers,
            "num_hidden_layers_from": self.num_layers_source,
            "mtp_tensors": len(keys),
            "mtp_tensors_removed_from": "index" if self.index_only else "shards",
            "mtp_sample_keys": list(keys[:SAMPLE_KEYS]),
            "shards": [
                {"file": s.relpath, "action": s.action, "kept": len(s.kept), "dropped": len(s.dropped),
                 "bytes_in": s.source.size, "bytes_out": s.out_size}
                for s in self.shards
            ],
            "new_files": [name for name, _ in self.new_files],
            "carried_files": [f.relpath for f in self.carried],
            "bytes_to_write": self.bytes_to_write,
            "bytes_freed": self.bytes_freed,
            "fingerprint": self.fingerprint,
            "up_to_date": self.up_to_date,
            "warnings": list(self.warnings),
        }


def _load_json(source: ModelSource, relpath: str) -> Any:
    """The file's JSON (the caller checks it is there). Strict (see strict_json): we rewrite these
    files, and what we write must load everywhere."""
    f = source.file(relpath)
    if f is None:
        raise SparkstackError(f"{source.model_dir / relpath}: missing")
    try:
        return strict_json(f.path.read_bytes())
    except JsonRefused as exc:
        raise SparkstackError(f"{source.model_dir / relpath}: not valid JSON: {exc}") from None


def _check_config(config: Any, path: Path) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise SparkstackError(f"{path}: must be a JSON object, not {json_kind(config)}")
    text = config.get("text_config")
    # null is how transformers serialises "no sub-config"; anything else must be an object we can edit.
    if text is not None and not isinstance(text, dict):
        raise SparkstackError(f"{path}: text_config must be an object, not {json_kind(text)} {quoted(text)}")
    return config


def _check_index(index: Any, path: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(weight_map, metadata) of a model.safetensors.index.json, each value checked."""
    if not isinstance(index, dict):
        raise SparkstackError(f"{path}: must be a JSON object, not {json_kind(index)}")
    if "weight_map" not in index:
        raise SparkstackError(f"{path}: has no weight_map")
    wm = index["weight_map"]
    if not isinstance(wm, dict):
        raise SparkstackError(f"{path}: weight_map must be an object of tensor name -> shard file, not {json_kind(wm)}")
    metadata = index.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise SparkstackError(f"{path}: metadata must be an object, not {json_kind(metadata)} {quoted(metadata)}")
    return {k: _safe_shard_name(k, v, path) for k, v in wm.items()}, metadata or {}


def _dump_json(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _safe_shard_name(key: str, name: object, where: Path) -> str:
    if not isinstance(name, str) or not name:
        raise SparkstackError(f"{where}: weight_map entry {quoted(key)} is not a file name: {quoted(name)}")
    norm = posixpath.normpath(name)
    if name.startswith("/") or "\\" in name or norm.startswith("../") or norm == ".." or norm != name:
        raise SparkstackError(f"{where}: weight_map entry {quoted(key)} points outside the model dir: {quoted(name)}")
    return name


def plan_strip(source: ModelSource, dest_root: Path, index_only: bool = False) -> StripPlan:
    """Read config, index and shard headers, and decide every file's fate. Writes nothing."""
    _refuse_overlap(source.root, dest_root)
    outputs.claim_dir(dest_root, COMMAND)
    warnings: list[str] = []
    config_path = source.model_dir / CONFIG_NAME
    config = _check_config(_load_json(source, CONFIG_NAME), config_path)
    layers = num_hidden_layers(config, str(config_path))
    if layers.source == "default":
        warnings.append(f"config.json has no num_hidden_layers; assuming {layers.value} (MTP at layer {layers.value})")

    has_index = source.file(INDEX_NAME) is not None
    index = _load_json(source, INDEX_NAME) if has_index else None
    index_path = source.model_dir / INDEX_NAME
    weight_map: dict[str, str] = {}
    index_metadata: dict[str, Any] = {}
    if has_index:
        weight_map, index_metadata = _check_index(index, index_path)

    # vLLM in this image globs the top-level *.safetensors files, so each one counts, indexed or not.
    shard_names = sorted({f.relpath for f in source.files if "/" not in f.relpath and f.relpath.endswith(".safetensors")}
                         | set(weight_map.values()))
    if not shard_names:
        raise SparkstackError(f"{source.model_dir}: no *.safetensors files and no index")

    shards = []
    for name in shard_names:
        sf = source.file(name)
        if sf is None:
            raise SparkstackError(f"{index_path}: names shard {quoted(name)}, which is not in {source.model_dir}")
        header = read_header(sf.path, shown=str(source.model_dir / name))
        shards.append((sf, header))

    present = {(sf.relpath, t.name) for sf, h in shards for t in h.tensors}
    for key, shard in weight_map.items():
        if (shard, key) not in present:
            raise SparkstackError(f"{index_path}: maps {quoted(key)} to {quoted(shard)}, but that shard has no such tensor")

    shard_plans = tuple(_plan_shard(sf, h, layers.value, index_only) for sf, h in shards)
    dropped = {k for s in shard_plans for k in s.dropped}
    if index_only:
        dropped = {t.name for _, h in shards for t in h.tensors if is_mtp_key(t.name, layers.value)}
        warnings.append("--index-only: this vLLM build loads every *.safetensors file it finds, "
                        "so MTP tensors left in the shards will still be loaded")
        if dropped and not has_index:
            warnings.append(f"--index-only: there is no {INDEX_NAME} to take the {len(dropped)} MTP tensors out of; "
                            "only config.json changes")
    if not dropped:
        warnings.append("no MTP tensors found; the output differs from the source only in config.json")
    outside = numbered_outside_text_stack((t.name for _, h in shards for t in h.tensors), layers.value)
    if outside:
        warnings.append(f"{len(outside)} tensor(s) outside the language model's decoder stack have a layer index "
                        f">= num_hidden_layers ({layers.value}) and are kept, e.g. {quoted(outside[0])}")

    new_files = [(CONFIG_NAME, _dump_json(config_without_mtp(config)))]
    if has_index:
        new_index = dict(index)
        new_wm = {k: v for k, v in weight_map.items() if k not in dropped}
        sizes = {t.name: t.nbytes for _, h in shards for t in h.tensors}
        new_index["metadata"] = dict(index_metadata, total_size=sum(sizes[k] for k in new_wm))
        new_index["weight_map"] = new_wm
        new_files.append((INDEX_NAME, _dump_json(new_index)))
    new_names = {n for n, _ in new_files} | set(shard_names)
    carried = tuple(f for f in source.files if f.relpath not in new_names)

    dest = Destination(source.kind, dest_root, source.revision)
    fingerprint = _fingerprint(source, index_only)
    return StripPlan(
        source=source, dest=dest, index_only=index_only,
        num_layers=layers.value, num_layers_source=layers.source,
        shards=shard_plans, new_files=tuple(new_files), carried=carried,
        fingerprint=fingerprint, up_to_date=is_up_to_date(dest, fingerprint, source.at_main),
        warnings=tuple(warnings),
        unindexed=tuple(sorted(dropped & weight_map.keys())) if index_only else (),
    )


def _refuse_overlap(src: Path, dest: Path) -> None:
    """The output may never live inside the source, nor contain it."""
    s, d = src.resolve(), dest.resolve()
    if d == s or d.is_relative_to(s) or s.is_relative_to(d):
        raise SparkstackError(f"{dest}: output would overlap the source {src}; choose another --out")


def _plan_shard(sf: SourceFile, header: ShardHeader, layers: int, index_only: bool) -> ShardPlan:
    kept = tuple(t for t in header.tensors if not is_mtp_key(t.name, layers))
    dropped = tuple(t.name for t in header.tensors if is_mtp_key(t.name, layers))
    if index_only or not dropped:
        return ShardPlan(sf.relpath, "link", sf, header, header.tensors, ())
    if not kept:
        return ShardPlan(sf.relpath, "drop", sf, header, (), dropped)
    prefix, relocated = encode_header(header.metadata, kept)
    return ShardPlan(sf.relpath, "rewrite", sf, header, kept, dropped, prefix, relocated)


def _fingerprint(source: ModelSource, index_only: bool) -> str:
    """Identity of the inputs. Shards: blob name plus stat identity (an edit through a snapshot link keeps the
    blob's name but not its mtime). Everything else, config.json and the index included: its content.

    The stat identity leaves out ctime: hardlinking a shard into the output changes the source's ctime.
    """
    files = []
    for f in source.files:
        if f.relpath.endswith(".safetensors"):
            files.append([f.relpath, f.blob, *f.identity])
        else:
            files.append([f.relpath, fsio.sha256_file(f.path)])
    doc = {"format": FORMAT_VERSION, "index_only": index_only, "revision": source.revision, "files": files}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def is_up_to_date(dest: Destination, fingerprint: str, at_main: bool = True) -> bool:
    """The output at `dest` was made from exactly these inputs, every file it recorded is still the very file it
    wrote (same identity, so not rewritten in place since), and refs/main names it when it should."""
    try:
        stamp = json.loads(dest.stamp.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(stamp, dict) or stamp.get("fingerprint") != fingerprint:
        return False
    if dest.kind == "cache" and at_main:
        try:
            if read_ref(dest.root) != dest.revision:
                return False
        except SparkstackError:
            return False
    recorded = stamp.get("outputs")
    if not isinstance(recorded, dict):
        return False
    for relpath, identity in recorded.items():
        try:
            if list(fsio.file_identity(dest.model_dir / relpath)) != identity:
                return False
        except (OSError, TypeError, ValueError):
            return False
    return True


def plan_lines(plan: StripPlan) -> list[str]:
    """The human form of a strip plan (`strip --dry-run`)."""
    lines = []
    src = plan.source
    lines.append(f"source: {src.root}" + (f" @ {src.revision}" if src.revision else ""))
    lines.append(f"dest:   {plan.dest.root}" + (" (up to date)" if plan.up_to_date else ""))
    lines.append(f"num_hidden_layers: {plan.num_layers} ({plan.num_layers_source})")
    keys = plan.mtp_keys
    lines.append(f"MTP tensors: {len(keys)}" + (" (out of the index; the shards keep them)" if plan.index_only else ""))
    for k in keys[:8]:
        lines.append(f"  {k}")
    if len(keys) > 8:
        lines.append(f"  ... and {len(keys) - 8} more")
    for s in plan.shards:
        detail = f"{human_bytes(s.source.size)}"
        if s.action != "link":
            detail += f" -> {human_bytes(s.out_size)}, drops {len(s.dropped)} tensors"
        lines.append(f"  {s.action:<8} {s.relpath}  {detail}")
    lines.append(f"new files: {', '.join(n for n, _ in plan.new_files)}; carried as links: {len(plan.carried)}")
    lines.append(f"bytes to write: {human_bytes(plan.bytes_to_write)}; bytes freed: {human_bytes(plan.bytes_freed)}")
    return lines

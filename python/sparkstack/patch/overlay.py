"""overlay.toml: a declarative overlay (source pin, files with sha256, install targets, patch steps, gates)."""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sparkstack.errors import SparkstackError

UNPINNED = "unpinned"
# Step arguments may name {vllm} (the vLLM root in the scratch tree) or {file:REL} (a file under it).
PLACEHOLDER = re.compile(r"\{([a-z]+)(?::([^}]*))?\}")
DEFAULT_VLLM_ROOT = "usr/local/lib/python3.12/dist-packages/vllm"


@dataclass(frozen=True)
class SourceFile:
    path: str  # relative to the overlay source dir
    sha256: str  # or "unpinned"


@dataclass(frozen=True)
class Install:
    file: SourceFile
    dest: str  # relative to the vLLM root


@dataclass(frozen=True)
class Step:
    name: str
    script: SourceFile
    args: tuple[str, ...]  # with {vllm} and {file:REL} placeholders
    touches: tuple[str, ...]  # files under the vLLM root the step edits
    markers: tuple[str, ...]
    enabled: bool


@dataclass(frozen=True)
class Wheel:
    file: str
    sha256: str


@dataclass(frozen=True)
class Variant:
    name: str
    wheels: tuple[Wheel, ...]
    load_format: str | None


@dataclass(frozen=True)
class Overlay:
    path: Path  # the overlay.toml
    name: str
    image_name: str
    repo: str
    rev: str
    subdir: str
    vllm_root: str  # relative to the image root
    installs: tuple[Install, ...]
    steps: tuple[Step, ...]
    runtime_gates: tuple[tuple[str, ...], ...]
    variants: dict[str, Variant]

    @property
    def source_label(self) -> str:
        return f"{self.repo}@{self.rev}/{self.subdir}"

    @property
    def unpinned(self) -> tuple[str, ...]:
        files = [i.file for i in self.installs] + [s.script for s in self.steps if s.enabled]
        return tuple(f.path for f in files if f.sha256 == UNPINNED)

    def enabled_steps(self, extra: tuple[str, ...] = ()) -> tuple[Step, ...]:
        unknown = set(extra) - {s.name for s in self.steps}
        if unknown:
            raise SparkstackError(f"{self.path}: no patch step named {', '.join(sorted(unknown))}")
        return tuple(s for s in self.steps if s.enabled or s.name in extra)


def _keys(where: str, table: dict, required: set[str], optional: set[str] = frozenset()) -> None:
    unknown = set(table) - required - optional
    if unknown:
        raise SparkstackError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    missing = required - set(table)
    if missing:
        raise SparkstackError(f"{where}: missing key {sorted(missing)[0]!r}")


def _strs(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SparkstackError(f"{where}: expected a list of strings")
    return tuple(value)


def _step_args(where: str, value: object) -> tuple[str, ...]:
    args = _strs(f"{where} args", value)
    for arg in args:
        for m in PLACEHOLDER.finditer(arg):
            kind, rel = m.group(1), m.group(2)
            if kind == "file" and rel:
                _relpath(f"{where} args {m.group(0)}", rel)
            elif not (kind == "vllm" and rel is None):
                raise SparkstackError(f"{where}: unknown placeholder {m.group(0)} (use {{vllm}} or {{file:REL}})")
    return args


def _relpath(where: str, value: object) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or ".." in value.split("/"):
        raise SparkstackError(f"{where}: {value!r} must be a relative path inside the tree")
    return value


def load_overlay(directory: Path) -> Overlay:
    path = directory / "overlay.toml"
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SparkstackError(f"{directory}: no overlay.toml") from None
    except tomllib.TOMLDecodeError as exc:
        raise SparkstackError(f"{path}: not valid TOML ({exc})") from None
    w = str(path)
    _keys(w, doc, {"name", "image", "source"}, {"install", "steps", "gates", "variants"})
    _keys(f"{w} [image]", doc["image"], {"name"}, {"vllm_root"})
    _keys(f"{w} [source]", doc["source"], {"repo", "rev", "subdir"})
    rev = doc["source"]["rev"]
    if not (isinstance(rev, str) and len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)):
        raise SparkstackError(f"{w} [source]: rev must be a full 40-hex commit, got {rev!r}")

    installs = []
    for i, t in enumerate(doc.get("install", [])):
        _keys(f"{w} [[install]] #{i + 1}", t, {"src", "dest", "sha256"})
        installs.append(Install(SourceFile(_relpath(w, t["src"]), _sha(w, t["sha256"])), _relpath(w, t["dest"])))
    steps = []
    for i, t in enumerate(doc.get("steps", [])):
        where = f"{w} [[steps]] #{i + 1}"
        _keys(where, t, {"name", "script", "sha256", "args", "touches"}, {"markers", "enabled"})
        steps.append(Step(t["name"], SourceFile(_relpath(where, t["script"]), _sha(where, t["sha256"])),
                          _step_args(where, t["args"]),
                          tuple(_relpath(where, p) for p in _strs(f"{where} touches", t["touches"])),
                          _strs(f"{where} markers", t.get("markers", [])), bool(t.get("enabled", True))))
    gates = doc.get("gates", {})
    _keys(f"{w} [gates]", gates, set(), {"runtime"})
    runtime = tuple(_strs(f"{w} [gates] runtime", g) for g in gates.get("runtime", []))
    variants = {}
    for name, t in doc.get("variants", {}).items():
        where = f"{w} [variants.{name}]"
        _keys(where, t, {"wheels"}, {"load_format"})
        wheels = []
        for j, wt in enumerate(t["wheels"]):
            _keys(f"{where} wheel #{j + 1}", wt, {"file", "sha256"})
            wheels.append(Wheel(_relpath(where, wt["file"]), _sha(where, wt["sha256"])))
        variants[name] = Variant(name, tuple(wheels), t.get("load_format"))
    return Overlay(path, doc["name"], doc["image"]["name"], doc["source"]["repo"], rev, doc["source"]["subdir"],
                   doc["image"].get("vllm_root", DEFAULT_VLLM_ROOT).strip("/"), tuple(installs), tuple(steps),
                   runtime, variants)


def _sha(where: str, value: object) -> str:
    if value == UNPINNED:
        return value
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise SparkstackError(f"{where}: sha256 must be 64 hex digits or \"unpinned\", got {value!r}")
    return value


def read_checked(source_dir: Path, f: SourceFile, allow_unpinned: bool) -> bytes:
    """Read one overlay source file and check it against its pinned sha256."""
    path = source_dir / f.path
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SparkstackError(f"{path}: overlay source file is missing") from None
    actual = hashlib.sha256(data).hexdigest()
    if f.sha256 == UNPINNED:
        if not allow_unpinned:
            raise SparkstackError(f"{f.path} is unpinned in overlay.toml; run `sparkstack pin` or pass --allow-unpinned")
    elif actual != f.sha256:
        raise SparkstackError(f"{path}: sha256 {actual} does not match the pinned {f.sha256}")
    return data

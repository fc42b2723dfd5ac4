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
    runtime_gates: tuple[tuple[str, ...], ...] = ()  # run by launch's preflight besides the overlay's own


@dataclass(frozen=True)
class Overlay:
    path: Path  # the overlay.toml
    name: str
    image_name: str
    repo: str
    rev: str
    subdir: str
    bundle_sha256: str | None  # the blog's bundle of the same files, when one is pinned
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


MAX_TOML = 4 << 20  # an overlay.toml is a page of text
_VARIANT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # it becomes part of the image tag


def _keys(where: str, table: dict, required: set[str], optional: set[str] = frozenset()) -> None:
    unknown = set(table) - required - optional
    if unknown:
        raise SparkstackError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    missing = required - set(table)
    if missing:
        raise SparkstackError(f"{where}: missing key {sorted(missing)[0]!r}")


def _table(where: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise SparkstackError(f"{where}: expected a table, got {value!r}")
    return value


def _tables(where: str, value: object) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise SparkstackError(f"{where}: expected an array of tables, got {value!r}")
    return value


def _text(where: str, value: object) -> str:
    """A one-line name: it is printed in messages and labels, so no control characters."""
    if not isinstance(value, str) or not value or any(c < " " or c == "\x7f" for c in value):
        raise SparkstackError(f"{where}: expected a non-empty one-line string, got {value!r}")
    return value


def _bool(where: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise SparkstackError(f"{where}: expected true or false, got {value!r}")
    return value


def _strs(where: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SparkstackError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def _argv(where: str, value: object) -> tuple[str, ...]:
    """Strings that become argv entries: a NUL cannot be passed to a process."""
    args = _strs(where, value)
    for arg in args:
        if "\0" in arg:
            raise SparkstackError(f"{where}: {arg!r} contains a NUL byte")
    return args


def _step_args(where: str, value: object) -> tuple[str, ...]:
    args = _argv(f"{where} args", value)
    for arg in args:
        for m in PLACEHOLDER.finditer(arg):
            kind, rel = m.group(1), m.group(2)
            if kind == "file" and rel:
                _relpath(f"{where} args {m.group(0)}", rel)
            elif not (kind == "vllm" and rel is None):
                raise SparkstackError(f"{where}: unknown placeholder {m.group(0)} (use {{vllm}} or {{file:REL}})")
    return args


def _relpath(where: str, value: object, image_root: bool = False) -> str:
    """A path inside its tree, normalised ("a//b/./c" -> "a/b/c").

    Refused: not a string, absolute, any ".." part, NUL, backslash or other control characters,
    and nothing left after normalising ("", ".", "./"). With `image_root`, a leading "/" means the
    image root (vllm_root = "/usr/..." and "usr/..." are one path), and the rest must pass the same checks.
    """
    if not isinstance(value, str):
        raise SparkstackError(f"{where}: expected a path string, got {value!r}")
    rel = value.lstrip("/") if image_root else value
    problem = None
    if any(c < " " or c in "\\\x7f" for c in rel):
        problem = "contains a control character or backslash"
    elif rel.startswith("/"):
        problem = "is absolute"
    elif ".." in rel.split("/"):
        problem = "contains .."
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if problem is None and not parts:
        problem = "names no file (empty or \".\")"
    if problem:
        raise SparkstackError(f"{where}: {value!r} {problem}; it must be a relative path inside the tree")
    return "/".join(parts)


def _read_toml(path: Path, directory: Path) -> dict:
    if not path.exists():
        raise SparkstackError(f"{directory}: no overlay.toml")
    if not path.is_file():  # a fifo would block the read forever
        raise SparkstackError(f"{path}: not a regular file")
    with open(path, "rb") as f:
        data = f.read(MAX_TOML + 1)
    if len(data) > MAX_TOML:
        raise SparkstackError(f"{path}: larger than {MAX_TOML} bytes; not an overlay.toml")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SparkstackError(f"{path}: not UTF-8 (bad byte at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SparkstackError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise SparkstackError(f"{path}: not valid TOML (nested too deeply)") from None


def load_overlay(directory: Path) -> Overlay:
    path = directory / "overlay.toml"
    doc = _read_toml(path, directory)
    w = str(path)
    _keys(w, doc, {"name", "image", "source"}, {"install", "steps", "gates", "variants"})
    name = _text(f"{w} name", doc["name"])
    image = _table(f"{w} [image]", doc["image"])
    _keys(f"{w} [image]", image, {"name"}, {"vllm_root"})
    image_name = _text(f"{w} [image] name", image["name"])
    if image_name.startswith("-") or any(c.isspace() for c in image_name):
        raise SparkstackError(f"{w} [image] name: {image_name!r} is not an image name "
                              "(it starts with '-' or contains whitespace)")
    vllm_root = _relpath(f"{w} [image] vllm_root", image.get("vllm_root", DEFAULT_VLLM_ROOT), image_root=True)
    source = _table(f"{w} [source]", doc["source"])
    _keys(f"{w} [source]", source, {"repo", "rev", "subdir"}, {"bundle_sha256"})
    repo = _text(f"{w} [source] repo", source["repo"])
    rev = source["rev"]
    if not (isinstance(rev, str) and len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)):
        raise SparkstackError(f"{w} [source]: rev must be a full 40-hex commit, got {rev!r}")
    subdir = _relpath(f"{w} [source] subdir", source["subdir"])
    bundle_sha256 = source.get("bundle_sha256")
    if bundle_sha256 is not None and _sha(f"{w} [source] bundle_sha256", bundle_sha256) == UNPINNED:
        bundle_sha256 = None

    installs = []
    for i, t in enumerate(_tables(f"{w} [[install]]", doc.get("install", []))):
        where = f"{w} [[install]] #{i + 1}"
        _keys(where, t, {"src", "dest", "sha256"})
        installs.append(Install(SourceFile(_relpath(f"{where} src", t["src"]), _sha(where, t["sha256"])),
                                _relpath(f"{where} dest", t["dest"])))
    steps = []
    for i, t in enumerate(_tables(f"{w} [[steps]]", doc.get("steps", []))):
        where = f"{w} [[steps]] #{i + 1}"
        _keys(where, t, {"name", "script", "sha256", "args", "touches"}, {"markers", "enabled"})
        step_name = _text(f"{where} name", t["name"])
        if any(s.name == step_name for s in steps):
            raise SparkstackError(f"{where} name: {step_name!r} names an earlier step too")
        steps.append(Step(step_name, SourceFile(_relpath(f"{where} script", t["script"]), _sha(where, t["sha256"])),
                          _step_args(where, t["args"]),
                          tuple(_relpath(f"{where} touches", p) for p in _strs(f"{where} touches", t["touches"])),
                          _strs(f"{where} markers", t.get("markers", [])),
                          _bool(f"{where} enabled", t.get("enabled", True))))
    gates = _table(f"{w} [gates]", doc.get("gates", {}))
    _keys(f"{w} [gates]", gates, set(), {"runtime"})
    runtime_list = gates.get("runtime", [])
    if not isinstance(runtime_list, list):
        raise SparkstackError(f"{w} [gates] runtime: expected a list of commands, got {runtime_list!r}")
    runtime = []
    for g in runtime_list:
        argv = _argv(f"{w} [gates] runtime", g)
        if not argv:
            raise SparkstackError(f"{w} [gates] runtime: a gate is an empty command")
        runtime.append(argv)
    variants = {}
    for vname, t in _table(f"{w} [variants]", doc.get("variants", {})).items():
        where = f"{w} [variants.{vname}]"
        if not _VARIANT.fullmatch(vname) or vname == "plain":
            raise SparkstackError(f"{where}: {vname!r} cannot name a variant (letters, digits, _ . -; not \"plain\")")
        _keys(where, _table(where, t), {"wheels"}, {"load_format", "gates"})
        wheels = []
        for j, wt in enumerate(_tables(f"{where} wheels", t["wheels"])):
            _keys(f"{where} wheel #{j + 1}", wt, {"file", "sha256"})
            wheels.append(Wheel(_relpath(f"{where} wheel #{j + 1} file", wt["file"]), _sha(where, wt["sha256"])))
        load_format = t.get("load_format")
        if load_format is not None:
            load_format = _text(f"{where} load_format", load_format)
        vgates = t.get("gates", [])
        if not isinstance(vgates, list):
            raise SparkstackError(f"{where} gates: expected a list of commands, got {vgates!r}")
        vgates = [_argv(f"{where} gates", g) for g in vgates]
        if any(not g for g in vgates):
            raise SparkstackError(f"{where} gates: a gate is an empty command")
        variants[vname] = Variant(vname, tuple(wheels), load_format, tuple(vgates))
    return Overlay(path, name, image_name, repo, rev, subdir, bundle_sha256, vllm_root, tuple(installs), tuple(steps),
                   tuple(runtime), variants)


def _sha(where: str, value: object) -> str:
    if value == UNPINNED:
        return value
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise SparkstackError(f"{where}: sha256 must be 64 hex digits or \"unpinned\", got {value!r}")
    return value


def read_checked(source_dir: Path, f: SourceFile, allow_unpinned: bool) -> bytes:
    """Read one overlay source file and check it against its pinned sha256."""
    path = source_dir / f.path
    if path.exists() and not path.is_file():  # a fifo would block the read forever
        raise SparkstackError(f"{path}: overlay source file is not a regular file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SparkstackError(f"{path}: overlay source file is missing") from None
    actual = hashlib.sha256(data).hexdigest()
    if f.sha256 == UNPINNED:
        if not allow_unpinned:
            raise SparkstackError(f"{f.path} is unpinned in overlay.toml; run `sparkstack pin overlay --overlay-src DIR` or pass --allow-unpinned")
    elif actual != f.sha256:
        raise SparkstackError(f"{path}: sha256 {actual} does not match the pinned {f.sha256}")
    return data

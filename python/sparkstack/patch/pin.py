"""`pin overlay`: fill overlay.toml's sha256 fields from the real overlay files (and wheels).

The plan hashes the files and lists every field that would change. Apply edits
the TOML through tomlkit, so comments and layout stay as they are, then reloads
the result and checks that each hash landed on its own file before the atomic
replace. It writes only a checkout's overlay.toml: never an installed copy in
site-packages or the Nix store.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from sparkstack import fsio, shipped
from sparkstack.errors import SparkstackError
from sparkstack.patch.overlay import UNPINNED, load_overlay
from sparkstack.patch.source import opened_source


@dataclass(frozen=True)
class PinChange:
    table: str  # "install", "steps" or "variants.<name>.wheels"
    position: int  # index in that array of tables
    file: str  # the `src`, `script` or `file` the hash belongs to
    old: str
    new: str


@dataclass(frozen=True)
class PinPlan:
    overlay_toml: Path
    hashes: tuple[tuple[str, str], ...]  # (file, sha256) of every file pinned
    changes: tuple[PinChange, ...]
    notes: tuple[str, ...] = ()  # what the user should know about the source (a checkout at another rev)

    @property
    def up_to_date(self) -> bool:
        return not self.changes

    def to_json(self) -> dict:
        return {"overlay": str(self.overlay_toml), "up_to_date": self.up_to_date,
                "hashes": dict(self.hashes), "notes": list(self.notes),
                "changes": [{"table": c.table, "position": c.position, "file": c.file, "old": c.old, "new": c.new}
                            for c in self.changes]}

    def lines(self, dry_run: bool) -> list[str]:
        """The human form of `pin overlay`: each change, then what was written."""
        # Each file's hash first, in sha256sum's own format, so two sources compare with diff or sha256sum -c.
        hashes = [f"{sha}  {file}" for file, sha in self.hashes] + [f"note: {n}" for n in self.notes]
        if self.up_to_date:
            return [*hashes, f"up to date: {self.overlay_toml}"]
        lines = [f"{'would pin' if dry_run else 'pinned'} {ch.file}: {ch.old} -> {ch.new}" for ch in self.changes]
        return [*hashes, *lines] if dry_run else [*hashes, *lines, f"wrote {self.overlay_toml}"]


def _refuse_installed_copy(path: Path) -> None:
    root = shipped.installed_copy_root(path)
    if root is not None:
        raise SparkstackError(f"{path.resolve()}: is an installed copy (under {root}); pin a checkout's overlay.toml "
                              "instead: run from the checkout or pass --overlay DIR")


def _entries(doc) -> list[tuple[str, int, str, object]]:
    """(table, position, file, table item) for every sha256 field of overlay.toml, in file order."""
    out = []
    for key, name_key in (("install", "src"), ("steps", "script")):
        for i, t in enumerate(doc.get(key, [])):
            out.append((key, i, t[name_key], t))
    for vname, variant in doc.get("variants", {}).items():
        for i, w in enumerate(variant.get("wheels", [])):
            out.append((f"variants.{vname}.wheels", i, w["file"], w))
    return out


def plan_pin(overlay_dir: Path, overlay_src: Path, wheel_dir: Path | None = None, repin: bool = False) -> PinPlan:
    """`repin`: replace hashes that are pinned already. Without it, a source whose files differ from the pinned
    ones is refused, each such file named with both hashes: a file retyped with one character wrong must not
    become the pin."""
    overlay = load_overlay(overlay_dir)  # validates every key and path first
    _refuse_installed_copy(overlay.path)
    with opened_source(overlay, overlay_src) as src:
        files = {i.file.path: src / i.file.path for i in overlay.installs}
        files.update({s.script.path: src / s.script.path for s in overlay.steps})
        # A disabled step's script is pinned when the source has it; the blog does not print it.
        optional = {s.script.path for s in overlay.steps if not s.enabled}
        if wheel_dir is not None:
            files.update({w.file: wheel_dir / w.file for v in overlay.variants.values() for w in v.wheels})
        hashes = {}
        for rel, path in files.items():
            if not path.is_file():
                if rel in optional and not path.exists():
                    continue
                raise SparkstackError(f"{overlay_src}: {rel} is missing ({path}); cannot pin it")
            hashes[rel] = fsio.sha256_file(path)
    doc = tomlkit.parse(overlay.path.read_text(encoding="utf-8"))
    changes = tuple(PinChange(table, i, file, str(item["sha256"]), hashes[file])
                    for table, i, file, item in _entries(doc)
                    if file in hashes and str(item["sha256"]) != hashes[file])
    differ = [c for c in changes if c.old != UNPINNED]
    if differ and not repin:
        listed = "; ".join(f"{c.file} (pinned {c.old[:12]}, this source {c.new[:12]})" for c in differ)
        raise SparkstackError(f"{overlay_src}: {len(differ)} file(s) differ from what {overlay.path} pins: {listed}; "
                              "this is not the pinned overlay (pass --repin to pin it instead, then commit "
                              "overlay.toml)")
    return PinPlan(overlay.path, tuple(sorted(hashes.items())), changes, _checkout_notes(overlay_src, overlay.rev))


def _checkout_notes(src: Path, rev: str) -> tuple[str, ...]:
    """A git checkout at another commit than overlay.toml's rev: said, since the rev is what the docs tell users
    to check out (the files' hashes still decide what is pinned and built)."""
    if not (src.is_dir() and (src / ".git").exists()):
        return ()
    try:
        proc = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    head = proc.stdout.strip()
    if proc.returncode != 0 or head == rev:
        return ()
    return (f"{src} is a git checkout at {head[:12]}, not overlay.toml's rev {rev[:12]}: its files are what is "
            f"hashed here; `git -C {src} checkout {rev}` gives the pinned rev's",)


def apply_pin(plan: PinPlan) -> None:
    if plan.up_to_date:
        return
    text = plan.overlay_toml.read_text(encoding="utf-8")
    doc = tomlkit.parse(text)
    want = {(c.table, c.position): c for c in plan.changes}
    for table, i, file, item in _entries(doc):
        change = want.get((table, i))
        if change is None:
            continue
        if file != change.file or str(item["sha256"]) != change.old:
            raise SparkstackError(f"{plan.overlay_toml}: changed since it was planned; run again")
        item["sha256"] = change.new
    new_text = tomlkit.dumps(doc)
    _check_landed(plan, new_text)
    fsio.write_atomic(plan.overlay_toml, new_text.encode("utf-8"))


def _check_landed(plan: PinPlan, new_text: str) -> None:
    """Every changed hash sits on its own file's table, and nothing but sha256 values changed."""
    before = tomlkit.parse(plan.overlay_toml.read_text(encoding="utf-8")).unwrap()
    after = tomlkit.parse(new_text).unwrap()
    got = {(t, i): (f, str(item["sha256"])) for t, i, f, item in _entries(tomlkit.parse(new_text))}
    for c in plan.changes:
        if got.get((c.table, c.position)) != (c.file, c.new):
            raise SparkstackError(f"{plan.overlay_toml}: the hash for {c.file} did not land on its own entry; nothing written")

    def without_hashes(doc):
        if isinstance(doc, dict):
            return {k: without_hashes(v) for k, v in doc.items() if k != "sha256"}
        if isinstance(doc, list):
            return [without_hashes(v) for v in doc]
        return doc

    if without_hashes(before) != without_hashes(after):
        raise SparkstackError(f"{plan.overlay_toml}: pinning would change more than sha256 fields; nothing written")

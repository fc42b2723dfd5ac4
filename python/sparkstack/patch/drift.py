"""The drift report: for each patch step, is it applied, applicable, or drifted against this base?

Edits are read from the pinned, hash-checked script by static evaluation of its
literal (marker, anchor, replacement) tuples: the script is never imported or
run for this. Scripts without such literals are dry-run on a scratch copy.
"""

from __future__ import annotations

import ast
import difflib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio
from sparkstack.errors import SparkstackError
from sparkstack.oci.layers import LayerCache
from sparkstack.oci.rootfs import open_rootfs
from sparkstack.patch.engine import last_line, lay_out, needed_paths, run_step, snapshot, step_argv
from sparkstack.patch.overlay import Overlay, Step, load_overlay, read_checked
from sparkstack.patch.source import check_pinned, opened_source, require_source, source_files

Edit = tuple[str, str, str]  # marker, anchor, replacement


@dataclass(frozen=True)
class EditReport:
    file: str  # relative to the vLLM root
    marker: str
    status: str  # applied (marker already there) | applicable | drifted (anchor not found once) | gone (no file)
    matches: int
    diff: str  # for drifted: the closest region of the file against the anchor; for gone: one line


@dataclass(frozen=True)
class StepReport:
    name: str
    status: str  # applied | applicable | drifted | gone (a file it edits is not in the base)
    method: str  # "static" (literal edits) or "dry-run"
    edits: tuple[EditReport, ...]
    detail: str

    def to_json(self) -> dict:
        return {"step": self.name, "status": self.status, "method": self.method, "detail": self.detail,
                "edits": [e.__dict__ for e in self.edits]}


@dataclass(frozen=True)
class InstallReport:
    """An overlay file against the base: absent (the overlay adds it), identical, or present upstream (the base's
    vLLM already ships a file there, which the build would replace with the overlay's)."""

    dest: str  # relative to the vLLM root
    status: str  # absent | identical | present-upstream
    detail: str

    def to_json(self) -> dict:
        return {"dest": self.dest, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Drift:
    steps: tuple[StepReport, ...]
    installs: tuple[InstallReport, ...]

    @property
    def failed(self) -> list[str]:
        """The steps a build cannot apply."""
        return [r.name for r in self.steps if r.status in ("drifted", "gone")]

    def lines(self) -> list[str]:
        """The human drift report: each step, its edits that did not apply cleanly, each install target."""
        lines = []
        for r in self.steps:
            lines.append(f"{r.status:<10} {r.name}  ({r.method}: {r.detail})")
            for e in r.edits:
                if e.status == "drifted":
                    lines.append(f"  drifted edit {e.marker or '(no marker)'} in {e.file}:")
                    lines += ["    " + l for l in e.diff.splitlines()]
                elif e.status in ("gone", "applied"):
                    said = e.diff if e.status == "gone" else "marker already there"
                    lines.append(f"  {e.status} edit {e.marker or '(no marker)'} in {e.file}: {said}")
        lines += [f"{i.status:<10} install {i.dest}  ({i.detail})" for i in self.installs]
        return lines


class _NotLiteral(Exception):
    pass


def _eval(node: ast.AST, env: dict[str, object]) -> object:
    """Evaluate string literals, their concatenation, names bound to them, tuples, lists and dicts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        raise _NotLiteral
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_eval(k, env): _eval(v, env) for k, v in zip(node.keys, node.values)}
    raise _NotLiteral


def _as_edits(value: object) -> list[Edit] | None:
    if isinstance(value, list) and value and all(
            isinstance(e, list) and len(e) == 3 and all(isinstance(x, str) for x in e) for e in value):
        return [tuple(e) for e in value]
    return None


def literal_edits(source: str) -> dict[str | None, list[Edit]]:
    """Edits declared as module-level literals: a list of triples, or {relative file: [triples]}.

    The key None means "the step's own target file(s)".
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise SparkstackError(f"patch script does not parse: line {exc.lineno}: {exc.msg}") from None
    env: dict[str, object] = {}
    found: dict[str | None, list[Edit]] = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        try:
            value = _eval(stmt.value, env)
        except _NotLiteral:
            continue
        env[stmt.targets[0].id] = value
        edits = _as_edits(value)
        if edits:
            found.setdefault(None, []).extend(edits)
        elif isinstance(value, dict) and value and all(isinstance(k, str) for k in value):
            per_file = {k: _as_edits(v) for k, v in value.items()}
            if all(per_file.values()):
                for k, v in per_file.items():
                    found.setdefault(k, []).extend(v)
    return found


def closest_region(text: str, anchor: str, label: str) -> str:
    """A unified diff of the anchor against the most similar run of lines in the file."""
    want = anchor.splitlines(keepends=True) or [anchor]
    lines = text.splitlines(keepends=True)
    k = len(want)
    best, best_at = -1.0, 0
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2("".join(want))
    for i in range(max(1, len(lines) - k + 1)):
        matcher.set_seq1("".join(lines[i:i + k]))
        if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
            continue
        ratio = matcher.ratio()
        if ratio > best:
            best, best_at = ratio, i
    region = lines[best_at:best_at + k]
    return "".join(difflib.unified_diff(want, region, "anchor (pinned script)",
                                        f"{label}:{best_at + 1}-{best_at + len(region)}"))


def _check_edit(file: str, text: str | None, edit: Edit) -> EditReport:
    marker, anchor, _ = edit
    if text is None:
        return EditReport(file, marker, "gone", 0, f"{file} is not in the base image")
    if marker and marker in text:
        return EditReport(file, marker, "applied", text.count(anchor), "")
    n = text.count(anchor)
    if n == 1:
        return EditReport(file, marker, "applicable", 1, "")
    diff = closest_region(text, anchor, file) if n == 0 else f"anchor occurs {n} times; it must occur once"
    return EditReport(file, marker, "drifted", n, diff)


def _overall(statuses: list[str]) -> str:
    if "gone" in statuses:
        return "gone"
    if "drifted" in statuses:
        return "drifted"
    if statuses and all(s == "applied" for s in statuses):
        return "applied"
    return "applicable"


def check_drift(base_files: dict[str, bytes | None], overlay: Overlay, steps: tuple[Step, ...],
                source_dir: Path, allow_unpinned: bool) -> tuple[StepReport, ...]:
    reports = []
    for step in steps:
        script = read_checked(source_dir, step.script, allow_unpinned)
        edits = literal_edits(script.decode("utf-8", errors="replace"))
        if edits:
            reports.append(_static_report(base_files, overlay, step, edits))
        else:
            reports.append(_dry_run_report(base_files, overlay, step, script))
    return tuple(reports)


def _text(base_files: dict[str, bytes | None], overlay: Overlay, rel: str) -> str | None:
    data = base_files.get(f"{overlay.vllm_root}/{rel}")
    return None if data is None else data.decode("utf-8", errors="replace")


def _static_report(base_files, overlay: Overlay, step: Step, edits: dict[str | None, list[Edit]]) -> StepReport:
    results = []
    for key, group in edits.items():
        for edit in group:
            if key is not None:
                results.append(_check_edit(key, _text(base_files, overlay, key), edit))
                continue
            # Unkeyed edits apply to the step's file(s): judge each against the file it fits best.
            candidates = [_check_edit(t, _text(base_files, overlay, t), edit) for t in step.touches]
            rank = {"applied": 0, "applicable": 1, "drifted": 2, "gone": 3}
            results.append(min(candidates, key=lambda r: rank[r.status]))
    status = _overall([r.status for r in results])
    counts = [f"{sum(r.status == k for r in results)} {k}" for k in ("gone", "drifted", "applied", "applicable")
              if any(r.status == k for r in results)]
    return StepReport(step.name, status, "static", tuple(results), f"{len(results)} edits: {', '.join(counts)}")


def _dry_run_report(base_files, overlay: Overlay, step: Step, script: bytes) -> StepReport:
    gone = [t for t in step.touches if _text(base_files, overlay, t) is None]
    if gone:
        return StepReport(step.name, "gone", "dry-run", (), f"{', '.join(gone)} is not in the base image")
    with fsio.staging_dir(Path(tempfile.gettempdir()), "drift") as work:
        scratch = work / "root"
        scratch.mkdir()
        lay_out(scratch, base_files)
        path = work / Path(step.script.path).name
        path.write_bytes(script)
        before = snapshot(scratch)
        proc = run_step(step_argv(step, path, scratch, overlay.vllm_root), work)
        if proc.returncode != 0:
            return StepReport(step.name, "drifted", "dry-run", (), last_line(proc.stderr or proc.stdout))
        changed = snapshot(scratch) != before
        return StepReport(step.name, "applicable" if changed else "applied", "dry-run", (),
                          "script ran cleanly on a scratch copy" + ("" if changed else " and changed nothing"))


def install_reports(base_files: dict[str, bytes | None], overlay: Overlay, source_dir: Path,
                    allow_unpinned: bool) -> tuple[InstallReport, ...]:
    out = []
    for inst in overlay.installs:
        ours = read_checked(source_dir, inst.file, allow_unpinned)
        theirs = base_files.get(f"{overlay.vllm_root}/{inst.dest}")
        if theirs is None:
            out.append(InstallReport(inst.dest, "absent", "not in the base: the overlay adds it"))
        elif theirs == ours:
            out.append(InstallReport(inst.dest, "identical", "the base already holds this very file"))
        else:
            out.append(InstallReport(inst.dest, "present-upstream", f"the base's vLLM ships its own ({len(theirs):,} B, "
                                     f"the overlay's is {len(ours):,} B): a build would replace it"))
    return tuple(out)


@dataclass(frozen=True)
class CheckPlan:
    """What `patch check` would do, from overlay.toml alone: the steps, and the base files they read."""

    base: Path
    steps: tuple[str, ...]
    extract: tuple[str, ...]

    def to_json(self) -> dict:
        return {"base": str(self.base), "steps": list(self.steps), "extract": list(self.extract)}


def plan_check(base: Path, overlay_dir: Path, extra_steps: tuple[str, ...]) -> CheckPlan:
    overlay = load_overlay(overlay_dir)
    steps = overlay.enabled_steps(extra_steps)
    return CheckPlan(base, tuple(s.name for s in steps), tuple(needed_paths(overlay, steps)))


def drift_report(base: Path, overlay_dir: Path, overlay_src: Path | None, platform: str = "linux/arm64",
                 extra_steps: tuple[str, ...] = (), allow_unpinned: bool = False,
                 cache: LayerCache | None = None, on_progress=None) -> Drift:
    """`patch check`: read the files the steps touch and the install targets from the base, then judge them."""
    overlay = load_overlay(overlay_dir)
    require_source(overlay, overlay_src)
    steps = overlay.enabled_steps(extra_steps)
    with opened_source(overlay, overlay_src) as source_dir:  # refuses a wrong bundle before a base byte is read
        check_pinned(overlay, source_dir, source_files(overlay, steps), overlay_src)
    paths = sorted(set(needed_paths(overlay, steps)) | {f"{overlay.vllm_root}/{i.dest}" for i in overlay.installs})
    src, _, rootfs = open_rootfs(base, platform, paths, cache, on_progress)
    try:
        base_files = rootfs.read_files(paths)
    finally:
        src.close()
    with opened_source(overlay, overlay_src) as source_dir:
        return Drift(check_drift(base_files, overlay, steps, source_dir, allow_unpinned),
                     install_reports(base_files, overlay, source_dir, allow_unpinned))

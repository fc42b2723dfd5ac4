"""The patch engine: install overlay files and run pinned patch steps on a scratch tree laid out like the image.

Never touches base blobs. Proves each step idempotent (a second run changes no
byte), parses every touched .py with `ast`, and reports which files changed.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sparkstack.errors import SparkstackError
from sparkstack.patch.overlay import PLACEHOLDER, Overlay, Step, read_checked

STEP_TIMEOUT_S = 120


@dataclass(frozen=True)
class StepOutcome:
    name: str
    changed: tuple[str, ...]  # image-relative paths


@dataclass(frozen=True)
class GateResult:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class PatchResult:
    files: dict[str, bytes]  # image-relative path -> final bytes, for every new or changed file
    steps: tuple[StepOutcome, ...]
    gates: tuple[GateResult, ...]


def needed_paths(overlay: Overlay, steps: tuple[Step, ...]) -> list[str]:
    """Image-relative paths the steps read from the base."""
    return sorted({f"{overlay.vllm_root}/{t}" for s in steps for t in s.touches})


def lay_out(scratch: Path, files: dict[str, bytes | None]) -> None:
    for rel, data in files.items():
        if data is None:
            continue
        target = scratch / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath, n)
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def step_argv(step: Step, script: Path, scratch: Path, vllm_root: str) -> list[str]:
    vllm = scratch / vllm_root

    def sub(m: re.Match) -> str:  # load_overlay has already refused unknown or escaping placeholders
        return str(vllm / m.group(2)) if m.group(1) == "file" else str(vllm)

    return [sys.executable, str(script), *(PLACEHOLDER.sub(sub, a) for a in step.args)]


def run_step(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"}
    try:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SparkstackError(f"{Path(argv[1]).name}: timed out after {STEP_TIMEOUT_S} s") from None


def last_line(text: str) -> str:
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else "(no output)"


def apply_overlay(base_files: dict[str, bytes | None], overlay: Overlay, steps: tuple[Step, ...],
                  source_dir: Path, workdir: Path, allow_unpinned: bool) -> PatchResult:
    scratch = workdir / "root"
    scripts = workdir / "scripts"
    scratch.mkdir(parents=True)
    scripts.mkdir()
    lay_out(scratch, base_files)
    original = snapshot(scratch)

    installed = []
    for inst in overlay.installs:
        data = read_checked(source_dir, inst.file, allow_unpinned)
        rel = f"{overlay.vllm_root}/{inst.dest}"
        lay_out(scratch, {rel: data})
        installed.append(rel)

    outcomes = []
    for step in steps:
        gone = [t for t in step.touches if not (scratch / overlay.vllm_root / t).is_file()]
        if gone:
            raise SparkstackError(f"patch step {step.name}: {', '.join(gone)} is not in the base image (gone upstream?); "
                                  "`sparkstack patch check` reports every step")
        script = scripts / Path(step.script.path).name
        script.write_bytes(read_checked(source_dir, step.script, allow_unpinned))
        argv = step_argv(step, script, scratch, overlay.vllm_root)
        before = snapshot(scratch)
        first = run_step(argv, workdir)
        if first.returncode != 0:
            raise SparkstackError(f"patch step {step.name} failed: {last_line(first.stderr or first.stdout)}")
        after = snapshot(scratch)
        second = run_step(argv, workdir)
        if second.returncode != 0 or snapshot(scratch) != after:
            raise SparkstackError(f"patch step {step.name} is not idempotent: a second run "
                                  + ("failed" if second.returncode else "changed the files again"))
        outcomes.append(StepOutcome(step.name, tuple(sorted(k for k in after if after[k] != before.get(k)))))

    final = snapshot(scratch)
    changed = sorted(k for k in final if final[k] != original.get(k))
    gates = static_gates(scratch, overlay, steps, installed, changed)
    failed = [g for g in gates if not g.ok]
    if failed:
        raise SparkstackError(f"static gate {failed[0].name} failed: {failed[0].detail}")
    return PatchResult({k: (scratch / k).read_bytes() for k in changed}, tuple(outcomes), gates)


def static_gates(scratch: Path, overlay: Overlay, steps: tuple[Step, ...], installed: list[str],
                 changed: list[str]) -> tuple[GateResult, ...]:
    results = []
    for rel in installed + [f"{overlay.vllm_root}/{t}" for s in steps for t in s.touches]:
        ok = (scratch / rel).is_file()
        results.append(GateResult(f"present:{rel}", ok, "" if ok else "file is missing after the overlay"))
    for rel in changed:
        if rel.endswith(".py"):
            try:
                ast.parse((scratch / rel).read_bytes(), filename=rel)
                results.append(GateResult(f"ast:{rel}", True, ""))
            except SyntaxError as exc:
                results.append(GateResult(f"ast:{rel}", False, f"{rel}:{exc.lineno}: {exc.msg}"))
    for step in steps:
        texts = [(scratch / overlay.vllm_root / t).read_text(errors="replace") for t in step.touches
                 if (scratch / overlay.vllm_root / t).is_file()]
        for marker in step.markers:
            ok = any(marker in t for t in texts)
            results.append(GateResult(f"marker:{step.name}:{marker}", ok, "" if ok else f"marker {marker!r} not found"))
    return tuple(results)

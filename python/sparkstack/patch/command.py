"""`sparkstack patch check` and `sparkstack pin overlay`: the command objects, and the overlay options that
`image build` and `up` share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.command import Command, View, option


def overlay_option():
    return option(None, "--overlay", kind="path",
                  help="Dir holding overlay.toml (default: the shipped overlays/dflash2).")


def overlay_src_option(required: bool = False):
    return option(None, "--overlay-src", kind="path", env="SPARKSTACK_OVERLAY_SRC", required=required,
                  help="The overlay's files: an upstream checkout at the pinned rev, the blog's working dir "
                       "(or its files/), or the blog's bundle (checked by SHA-256 first).")


def platform_option():
    return option("linux/arm64", "--platform", show_default=True, help="Platform to pick from the base.")


def steps_option():
    return option((), "--with-step", kind="many", help="Also run this optional patch step.")


def unpinned_option():
    return option(False, "--allow-unpinned", kind="flag",
                  help="Build from unpinned overlay files; labels the image unpinned.")


def overlay_dir(given: Path | None) -> Path:
    """--overlay as given, else the shipped overlay."""
    from sparkstack.shipped import default_overlay_dir

    return given if given is not None else default_overlay_dir()


# ---------------------------------------------------------------- patch check

@dataclass(frozen=True, kw_only=True)
class CheckRequest:
    base: Path = option(None, "--base", kind="path", required=True)
    overlay: Path | None = overlay_option()
    overlay_src: Path | None = overlay_src_option()
    platform: str = platform_option()
    with_step: tuple[str, ...] = steps_option()
    allow_unpinned: bool = unpinned_option()
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="List the steps and the files they need from the base; read no layer.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class CheckPlan:
    request: CheckRequest
    overlay_dir: Path
    check: object = None  # patch.drift.CheckPlan, made for a dry run only (it reads the base's documents)


def plan_check(request: CheckRequest, environ: Mapping[str, str]) -> CheckPlan:
    from sparkstack.patch.drift import plan_check as plan_drift_check

    where = overlay_dir(request.overlay)
    return CheckPlan(request, where, plan_drift_check(request.base, where, request.with_step)
                     if request.dry_run else None)


def apply_check(p: CheckPlan, view: View):
    from sparkstack.patch.drift import drift_report

    r = p.request
    with view.progress("reading base layers", None) as advance:
        return drift_report(r.base, p.overlay_dir, r.overlay_src, r.platform, r.with_step, r.allow_unpinned,
                            on_progress=advance)


CHECK = Command(
    ("patch", "check"), CheckRequest, plan_check, apply_check,
    plan_lines=lambda p: [f"would check {', '.join(p.check.steps)} against {p.request.base} "
                          f"({len(p.check.extract)} files)"],
    plan_json=lambda p: p.check.to_json(),
    result_lines=lambda p, drift: drift.lines(),
    result_json=lambda p, drift: {"steps": [r.to_json() for r in drift.steps],
                                  "installs": [i.to_json() for i in drift.installs]},
    failure=lambda p, drift: (f"steps a build cannot apply (drifted or gone): {', '.join(drift.failed)}"
                              if drift is not None and drift.failed else None))


# ---------------------------------------------------------------- pin overlay

@dataclass(frozen=True, kw_only=True)
class PinRequest:
    overlay: Path | None = overlay_option()
    overlay_src: Path = overlay_src_option(required=True)
    wheels: Path | None = option(None, "--wheels", kind="path", help="Dir holding the variants' wheels.")
    repin: bool = option(False, "--repin", kind="flag",
                         help="Replace hashes already pinned (without it, a source whose files differ is refused).")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print what would change; write nothing.")
    as_json: bool = option(False, "--json", kind="flag")


def plan_pin(request: PinRequest, environ: Mapping[str, str]):
    from sparkstack.patch.pin import plan_pin as plan_overlay_pin

    return plan_overlay_pin(overlay_dir(request.overlay), request.overlay_src, request.wheels, request.repin)


def _apply_pin(p, view: View):
    from sparkstack.patch.pin import apply_pin

    apply_pin(p)
    return p


PIN = Command(("pin", "overlay"), PinRequest, plan_pin, _apply_pin,
              plan_lines=lambda p: p.lines(True), plan_json=lambda p: {**p.to_json(), "dry_run": True},
              result_lines=lambda p, r: p.lines(False), result_json=lambda p, r: {**p.to_json(), "dry_run": False})

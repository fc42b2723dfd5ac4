"""`sparkstack image build`: the command object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.command import WILL_RUN, UP_TO_DATE, Command, Summary, View, option
from sparkstack.patch.command import (overlay_dir, overlay_option, overlay_src_option, platform_option, steps_option,
                                      unpinned_option)


def link_base_option():
    return option("hardlink", "--link-base", kind=("choice", ("hardlink", "symlink")), show_default=True,
                  help="How a dir --out reuses base blobs: hardlinks (copies across filesystems), or absolute "
                       "symlinks to the base blobs' resolved paths (Nix builds: store files cannot be hardlinked).")


@dataclass(frozen=True, kw_only=True)
class Request:
    base: Path = option(None, "--base", kind="path", required=True,
                        help="Base image: OCI layout dir (`image pull --out DIR` makes the pinned one), oci-archive or "
                             "docker-archive tar.")
    overlay: Path | None = overlay_option()
    overlay_src: Path | None = overlay_src_option()
    out: Path = option(Path("image"), "--out", kind="path", show_default=True,
                       help="Output OCI layout dir, or a .tar archive.")
    variant: str = option("plain", "--variant", show_default=True,
                          help="plain, or a variant from overlay.toml (instanttensor).")
    wheels: Path | None = option(None, "--wheels", kind="path", help="Dir holding the variant's pinned wheels.")
    platform: str = platform_option()
    with_step: tuple[str, ...] = steps_option()
    allow_unpinned: bool = unpinned_option()
    link_base: str = link_base_option()
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan and build nothing.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class Plan:
    request: Request
    build: object  # image.plan.BuildPlan


def plan(request: Request, environ: Mapping[str, str]) -> Plan:
    from sparkstack.image import plan_build

    r = request
    return Plan(r, plan_build(r.base, overlay_dir(r.overlay), r.overlay_src, r.out, r.variant, r.platform,
                              r.with_step, r.allow_unpinned, r.wheels, r.link_base))


def apply(p: Plan, view: View):
    from sparkstack.image import build_image

    with view.progress("reading base layers", None) as advance:
        return build_image(p.build, on_progress=advance)


def _warnings(p: Plan) -> tuple[str, ...]:
    unpinned = p.build.overlay.unpinned
    return (f"building from unpinned overlay files: {', '.join(unpinned)}",) if unpinned else ()


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def summary(p: Plan) -> Summary:
    b, out = p.build, p.request.out
    if b.up_to_date:
        return Summary(UP_TO_DATE, f"{out}: config {b.existing.config_digest[:19]}, built from these inputs", None,
                       {"config": b.existing.config_digest, "manifest": b.existing.manifest_digest, "image": str(out)})
    return Summary(WILL_RUN, f"one layer ({_count(len(b.overlay.installs), 'install')}, "
                   f"{_count(len(b.steps), 'patch step')}) onto base {b.base_manifest_digest[:19]}, into {out}", None,
                   {"base": b.base_manifest_digest})


def _plan_lines(p: Plan) -> list[str]:
    from sparkstack.image.plan import plan_lines

    return plan_lines(p.build)


COMMAND = Command(("image", "build"), Request, plan, apply, plan_lines=_plan_lines,
                  plan_json=lambda p: p.build.to_json(), result_lines=lambda p, r: r.lines(),
                  result_json=lambda p, r: {"plan": p.build.to_json(), "result": r.to_json()}, warnings=_warnings,
                  summary=summary, outputs=lambda p, r: {"config": r.config_digest, "manifest": r.manifest_digest,
                                                          "image": str(r.out)})

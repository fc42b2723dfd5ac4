"""`sparkstack up`: the command object. Its options are its stages' own, declared where those commands
declare them (same defaults, same environment variables)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.bench.command import BenchOptions
from sparkstack.command import Command, View, absolute, embed, option, request
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.image.command import link_base_option
from sparkstack.launch.command import LaunchOptions
from sparkstack.oci.command import pins_option
from sparkstack.patch.command import overlay_option, overlay_src_option, platform_option
from sparkstack.ship.command import streams_option, via_option
from sparkstack.tune.command import host_root_option, ssh_config_option
from sparkstack.options import SamplingOptions, image_option, recipe_option
from sparkstack.verify.command import api_key_env_option


@request
class Request:
    recipe: str | None = recipe_option()
    start: str | None = option(None, "--from", metavar="STAGE", help="Apply from this stage on (earlier ones are "
                               "still planned: a later stage may need their output).")
    until: str | None = option(None, "--until", metavar="STAGE", help="Apply up to and including this stage.")
    bench: bool = option(False, "--bench", kind="flag", help="Also bench the served pair, last.")
    yes: bool = option(False, "--yes", kind="flag", help="Apply without asking (needed off a terminal).")
    image: Path | None = image_option(kind="path", help="A built image (OCI layout or archive): the build stage's "
                                                        "output as given (`nix run .#up` passes the flake's).")
    base: Path | None = option(None, "--base", kind="path",
                               help="The pinned base (OCI layout or archive) to build on, without Nix: `image pull --out DIR` makes it.")
    overlay: Path | None = overlay_option()
    overlay_src: Path | None = overlay_src_option()
    pins: Path | None = pins_option()
    out: Path = option(Path("image"), "--out", kind="path", show_default=True,
                       help="Where the build stage writes the image.")
    platform: str = platform_option()
    link_base: str = link_base_option()
    ssh_config: Path | None = ssh_config_option()
    host_root: Path = host_root_option("Host facts and tuning below this root, on every rank (as tune and launch "
                                       "take it).")
    _profile: object = embed(LaunchOptions, only=("profile",))
    via: str | None = via_option("ship's connection (as ship --via).")
    streams: int | None = streams_option("ship's ssh streams per host.")
    _boot: object = embed(LaunchOptions, only=("health_interval", "health_attempts", "worker_delay"))
    verify_timeout: float = option(300.0, "--verify-timeout", kind=("float", 0.1, 86400), show_default=True,
                                   help="verify: seconds for the whole run.")
    _sampling: object = embed(SamplingOptions, only=("temperature",))  # verify's too
    api_key_env: str = api_key_env_option()
    _bench: object = embed(BenchOptions, prefix="bench", only=("concurrency", "rounds", "category"))
    bench_out: Path = option(Path("bench.json"), "--bench-out", kind="path", show_default=True,
                             help="Where bench's report goes (its --json document).")
    _gates: object = embed(LaunchOptions, only=("gates",))
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Print the plan of every stage; change nothing.")
    as_json: bool = option(False, "--json", kind="flag", help="Print the plan (and the run) as JSON.")
    # not options: what plan() works out once from the ones above
    pins_path: Path | None = None  # --pins, else the checkout's nix/pins.json; None outside a checkout
    stages: tuple[str, ...] = ()  # the ones --from/--until leave in

    @property
    def pins_given(self) -> bool:
        return self.pins is not None

    @property
    def built_image(self) -> Path:
        return self.image if self.image is not None else self.out


def settle(r: Request) -> Request:
    """The request with its paths absolute (the commands `up` prints must run from any directory), its pins file
    found, and its stage range checked."""
    from sparkstack.endpoint.client import check_key_env
    from sparkstack.oci.pins import default_pins_path
    from sparkstack.patch.command import overlay_dir
    from sparkstack.up.plan import stage_range

    if r.image is not None and r.base is not None:
        raise UsageError("--image and --base: give one (--image is a built image; --base is what the build stage "
                         "builds on)")
    if r.image is not None and not r.image.exists():
        raise UsageError(f"--image {r.image}: no such file or directory")
    try:
        pins = default_pins_path(r.pins)
    except SparkstackError:
        pins = None  # outside a checkout: the build stage says so (it needs no pins when --image is given)
    check_key_env(r.api_key_env)
    return dataclasses.replace(
        r, image=absolute(r.image), base=absolute(r.base), overlay=absolute(overlay_dir(r.overlay)),
        overlay_src=absolute(r.overlay_src), pins=absolute(r.pins), pins_path=absolute(pins), out=absolute(r.out),
        ssh_config=absolute(r.ssh_config), host_root=absolute(r.host_root), bench_out=absolute(r.bench_out),
        stages=stage_range(r.start, r.until, r.bench))


def plan(request: Request, environ: Mapping[str, str]):
    from sparkstack.state import read_up_record
    from sparkstack.up.plan import plan_up

    return plan_up(settle(request), environ, read_up_record())


def apply(p, view: View):
    from sparkstack.up.apply import apply_up

    if not p.to_run and not p.blocked:
        return None
    return apply_up(p, view)


def _result_json(p, result) -> dict:
    return {**p.to_json(), "dry_run": False, "result": None if result is None else result.to_json()}


def _result_lines(p, result) -> list[str]:
    from sparkstack.up.report import result_lines

    return [] if result is None or result.stopped else result_lines(result)


def _plan_lines(p) -> list[str]:
    from sparkstack.up.report import plan_lines

    return plan_lines(p)


def stage_status(stage) -> str:
    """A stage as one check of up's verdict: up to date or to run passes; blocked by its own cause fails; one that
    waits on a blocked stage, or is left out by --from/--until, is skipped (it cannot be judged yet)."""
    from sparkstack.command import BLOCKED
    from sparkstack.up.plan import SKIPPED

    if stage.state == SKIPPED or (stage.state == BLOCKED and stage.after):
        return "skip"
    return "fail" if stage.state == BLOCKED else "pass"


def _verdict(p):
    from sparkstack.checkline import Verdict

    failed = next((s for s in p.stages if stage_status(s) == "fail"), None)
    return Verdict.of("sparkstack up", (stage_status(s) for s in p.stages),
                      refusal="" if failed is None else f"would stop at {failed.name}, which is blocked")


COMMAND = Command(
    ("up",), Request, plan, apply, plan_lines=_plan_lines, plan_json=lambda p: {**p.to_json(), "dry_run": True},
    verdict=_verdict,
    result_lines=_result_lines, result_json=_result_json,
    failure=lambda p, r: r.failure if r is not None else None,
    cut=lambda p, r: "" if r is not None and r.stopped == "cut" else None,
    preview=True, consent=lambda p: bool(p.to_run))

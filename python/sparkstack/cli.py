"""The `sparkstack` command: parse options, call plan/apply, render. No logic of its own."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

import click

from sparkstack import interrupt, terminal
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.units import human_bytes


def _fail(message: str) -> None:
    click.echo(f"sparkstack: error: {message}", err=True)
    sys.exit(1)


def _by() -> str:
    """" by SIGTERM" or " by SIGHUP" after "interrupted"; nothing for Ctrl-C."""
    return "" if interrupt.received() == signal.SIGINT else f" by {interrupt.name()}"


def _warn(message: str) -> None:
    click.echo(f"sparkstack: warning: {message}", err=True)


def one_line_errors(fn):
    """Turn expected failures into one stderr line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(str(exc)) from None
        except SparkstackError as exc:
            _fail(str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}")
        except KeyboardInterrupt:
            click.echo(f"sparkstack: interrupted{_by()} (outputs are published atomically: nothing half-written)",
                       err=True)
            sys.exit(interrupt.exit_code())

    return wrapper


def _print_json(doc: object) -> None:
    click.echo(json.dumps(doc, indent=2))


def _emit(as_json: bool, doc, lines) -> None:
    """--json: the document (`doc()`); else the lines (`lines()`), one each. Only the one shown is made."""
    if as_json:
        _print_json(doc())
        return
    for line in lines():
        click.echo(line)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sparkstack")
def main() -> None:
    """Plan, build, ship and launch GLM-5.3-Flash NVFP4 + DFlash2 on DGX Spark pairs."""


@main.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Output cache entry or dir (default: sibling ...-no-MTP).")
@click.option("--index-only", is_flag=True, help="Edit only config.json and the index; leave shards as they are.")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and result) as JSON.")
@one_line_errors
def strip(src: Path, out: Path | None, index_only: bool, dry_run: bool, as_json: bool) -> None:
    """Remove the MTP layer from a checkpoint, writing a new cache entry and never touching SRC."""
    from sparkstack.hfcache import no_mtp_destination, resolve_source
    from sparkstack.strip import apply_strip, plan_strip
    from sparkstack.strip.plan import plan_lines

    source = resolve_source(src)
    dest = (out.absolute() if out else no_mtp_destination(source))
    plan = plan_strip(source, dest, index_only=index_only)
    for w in plan.warnings:
        _warn(w)
    if dry_run:
        _emit(as_json, plan.to_json, lambda: plan_lines(plan))
        return
    total = sum(s.out_size - len(s.new_prefix) for s in plan.shards if s.action == "rewrite")
    with terminal.progress("rewriting shards", total, enabled=not plan.up_to_date and total > 0) as advance:
        result = apply_strip(plan, on_progress=advance, on_wait=lambda dest, pid: click.echo(
            f"sparkstack: waiting for another strip of {dest}" + (f" (pid {pid})" if pid else ""), err=True))
    _emit(as_json, lambda: {"plan": plan.to_json(), "result": result.to_json()}, lambda: result.lines(plan))


# ---------------------------------------------------------------- image / patch / pin

_overlay_opt = click.option("--overlay", "overlay_dir", type=click.Path(path_type=Path), default=None,
                            help="Dir holding overlay.toml (default: the shipped overlays/dflash2).")


def _overlay_dir(given: Path | None) -> Path:
    from sparkstack.shipped import default_overlay_dir

    return given if given is not None else default_overlay_dir()

_overlay_src_opt = click.option("--overlay-src", type=click.Path(path_type=Path), envvar="SPARKSTACK_OVERLAY_SRC",
                                help="Checkout of the overlay's upstream repo at its pinned rev (env SPARKSTACK_OVERLAY_SRC).")
_platform_opt = click.option("--platform", default="linux/arm64", show_default=True, help="Platform to pick from the base.")
_steps_opt = click.option("--with-step", "extra_steps", multiple=True, help="Also run this optional patch step.")
_unpinned_opt = click.option("--allow-unpinned", is_flag=True, help="Build from unpinned overlay files; labels the image unpinned.")


@main.group()
def image() -> None:
    """Build, verify and load the serving image (build and verify need no daemon)."""


@image.command("build")
@click.option("--base", type=click.Path(path_type=Path), required=True, help="Base image: OCI layout dir, oci-archive or docker-archive tar.")
@_overlay_opt
@_overlay_src_opt
@click.option("--out", type=click.Path(path_type=Path), default=Path("image"), show_default=True,
              help="Output OCI layout dir, or a .tar archive.")
@click.option("--variant", default="plain", show_default=True, help="plain, or a variant from overlay.toml (instanttensor).")
@click.option("--wheels", "wheel_dir", type=click.Path(path_type=Path), help="Dir holding the variant's pinned wheels.")
@_platform_opt
@_steps_opt
@_unpinned_opt
@click.option("--link-base", type=click.Choice(["hardlink", "symlink"]), default="hardlink", show_default=True,
              help="How a dir --out reuses base blobs: hardlinks (copies across filesystems), or absolute symlinks "
                   "to the base blobs' resolved paths (Nix builds: store files cannot be hardlinked).")
@click.option("--dry-run", is_flag=True, help="Print the plan and build nothing.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def image_build(base, overlay_dir, overlay_src, out, variant, wheel_dir, platform, extra_steps, allow_unpinned,
                link_base, dry_run, as_json) -> None:
    """Pinned base + overlay + patch steps -> one new layer; base layers reused by digest."""
    from sparkstack.image import build_image, plan_build
    from sparkstack.image.plan import plan_lines

    plan = plan_build(base, _overlay_dir(overlay_dir), overlay_src, out, variant, platform, tuple(extra_steps),
                      allow_unpinned, wheel_dir, link_base)
    if plan.overlay.unpinned:
        _warn(f"building from unpinned overlay files: {', '.join(plan.overlay.unpinned)}")
    if dry_run:
        _emit(as_json, plan.to_json, lambda: plan_lines(plan))
        return
    with terminal.progress("reading base layers", None) as advance:
        result = build_image(plan, on_progress=advance)
    _emit(as_json, lambda: {"plan": plan.to_json(), "result": result.to_json()}, result.lines)


@image.command("verify")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--platform", default=None, help="Platform to verify when the image holds several.")
@click.option("--dry-run", is_flag=True, help="Read the image's documents and list what would be checked; hash no layer.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def image_verify(path, platform, dry_run, as_json) -> None:
    """Re-hash every blob and check every layer's diff_id."""
    from sparkstack.oci.verify import plan_image_verify, verify_image

    if dry_run:
        plan = plan_image_verify(path, platform)
        _print_json(plan.to_json()) if as_json else click.echo(
            f"would verify {path}: config {plan.image.config_digest}, {len(plan.image.layers)} layers, "
            f"{human_bytes(plan.bytes_to_check)}")
        return
    with terminal.progress("verifying layers", None) as advance:
        report = verify_image(path, platform, on_progress=advance)
    if as_json:
        _print_json(report.to_json())
    else:
        click.echo(f"ok: {path}: config {report.config_digest}, {report.layers} layers, "
                   f"{human_bytes(report.bytes_checked)} checked" + ("; manifest.json agrees" if report.docker_manifest else ""))


@image.command("load")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--engine", type=click.Choice(["docker", "podman"]), default="docker", show_default=True)
@click.option("--host", default=None, help="Load on this rank over ssh (the stream crosses ssh's stdin).")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh client config for --host.")
@click.option("--docker-host", default=None, help="docker -H for the engine (e.g. unix:///path/docker.sock).")
@click.option("--platform", default=None, help="Platform to load when the image holds several.")
@click.option("--dry-run", is_flag=True, help="Say what would load; ask the engine only read-only questions.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def image_load(path, engine, host, ssh_config, docker_host, platform, dry_run, as_json) -> None:
    """Stream an OCI image into docker/podman load (no temp tar); its image ID must be the config digest."""
    from sparkstack.oci.load import apply_load, check_engine_options, plan_load
    from sparkstack.remote import Runner

    check_engine_options(engine, docker_host)
    runner = Runner(ssh=host, ssh_config=ssh_config, docker_host=docker_host)
    plan = plan_load(path, engine, runner, platform)
    if dry_run:
        _emit(as_json, plan.to_json, plan.lines)
        return
    with terminal.progress(f"loading into {engine}", plan.bytes_to_send, enabled=plan.action == "load") as advance:
        result = apply_load(plan, runner, platform, on_progress=advance)
    _emit(as_json, lambda: {"plan": plan.to_json(), "result": result.to_json()}, lambda: result.lines(plan))


@main.group()
def patch() -> None:
    """Inspect the overlay's patch steps against a base image."""


@patch.command("check")
@click.option("--base", type=click.Path(path_type=Path), required=True)
@_overlay_opt
@_overlay_src_opt
@_platform_opt
@_steps_opt
@_unpinned_opt
@click.option("--dry-run", is_flag=True, help="List the steps and the files they need from the base; read no layer.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def patch_check(base, overlay_dir, overlay_src, platform, extra_steps, allow_unpinned, dry_run, as_json) -> None:
    """The drift report: every step applied, applicable, drifted or gone; every install target absent, identical or
    present upstream. Exit 1 when a step drifted or its file is gone."""
    from sparkstack.patch.drift import drift_report, plan_check

    if dry_run:
        plan = plan_check(base, _overlay_dir(overlay_dir), tuple(extra_steps))
        _print_json(plan.to_json()) if as_json else click.echo(f"would check {', '.join(plan.steps)} against {base} "
                                                               f"({len(plan.extract)} files)")
        return
    with terminal.progress("reading base layers", None) as advance:
        drift = drift_report(base, _overlay_dir(overlay_dir), overlay_src, platform, tuple(extra_steps),
                             allow_unpinned, on_progress=advance)
    _emit(as_json, lambda: {"steps": [r.to_json() for r in drift.steps],
                             "installs": [i.to_json() for i in drift.installs]}, drift.lines)
    if drift.failed:
        _fail(f"steps a build cannot apply (drifted or gone): {', '.join(drift.failed)}")


@main.group()
def pin() -> None:
    """Pin inputs by content: the base image's digests (nix/pins.json) and the overlay's files."""


@pin.command("overlay")
@_overlay_opt
@click.option("--overlay-src", type=click.Path(path_type=Path), envvar="SPARKSTACK_OVERLAY_SRC", required=True,
              help="Checkout of the overlay's upstream repo at its pinned rev (env SPARKSTACK_OVERLAY_SRC).")
@click.option("--wheels", "wheel_dir", type=click.Path(path_type=Path), help="Dir holding the variants' wheels.")
@click.option("--dry-run", is_flag=True, help="Print what would change; write nothing.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def pin_overlay(overlay_dir, overlay_src, wheel_dir, dry_run, as_json) -> None:
    """Fill a checkout's overlay.toml sha256 fields from the real overlay files (and wheels)."""
    from sparkstack.patch.pin import apply_pin, plan_pin

    plan = plan_pin(_overlay_dir(overlay_dir), overlay_src, wheel_dir)
    if not dry_run:
        apply_pin(plan)
    _emit(as_json, lambda: {**plan.to_json(), "dry_run": dry_run}, lambda: plan.lines(dry_run))


_pins_opt = click.option("--pins", "pins_file", type=click.Path(path_type=Path), default=None,
                         help="Pins file (default: the checkout's nix/pins.json, found from the working directory up).")


@pin.command("base")
@click.argument("reference", required=False)
@click.option("--platform", "platforms", multiple=True, help="Platform to pin (repeatable; default: the file's, "
              "else linux/arm64).")
@_pins_opt
@click.option("--check", is_flag=True, help="Re-resolve and exit 1 naming what moved; write nothing.")
@click.option("--dry-run", is_flag=True, help="Resolve and print what would be written; write nothing.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def pin_base(reference, platforms, pins_file, check, dry_run, as_json) -> None:
    """Resolve the base REF (a tag or digest) through its registry and pin it, per platform, in nix/pins.json."""
    from sparkstack.oci.pins import apply_pin_base, default_pins_path, plan_pin_base

    path = default_pins_path(pins_file)
    if check and not path.exists():
        raise SparkstackError(f"{path}: no pins file to check")
    plan = plan_pin_base(reference, tuple(platforms), path)
    if check:
        if as_json:
            _print_json({**plan.to_json(), "check": True})
        if plan.changes:
            _fail(f"{plan.pins.reference} moved: " + "; ".join(plan.changes))
        if not as_json:
            click.echo(f"up to date: {path} matches {plan.pins.reference} ({plan.pins.resolved.digest})")
        return
    wrote = False if dry_run else apply_pin_base(plan)
    _emit(as_json, lambda: {**plan.to_json(), "dry_run": dry_run, "written": wrote}, lambda: plan.lines(dry_run))


@pin.command("fetch")
@click.argument("digest")
@_pins_opt
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Where the verified object goes.")
@click.option("--no-digest-check", is_flag=True,
              help="Leave the sha256 comparison to the caller (sizes are still checked): for the flake's "
                   "fixed-output derivations, where Nix checks the hash and names a wrong blob itself.")
@click.option("--dry-run", is_flag=True, help="Say what would be fetched from where; fetch nothing.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def pin_fetch(digest, pins_file, out, no_digest_check, dry_run, as_json) -> None:
    """Download one blob or manifest the pins file names, verify it, and write it atomically to --out."""
    from sparkstack.oci.pins import apply_blob_fetch, default_pins_path, plan_blob_fetch

    plan = plan_blob_fetch(digest, default_pins_path(pins_file), out)
    if dry_run:
        if as_json:
            _print_json(plan.to_json())
        else:
            click.echo(("up to date: " if plan.up_to_date else "would fetch ") +
                       f"{plan.what} {plan.digest} ({human_bytes(plan.size) if plan.size is not None else 'size unknown'}) "
                       f"from {plan.registry}/{plan.repository} to {plan.out}")
        return
    with terminal.progress(f"fetching {plan.what}", plan.size, enabled=not plan.up_to_date) as advance:
        fetched = apply_blob_fetch(plan, on_progress=advance, check_digest=not no_digest_check)
    if as_json:
        _print_json({**plan.to_json(), "fetched": fetched})
    else:
        click.echo(("fetched " if fetched else "up to date: ") + f"{plan.out} ({plan.what} {plan.digest})")


# ---------------------------------------------------------------- fetch


@main.command()
@click.option("--recipe", default=None, help="Recipe name or path: its model and [drafter] repos, and their revisions.")
@click.option("--resolve", is_flag=True, help="Ask the hub for the current commit of each unpinned repo and pin it "
              "in the recipe (through tomlkit); download nothing.")
@click.option("--dry-run", is_flag=True, help="Say what would be pinned or downloaded; write nothing.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def fetch(recipe, resolve, dry_run, as_json) -> None:
    """Download exactly the recipe's pinned model and drafter commits into the head's HF cache."""
    from sparkstack.deploy import load_deployment
    from sparkstack.fetch import apply_fetch, apply_resolve, plan_fetch, plan_resolve
    from sparkstack.fetch.apply import result_lines
    from sparkstack.fetch.plan import plan_lines, resolve_lines
    from sparkstack.recipe import load_recipe

    if resolve:
        rplan = plan_resolve(load_recipe(recipe))
        written = False if dry_run else apply_resolve(rplan)
        _emit(as_json, lambda: {**rplan.to_json(), "dry_run": dry_run, "written": written},
              lambda: resolve_lines(rplan, dry_run, written))
        return
    plan = plan_fetch(load_deployment(recipe, os.environ), os.environ)
    for w in plan.warnings:
        _warn(w)
    if dry_run:
        _emit(as_json, lambda: {**plan.to_json(), "dry_run": True}, lambda: plan_lines(plan))
        return
    from sparkstack.fetch.plan import licence_lines

    if plan.bytes_to_download and not as_json:  # read before a byte is downloaded (--json: in the document)
        for line in licence_lines(plan.recipe):
            click.echo(line)
    with terminal.progress("downloading", plan.bytes_to_download, enabled=plan.bytes_to_download > 0) as advance:
        results = apply_fetch(plan, on_progress=advance, on_wait=lambda entry, pid: click.echo(
            f"sparkstack: waiting for another fetch of {entry}" + (f" (pid {pid})" if pid else ""), err=True))
    _emit(as_json, lambda: {**plan.to_json(), "dry_run": False, "results": [r.to_json() for r in results]},
          lambda: result_lines(plan, results))


# ---------------------------------------------------------------- launch / plan kv

@main.command(cls=terminal.OptionalValueCommand)
@click.argument("target")
@click.option("--recipe", default=None, help="Recipe name (shipped, or under SPARKSTACK_RECIPES) or path. Default: glm53-flash-dflash2-nvfp4.")
@click.option("--image", "image", default=None,
              help="A built OCI layout (loaded on the head where missing, run by its content-addressed tag) or an "
                   "image reference. The IMAGE environment knob wins over it; it wins over the recipe.")
@click.option("--dry-run", is_flag=True, help="Print the plan and preflight from local facts; start or stop nothing.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--probe", is_flag=True, help="With --dry-run: also ask every rank's docker (over ssh) for image and containers.")
@click.option("--profile", type=click.Choice(["production", "lab"]), default="production", show_default=True,
              help="lab drops --gpus, --ulimit memlock and --device /dev/infiniband, which the lab lacks.")
@click.option("--host-root", type=click.Path(path_type=Path), default=Path("/"), show_default=True,
              help="Read host facts (/sys, /proc) below this root.")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh client config for the workers.")
@click.option("--force", is_flag=True, help="Launch a recipe marked blocked.")
@click.option("--gates/--no-gates", default=True, show_default=True,
              help="Before any rank starts, run in throwaway containers of the image (seconds, on the head): its vLLM's "
                   "own argument parser on every rank's engine argv, and its runtime import gates (--gates is the "
                   "default and still accepted; --no-gates skips them).")
@click.option("--drop-caches", is_flag=True, help="sync and drop the page cache on every rank before starting it.")
@click.option("--memory-guard", type=terminal.FiniteFloat(0, 1 << 20), is_flag=False, flag_value=8.0, default=None,
              metavar="[=GIB]", help="While ranks boot, drop caches and compact memory on a rank whose MemFree "
                                 "falls under GIB (8 when no value is given).")
@click.option("--health-interval", type=terminal.FiniteFloat(0, 3600), default=10.0, show_default=True,
              envvar="HEALTH_INTERVAL", help="Seconds between /health polls (env HEALTH_INTERVAL).")
@click.option("--health-attempts", type=click.IntRange(min=1, max=1_000_000), default=360, show_default=True,
              envvar="HEALTH_ATTEMPTS", help="How many /health polls before giving up (env HEALTH_ATTEMPTS).")
@click.option("--worker-delay", type=terminal.FiniteFloat(0, 3600), default=20.0, show_default=True,
              envvar="WORKER_DELAY", help="Seconds between the workers and the head (env WORKER_DELAY).")
@one_line_errors
def launch(target, recipe, image, dry_run, as_json, probe, profile, host_root, ssh_config, force, gates, drop_caches,
           memory_guard, health_interval, health_attempts, worker_delay) -> None:
    """Launch rank N, all ranks, or `stop` / `status` them, from a recipe."""
    from sparkstack.deploy import load_deployment
    from sparkstack.launch import apply as launch_apply
    from sparkstack.launch import report
    from sparkstack.launch.plan import plan_launch

    plan = plan_launch(load_deployment(recipe, os.environ, image), os.environ, profile)
    runners = launch_apply.runners_for(plan, ssh_config)
    say = functools.partial(click.echo, err=as_json)  # with --json, progress goes to stderr
    if target == "stop":
        if dry_run:
            cmds = launch_apply.stop_commands(plan, runners)
            _emit(as_json, lambda: {"would_run": [{"rank": r, "on": on, "argv": argv} for r, on, argv in cmds]},
                  lambda: report.stop_lines(cmds))
            return
        events: list[str] = []
        failures = launch_apply.stop(plan, runners, events.append if as_json else say)
        if as_json:
            _print_json({"stopped": events, "failures": failures})
        if failures:
            _fail("; ".join(failures))
        return
    if target == "status":  # read-only: --dry-run changes nothing
        from sparkstack.up import read_record
        from sparkstack.up.report import record_lines

        rows, last_run = launch_apply.status(plan, runners)
        last_up = read_record()
        _emit(as_json, lambda: {"ranks": rows, "last_run": last_run, "last_up": last_up},
              lambda: [*report.status_lines(rows, last_run), *record_lines(last_up)])
        return
    selected, checks = launch_apply.preflight(plan, target, host_root, runners, probe, force, gates, os.environ, dry_run)
    if dry_run:
        _emit(as_json, lambda: report.dry_run_document(plan, target, selected, checks, drop_caches),
              lambda: report.dry_run_lines(plan, selected, checks, drop_caches))
        return
    for c in checks:
        say(c.line())
    timeouts = launch_apply.Timeouts(health_interval_s=health_interval, health_attempts=health_attempts,
                                     worker_delay_s=worker_delay)
    try:
        run = launch_apply.start(plan, runners, selected, checks, timeouts, os.environ, say, drop_caches, memory_guard,
                                 host_root, gates=gates)
    except launch_apply.LaunchFailed as exc:
        for rank, text in sorted(exc.logs.items()):
            click.echo(f"--- rank {rank} log (last lines) ---", err=True)
            click.echo(text.rstrip(), err=True)
        raise
    _emit(as_json, lambda: {"record": str(run.record), "boot": None if run.boot is None else run.boot.to_json(),
                            "memory_guard": None if run.guard is None else run.guard.fired},
          lambda: report.started_lines(run))


@main.command()
@click.argument("target", default="all", metavar="[RANK|all]")
@click.option("--recipe", default=None, help="Recipe name or path: its ranks, and its clock_cap (default 0,2000).")
@click.option("--host-root", type=click.Path(path_type=Path), default=Path("/"), show_default=True,
              help="Read and write host files (/proc, /etc/sysctl.d, /run) below this root, on every rank.")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh client config for the workers.")
@click.option("--dry-run", is_flag=True, help="Only read each rank's facts and say what differs.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def tune(target, recipe, host_root, ssh_config, dry_run, as_json) -> None:
    """Tune every rank's host: swappiness 0 (now and at boot), GPU persistence mode and clock cap, page cache."""
    from sparkstack.deploy import load_deployment
    from sparkstack.tune.apply import apply_tune
    from sparkstack.tune.plan import plan_lines, plan_tune

    plan, runners = plan_tune(load_deployment(recipe, os.environ), target, host_root, ssh_config)
    if dry_run:
        _emit(as_json, plan.to_json, lambda: plan_lines(plan))
        return
    say = functools.partial(click.echo, err=as_json)
    try:
        done, problems = apply_tune(plan, runners, say)
    except KeyboardInterrupt:  # tune's outputs are not all files: say what holds
        click.echo(f"sparkstack: interrupted{_by()}: the steps printed as done are done; the one under way may be "
                   "half done (a file it writes is renamed into place only when whole); run tune again for the rest",
                   err=True)
        sys.exit(interrupt.exit_code())
    if as_json:  # also on failure: the steps that were done are part of the answer
        _print_json({**plan.to_json(), "done": done, "problems": problems})
    if problems:
        _fail("; ".join(problems))


@main.group("plan")
def plan_group() -> None:
    """Plans that need no machine."""


@plan_group.command("kv")
@click.option("--recipe", default=None)
@click.option("--kv-bytes", type=click.IntRange(min=0), default=None, help="KV pool bytes (default: the recipe's KV pin).")
@click.option("--dry-run", is_flag=True, help="Accepted for uniformity: plan kv only ever plans.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def plan_kv_cmd(recipe, kv_bytes, dry_run, as_json) -> None:
    """Tokens a KV pin buys, its coverage of max-model-len, and whether KV pages unify."""
    from sparkstack.deploy import load_deployment
    from sparkstack.launch.kv import plan_launch_kv
    from sparkstack.launch.plan import plan_launch

    kv = plan_launch_kv(plan_launch(load_deployment(recipe, os.environ), os.environ), kv_bytes)
    _emit(as_json, kv.to_json, kv.lines)


# ---------------------------------------------------------------- ship


@main.command()
@click.argument("hosts", nargs=-1)
@click.option("--recipe", default=None, help="Recipe name or path (its worker nodes, model, drafter, image, HF_HOME).")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh client config.")
@click.option("--image", "image_arg", default=None,
              help="A built OCI layout, or a config digest in the head's sparkstack store. Default: the image launch would run.")
@click.option("--no-image", is_flag=True, help="Ship no image.")
@click.option("--model", "models", multiple=True, metavar="CACHE_NAME",
              help="A cache entry to ship (repeatable). Default: the recipe's model and drafter.")
@click.option("--no-weights", is_flag=True, help="Ship no cache entries.")
@click.option("--streams", type=click.IntRange(1, 64), default=None,
              help="ssh streams per host, one blob each at a time (default: the core count, at most 8).")
@click.option("--via", type=click.Choice(["fabric", "mgmt"]), default=None,
              help="Connect on the fabric address (same host key) or the management one. Default: fabric where known.")
@click.option("--platform", default=None, help="Platform to ship when the image holds several.")
@click.option("--dry-run", is_flag=True, help="Ask each host (read-only) what it holds and print what would go.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def ship(hosts, recipe, ssh_config, image_arg, no_image, models, no_weights, streams, via, platform, dry_run,
         as_json) -> None:
    """Send each host only the image and weight blobs it lacks, verified on arrival; then load and link there."""
    from sparkstack.deploy import load_deployment
    from sparkstack.ship import apply_ship_recorded, plan_deployment_ship
    from sparkstack.ship.report import plan_lines, result_lines

    if no_image and image_arg:
        raise UsageError("--image and --no-image contradict each other")
    if no_weights and models:
        raise UsageError("--model and --no-weights contradict each other")
    plan = plan_deployment_ship(load_deployment(recipe, os.environ), tuple(hosts), via, ssh_config, image_arg, no_image,
                                tuple(models), no_weights, streams, platform, readonly=dry_run)
    if dry_run:
        _emit(as_json, plan.to_json, lambda: plan_lines(plan))
        failed = [h for h in plan.hosts if h.error]
        if failed:
            _fail("; ".join(f"{h.target.host}: {h.error}" for h in failed))
        return
    with terminal.multi_progress({h.target.host: h.bytes_to_send for h in plan.hosts if not h.error}) as advance:
        result, note = apply_ship_recorded(plan, on_progress=advance)
    if as_json:
        _print_json(result.to_json())
    else:
        for line in result_lines(plan, result):
            click.echo(line)
        if note:
            click.echo(f"head: image {plan.image.config_digest[:19]} {note}")
    if result.failed:
        _fail("; ".join(f"{h.host}: {h.error}" for h in result.failed))


# ---------------------------------------------------------------- verify


_api_key_env_opt = click.option("--api-key-env", default="VLLM_API_KEY", show_default=True, metavar="VAR",
                                help="Environment variable holding the API key; a key never goes on the command line.")


def _api_key(name: str) -> str | None:
    from sparkstack.endpoint.client import api_key_from

    return api_key_from(name, os.environ)


@main.command("verify")
@click.argument("url")
@click.option("--model", default=None, help="Model to ask (default: the first one /v1/models lists).")
@_api_key_env_opt
@click.option("--timeout", type=terminal.FiniteFloat(0.1, 86400), default=300.0, show_default=True,
              help="Seconds for the whole run; each request waits at most what is left of it.")
@click.option("--temperature", type=terminal.FiniteFloat(0, 2), default=1.0, show_default=True,
              help="The serving temperature, for the sampling check (the model's own default: 1.0).")
@click.option("--dry-run", is_flag=True, help="Print the checks it would run; send no request.")
@click.option("--json", "as_json", is_flag=True, help='Print {"checks": [{"check", "status", "detail"}]}.')
@one_line_errors
def verify_cmd(url, model, api_key_env, timeout, temperature, dry_run, as_json) -> None:
    """Prove a served endpoint works: /health, chat, streamed usage, a tool call, the reasoning split and spec
    decode (required); an image part, a U+FFFD probe and the prefix cache (warn only). Exit 1 if a required
    check fails."""
    from sparkstack.verify import plan_verify, run_verify, verdict

    plan = plan_verify(url, model, api_key_env, os.environ, timeout, temperature)
    if dry_run:
        _print_json(plan.to_json()) if as_json else click.echo("\n".join(plan.lines()))
        return
    from sparkstack.launch.apply import latest_record

    results = run_verify(plan, _api_key(plan.api_key_env),
                         on_result=None if as_json else lambda r: click.echo(r.line()), record=latest_record())
    if as_json:
        _print_json({"checks": [r.to_json() for r in results]})
    failed = verdict(results)
    if failed:
        _fail(failed)


# ---------------------------------------------------------------- soak / top


def _category_names(given: tuple[str, ...]) -> tuple[str, ...]:
    """--category values, each possibly a comma-separated list (code,json), as one tuple of names."""
    return tuple(n.strip() for c in given for n in c.split(",") if n.strip())


@main.command()
@click.argument("url")
@click.option("--duration", type=terminal.Duration(), required=True, help="How long to soak: 90s, 30m, 2h, 1h30m (at most 7 days).")
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True, help="Concurrent streams.")
@click.option("--category", "categories", multiple=True,
              help="Suite category (repeatable or comma-separated; default: all of them, in turn).")
@click.option("--window", type=terminal.Duration(), default="60s", show_default=True, help="Length of one logged window.")
@click.option("--log", "log_path", type=click.Path(path_type=Path), default=None,
              help="The JSONL log, created new (default: ./soak-<UTC time>.jsonl).")
@click.option("--max-requests", type=click.IntRange(min=1), default=None,
              help="Hard cap on requests sent (default: 2 per second per stream over the duration).")
@click.option("--health-interval", type=terminal.FiniteFloat(0.05, 600), default=5.0, show_default=True,
              help="Seconds between /health and /metrics reads.")
@click.option("--dead-after", type=terminal.Duration(), default="5m", show_default=True,
              help="End the soak when /health stays down this long.")
@click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--temperature", type=terminal.FiniteFloat(0, 2), default=1.0, show_default=True)
@click.option("--top-p", type=terminal.FiniteFloat(0, 1), default=0.95, show_default=True)
@click.option("--model", default=None, help="Model name to request (default: the first of /v1/models).")
@click.option("--timeout", type=terminal.FiniteFloat(1, 86400), default=300.0, show_default=True,
              help="Seconds one request may go without data.")
@click.option("--recipe", default=None, help="With the URL on this host at the recipe's API port: also watch the "
                                             "head container's start time (launch status, once per window).")
@_api_key_env_opt
@click.option("--dry-run", is_flag=True, help="Print the plan; send nothing, create no log.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan or the summary as JSON.")
@one_line_errors
def soak(url, duration, concurrency, categories, window, log_path, max_requests, health_interval, dead_after,
         max_tokens, temperature, top_p, model, timeout, recipe, api_key_env, dry_run, as_json) -> None:
    """Bounded load for hours: C streams of the prompt suite, a JSONL log, flaps and restarts counted."""
    import time

    from sparkstack.bench import suite as bench_suite
    from sparkstack.endpoint.client import base_url
    from sparkstack.soak import plan as soak_plan
    from sparkstack.soak import report as soak_report
    from sparkstack.soak import run as soak_run

    api_key = _api_key(api_key_env)
    suite = bench_suite.load()
    deployment = None
    if recipe is not None:
        from sparkstack.deploy import load_deployment

        deployment = load_deployment(recipe, os.environ)
    log_path = log_path or Path(time.strftime("soak-%Y%m%dT%H%M%SZ.jsonl", time.gmtime()))
    plan = soak_plan.plan_soak(
        base_url(url), duration_s=duration, concurrency=concurrency, categories=suite.check_categories(_category_names(categories)),
        window_s=window, max_requests=max_requests, log=log_path, health_interval_s=health_interval,
        dead_after_s=dead_after, max_tokens=max_tokens, temperature=temperature, top_p=top_p, model=model,
        request_timeout_s=timeout, deployment=deployment)
    if dry_run:
        _emit(as_json, lambda: {"plan": plan.to_json(), "sent": 0},
              lambda: [*plan.lines(), "dry run: nothing sent, no log created"])
        return
    if not as_json:
        for line in plan.lines():
            click.echo(line)
    outcome = soak_run.run(plan, suite, api_key,
                           on_window=lambda w: click.echo(soak_report.window_line(w), err=True))
    _emit(as_json, lambda: outcome.summary, lambda: soak_report.summary_lines(outcome.summary))
    if outcome.ended == "interrupted":
        click.echo(f"sparkstack: interrupted{_by()}: the summary so far is above; the log is kept at {plan.log}",
                   err=True)
        sys.exit(interrupt.exit_code())
    if outcome.message:
        _fail(outcome.message)


@main.command()
@click.argument("url")
@click.option("--interval", type=terminal.FiniteFloat(0.1, 3600), default=2.0, show_default=True,
              help="Seconds between /metrics reads.")
@click.option("--once", is_flag=True, help="Read twice, --interval apart (rates need two reads), show one sample, exit.")
@click.option("--recipe", default=None, help="Also show the KV pool in tokens that the recipe's KV pin buys.")
@_api_key_env_opt
@click.option("--dry-run", is_flag=True, help="Say what would be read; read nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON sample (--once), else one JSON line per read.")
@one_line_errors
def top(url, interval, once, recipe, api_key_env, dry_run, as_json) -> None:
    """A live view of an engine from /metrics: requests, tok/s, acceptance, KV and prefix cache, preemptions."""
    from sparkstack.deploy import load_deployment
    from sparkstack.endpoint.client import Endpoint, base_url
    from sparkstack.top import view, watch

    url = base_url(url)
    api_key = _api_key(api_key_env)
    pool, pool_note = watch.kv_pool(None if recipe is None else load_deployment(recipe, os.environ))
    reads = "two reads of /metrics, --interval apart" if once else "a read of /metrics every --interval"
    if dry_run:
        doc = {"url": url, "interval_s": interval, "once": once, "reads": reads, "kv_pool_tokens": pool, "sent": 0}
        _print_json(doc) if as_json else click.echo(f"would watch {url}/metrics: {reads} ({interval:g} s); "
                                                    "sends no request; dry run: read nothing")
        return
    ep = Endpoint(url, api_key, timeout=max(5.0, interval))

    def document(history, state):
        # a failed read has no figures: null, not the last read's
        return {"url": url, "state": state, "kv_pool_tokens": pool, **history.sample(fresh=state == "ok").to_json()}

    if once:
        history, state = watch.once(ep, interval)
        if as_json:
            _print_json({**document(history, state), "note": f"rates from two reads of /metrics {interval:g} s apart"})
        else:
            from rich.console import Console

            Console().print(view.screen(url, interval, history, state, pool, pool_note))
        return
    try:
        if as_json:
            for history, state in watch.follow(ep, interval):
                click.echo(json.dumps(document(history, state)))
            return
        from rich.live import Live

        with Live(auto_refresh=False, screen=False) as live:
            for history, state in watch.follow(ep, interval):
                live.update(view.screen(url, interval, history, state, pool, pool_note, live=True), refresh=True)
    except KeyboardInterrupt:
        if interrupt.received() != signal.SIGINT:  # Ctrl-C is how top is quit; SIGTERM or SIGHUP stopped it
            sys.exit(interrupt.exit_code())


# ---------------------------------------------------------------- bench / compare


@main.command()
@click.argument("url")
@click.option("--concurrency", type=terminal.IntList(), default=None, help="Concurrent streams per block  [default: 1,2,3,4,5,6]")
@click.option("--rounds", type=click.IntRange(1, 100), default=None, help="Rounds per block  [default: 3]")
@click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=None, help="max_tokens per request  [default: 512]")
@click.option("--temperature", type=terminal.FiniteFloat(0, 2), default=None, help="Sampling temperature  [default: 1.0]")
@click.option("--top-p", type=terminal.FiniteFloat(0, 1), default=None, help="Sampling top_p  [default: 0.95]")
@click.option("--category", "categories", multiple=True, metavar="NAME",
              help="A suite category to run (repeatable; default: all of code, json, prose, tool-args, count).")
@click.option("--model", default=None, help="Model to ask for (default: the first the server lists).")
@_api_key_env_opt
@click.option("--timeout", type=terminal.FiniteFloat(0.1, 3600), default=60.0, show_default=True,
              help="Seconds to wait for any answer or stream data.")
@click.option("--plot", type=click.Path(path_type=Path), default=None, metavar="PNG",
              help="Also draw tok/s and acceptance length against concurrency, and per-position acceptance.")
@click.option("--force", is_flag=True, help="Bench a server that is already running requests (cells flagged server_busy).")
@click.option("--dry-run", is_flag=True, help="Print the plan (blocks, requests, settings); send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (the contract compare reads).")
@one_line_errors
def bench(url, concurrency, rounds, max_tokens, temperature, top_p, categories, model, api_key_env, timeout, plot,
          force, dry_run, as_json) -> None:
    """Measure a served stack on the fixed prompt suite: one block per (concurrency, category); exit 1 on a fault."""
    from sparkstack.bench.plan import plan_bench
    from sparkstack.bench.plot import check_destination, write_plot
    from sparkstack.bench.report import plan_lines, table
    from sparkstack.bench.run import run_bench
    from sparkstack.endpoint.client import Endpoint, check_key_env
    from sparkstack.text import printable
    from sparkstack.verify import mask_key

    given = {"concurrency": concurrency, "rounds": rounds, "max_tokens": max_tokens, "temperature": temperature,
             "top_p": top_p}
    plan = plan_bench(url, categories=_category_names(categories), model=model, **{k: v for k, v in given.items() if v is not None})
    check_key_env(api_key_env)
    if plot is not None:
        check_destination(plot)
    if dry_run:
        _emit(as_json, plan.to_json, lambda: plan_lines(plan))
        return
    api_key = _api_key(api_key_env)
    endpoint = Endpoint(plan.settings.url, api_key, timeout, connections=max(plan.settings.concurrency))

    def said(text: str) -> str:  # server text on our lines: the key it may echo masked, controls escaped
        return printable(mask_key(text, api_key))

    try:
        with terminal.request_progress(plan.requests, enabled=not as_json) as on_progress:
            report = run_bench(plan, endpoint, force=force, on_progress=on_progress)
    except UsageError:
        raise
    except SparkstackError as exc:
        raise SparkstackError(said(str(exc))) from None
    for w in report.warnings:
        _warn(said(w))
    doc = report.to_json()
    notes = [n for c in report.cells for n in c.notes()]
    if as_json:
        _print_json(doc)
        for n in notes:
            _warn(n)
    else:
        terminal.print_rich(table(doc))
        for n in notes:
            click.echo(n)
    if plot is not None:  # after the figures are out: a failed plot must not lose the run
        write_plot(doc, plot)
    verdict = report.verdict()
    if verdict:
        _fail(said(verdict))


@main.command()
@click.argument("report_a", type=click.Path(path_type=Path))
@click.argument("report_b", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="Accepted for uniformity: compare only reads.")
@click.option("--json", "as_json", is_flag=True)
@one_line_errors
def compare(report_a, report_b, dry_run, as_json) -> None:
    """Per-cell change from bench report A to B, marking changes beyond the spread of each run's rounds."""
    from sparkstack.bench.compare import compare as compare_reports
    from sparkstack.bench.compare import table
    from sparkstack.bench.report import settings_line
    from sparkstack.text import printable

    cmp = compare_reports(report_a, report_b)
    if cmp.settings_differ:
        _warn(printable("settings differ: " + "; ".join(cmp.settings_differ)))
    if as_json:
        _print_json(cmp.to_json())
        return
    terminal.print_rich(table(cmp))
    click.echo(printable(f"A: {settings_line(cmp.a[1])}"))
    click.echo(printable(f"B: {settings_line(cmp.b[1])}"))


# ---------------------------------------------------------------- up


@main.command()
@click.option("--recipe", default=None, help="Recipe name or path (default: glm53-flash-dflash2-nvfp4).")
@click.option("--from", "start", default=None, metavar="STAGE", help="Apply from this stage on (earlier ones are "
              "still planned: a later stage may need their output).")
@click.option("--until", default=None, metavar="STAGE", help="Apply up to and including this stage.")
@click.option("--bench", "with_bench", is_flag=True, help="Also bench the served pair, last.")
@click.option("--yes", is_flag=True, help="Apply without asking (needed off a terminal).")
@click.option("--image", "image", type=click.Path(path_type=Path), default=None,
              help="A built image (OCI layout or archive): the build stage's output as given (`nix run .#up` passes "
                   "the flake's).")
@click.option("--base", type=click.Path(path_type=Path), default=None,
              help="The pinned base (OCI layout or archive) to build on, without Nix.")
@_overlay_opt
@_overlay_src_opt
@_pins_opt
@click.option("--out", type=click.Path(path_type=Path), default=Path("image"), show_default=True,
              help="Where the build stage writes the image.")
@_platform_opt
@click.option("--link-base", type=click.Choice(["hardlink", "symlink"]), default="hardlink", show_default=True,
              help="How the built image reuses base blobs (as `image build --link-base`).")
@click.option("--ssh-config", type=click.Path(path_type=Path), help="ssh client config for the workers.")
@click.option("--host-root", type=click.Path(path_type=Path), default=Path("/"), show_default=True,
              help="Host facts and tuning below this root, on every rank (as tune and launch take it).")
@click.option("--profile", type=click.Choice(["production", "lab"]), default="production", show_default=True,
              help="launch's profile: lab drops --gpus, --ulimit memlock and --device /dev/infiniband.")
@click.option("--via", type=click.Choice(["fabric", "mgmt"]), default=None, help="ship's connection (as ship --via).")
@click.option("--streams", type=click.IntRange(1, 64), default=None, help="ship's ssh streams per host.")
@click.option("--health-interval", type=terminal.FiniteFloat(0, 3600), default=10.0, show_default=True,
              help="launch: seconds between /health polls.")
@click.option("--health-attempts", type=click.IntRange(min=1, max=1_000_000), default=360, show_default=True,
              help="launch: /health polls before giving up.")
@click.option("--worker-delay", type=terminal.FiniteFloat(0, 3600), default=20.0, show_default=True,
              help="launch: seconds between the workers and the head.")
@click.option("--verify-timeout", type=terminal.FiniteFloat(0.1, 86400), default=300.0, show_default=True,
              help="verify: seconds for the whole run.")
@click.option("--temperature", type=terminal.FiniteFloat(0, 2), default=1.0, show_default=True,
              help="verify and bench: the serving temperature (the model's own default: 1.0).")
@_api_key_env_opt
@click.option("--bench-concurrency", type=terminal.IntList(), default="1,2,4", show_default=True)
@click.option("--bench-rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--bench-category", "bench_categories", multiple=True, metavar="NAME",
              help="A suite category for bench (repeatable; default: all).")
@click.option("--bench-out", type=click.Path(path_type=Path), default=Path("bench.json"), show_default=True,
              help="Where bench's report goes (its --json document).")
@click.option("--no-gates", is_flag=True, help="launch: skip the image's gates (its vLLM argv parser and import "
                                            "gates, run in throwaway containers before the boot).")
@click.option("--dry-run", is_flag=True, help="Print the plan of every stage; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and the run) as JSON.")
@one_line_errors
def up(recipe, start, until, with_bench, yes, image, base, overlay_dir, overlay_src, pins_file, out, platform,
       link_base, ssh_config, host_root, profile, via, streams, health_interval, health_attempts, worker_delay,
       verify_timeout, temperature, api_key_env, bench_concurrency, bench_rounds, bench_categories, bench_out, no_gates,
       dry_run, as_json) -> None:
    """The whole runbook, planned first: fetch, strip, build, ship, tune, launch, verify (and bench with --bench).
    A second run after a fix resumes: finished stages are up to date."""
    from sparkstack.endpoint.client import check_key_env
    from sparkstack.oci.pins import default_pins_path
    from sparkstack.up import StageFailed, UpInputs, UpInterrupted, apply_up, plan_up, read_record, stage_range
    from sparkstack.up.report import plan_lines, result_lines, stopped_lines

    if image is not None and base is not None:
        raise UsageError("--image and --base: give one (--image is a built image; --base is what the build stage "
                         "builds on)")
    if image is not None and not image.exists():
        raise UsageError(f"--image {image}: no such file or directory")
    try:
        pins = default_pins_path(pins_file)
    except SparkstackError:
        pins = None  # outside a checkout: the build stage says so (it needs no pins when --image is given)

    def absolute(path: Path | None) -> Path | None:  # the commands `up` prints must run from any directory
        return None if path is None else path.absolute()

    inp = UpInputs(recipe, absolute(image), absolute(base), absolute(_overlay_dir(overlay_dir)), absolute(overlay_src),
                   absolute(pins), pins_file is not None, absolute(out), platform, link_base, absolute(ssh_config),
                   absolute(host_root), profile, streams, via, health_interval, health_attempts, worker_delay,
                   verify_timeout, check_key_env(api_key_env), with_bench, bench_concurrency, bench_rounds,
                   _category_names(bench_categories), absolute(bench_out), stage_range(start, until, with_bench),
                   gates=not no_gates, temperature=temperature)
    plan = plan_up(inp, os.environ, read_record())
    if dry_run:
        _emit(as_json, lambda: {**plan.to_json(), "dry_run": True}, lambda: plan_lines(plan))
        return
    for line in plan_lines(plan):
        click.echo(line, err=as_json)
    if not plan.to_run and not plan.blocked:
        if as_json:
            _print_json({**plan.to_json(), "dry_run": False, "result": None})
        return
    if not yes and plan.to_run:  # nothing to run but a block: `up` only says so, and needs no consent for that
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise UsageError("not a terminal: pass --yes to apply the plan above (or --dry-run to only see it)")
        if not click.confirm("apply this plan?", err=True):
            click.echo("sparkstack: up: nothing applied", err=True)
            sys.exit(1)
    try:
        with terminal.stage_view([(s.name, s.state) for s in plan.stages]) as view:
            result = apply_up(plan, inp, os.environ, view)
    except UpInterrupted as exc:
        for line in stopped_lines(exc.result):
            click.echo(line, err=True)
        if as_json:
            _print_json({**plan.to_json(), "dry_run": False, "result": exc.result.to_json()})
        sys.exit(interrupt.exit_code())
    except StageFailed as exc:
        for line in stopped_lines(exc.result):
            click.echo(line, err=True)
        if as_json:
            _print_json({**plan.to_json(), "dry_run": False, "result": exc.result.to_json()})
        raise
    _emit(as_json, lambda: {**plan.to_json(), "dry_run": False, "result": result.to_json()},
          lambda: result_lines(result))


def entry() -> None:
    """The `sparkstack` program: click in non-standalone mode, so that usage errors are one line too."""
    sys.stdout = terminal.GuardedStdout(sys.stdout)
    interrupt.install()  # SIGTERM and SIGHUP take Ctrl-C's paths
    try:
        code = main.main(prog_name="sparkstack", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "sparkstack"
        click.echo(f"sparkstack: error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(2)
    except click.Abort:
        click.echo(f"sparkstack: interrupted{_by()}", err=True)
        sys.exit(interrupt.exit_code())
    except terminal.StdoutClosed:
        _quiet_closed_pipe()
    try:
        sys.stdout.flush()
    except terminal.StdoutClosed:
        _quiet_closed_pipe()
    sys.exit(code if isinstance(code, int) else 0)


def _quiet_closed_pipe() -> None:
    """The reader went away (`sparkstack ... | head`): stop quietly, as coreutils do, with no traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.__stdout__.fileno())  # so the interpreter's own flush at exit finds no broken pipe
    sys.exit(141)  # 128 + SIGPIPE


if __name__ == "__main__":
    entry()

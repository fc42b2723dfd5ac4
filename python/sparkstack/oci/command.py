"""`sparkstack image verify`, `image load`, `pin base` and `pin fetch`: the command objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkstack.command import Command, View, argument, option
from sparkstack.errors import SparkstackError
from sparkstack.units import human_bytes


def pins_option():
    return option(None, "--pins", kind="path",
                  help="Pins file (default: the checkout's nix/pins.json, found from the working directory up).")


# ---------------------------------------------------------------- image verify

@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    path: Path = argument(kind="path")
    platform: str | None = option(None, "--platform", help="Platform to verify when the image holds several.")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Read the image's documents and list what would be checked; hash no layer.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class VerifyPlan:
    request: VerifyRequest
    image: object  # oci.verify.VerifyPlan


def _plan_verify(request: VerifyRequest, environ: Mapping[str, str]) -> VerifyPlan:
    from sparkstack.oci.verify import plan_image_verify

    return VerifyPlan(request, plan_image_verify(request.path, request.platform))


def _apply_verify(p: VerifyPlan, view: View):
    from sparkstack.oci.verify import verify_image

    with view.progress("verifying layers", None) as advance:
        return verify_image(p.request.path, p.request.platform, on_progress=advance)


VERIFY = Command(
    ("image", "verify"), VerifyRequest, _plan_verify, _apply_verify,
    plan_lines=lambda p: [f"would verify {p.request.path}: config {p.image.image.config_digest}, "
                          f"{len(p.image.image.layers)} layers, {human_bytes(p.image.bytes_to_check)}"],
    plan_json=lambda p: p.image.to_json(),
    result_lines=lambda p, r: [f"ok: {p.request.path}: config {r.config_digest}, {r.layers} layers, "
                               f"{human_bytes(r.bytes_checked)} checked"
                               + ("; manifest.json agrees" if r.docker_manifest else "")],
    result_json=lambda p, r: r.to_json())


# ---------------------------------------------------------------- image load

@dataclass(frozen=True, kw_only=True)
class LoadRequest:
    path: Path = argument(kind="path")
    engine: str = option("docker", "--engine", kind=("choice", ("docker", "podman")), show_default=True)
    host: str | None = option(None, "--host", help="Load on this rank over ssh (the stream crosses ssh's stdin).")
    ssh_config: Path | None = option(None, "--ssh-config", kind="file", help="ssh client config for --host.")
    docker_host: str | None = option(None, "--docker-host",
                                     help="docker -H for the engine (e.g. unix:///path/docker.sock).")
    platform: str | None = option(None, "--platform", help="Platform to load when the image holds several.")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Say what would load; ask the engine only read-only questions.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class LoadPlan:
    request: LoadRequest
    load: object  # oci.load.LoadPlan
    runner: object


def _plan_load(request: LoadRequest, environ: Mapping[str, str]) -> LoadPlan:
    from sparkstack.oci.load import check_engine_options, plan_load
    from sparkstack.remote import Runner

    r = request
    check_engine_options(r.engine, r.docker_host)
    runner = Runner(ssh=r.host, ssh_config=r.ssh_config, docker_host=r.docker_host)
    return LoadPlan(r, plan_load(r.path, r.engine, runner, r.platform), runner)


def _apply_load(p: LoadPlan, view: View):
    from sparkstack.oci.load import apply_load

    with view.progress(f"loading into {p.request.engine}", p.load.bytes_to_send,
                       enabled=p.load.action == "load") as advance:
        return apply_load(p.load, p.runner, p.request.platform, on_progress=advance)


LOAD = Command(("image", "load"), LoadRequest, _plan_load, _apply_load, plan_lines=lambda p: p.load.lines(),
               plan_json=lambda p: p.load.to_json(), result_lines=lambda p, r: r.lines(p.load),
               result_json=lambda p, r: {"plan": p.load.to_json(), "result": r.to_json()})


# ---------------------------------------------------------------- pin base

@dataclass(frozen=True, kw_only=True)
class PinBaseRequest:
    reference: str | None = argument(None)
    platform: tuple[str, ...] = option((), "--platform", kind="many",
                                       help="Platform to pin (repeatable; default: the file's, else linux/arm64).")
    pins: Path | None = pins_option()
    check: bool = option(False, "--check", kind="flag", help="Re-resolve and exit 1 naming what moved; write nothing.")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Resolve and print what would be written; write nothing.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class PinBasePlan:
    request: PinBaseRequest
    path: Path
    pin: object  # oci.pins.PinBasePlan


def _plan_pin_base(request: PinBaseRequest, environ: Mapping[str, str]) -> PinBasePlan:
    from sparkstack.oci.pins import default_pins_path, plan_pin_base

    path = default_pins_path(request.pins)
    if request.check and not path.exists():
        raise SparkstackError(f"{path}: no pins file to check")
    return PinBasePlan(request, path, plan_pin_base(request.reference, request.platform, path))


def _apply_pin_base(p: PinBasePlan, view: View) -> bool:
    from sparkstack.oci.pins import apply_pin_base

    return False if p.request.check else apply_pin_base(p.pin)


def _pin_base_lines(p: PinBasePlan, written: bool) -> list[str]:
    if p.request.check:
        return [] if p.pin.changes else [f"up to date: {p.path} matches {p.pin.pins.reference} "
                                         f"({p.pin.pins.resolved.digest})"]
    return p.pin.lines(False)


def _pin_base_json(p: PinBasePlan, written: bool) -> dict:
    if p.request.check:
        return {**p.pin.to_json(), "check": True}
    return {**p.pin.to_json(), "dry_run": False, "written": written}


PIN_BASE = Command(
    ("pin", "base"), PinBaseRequest, _plan_pin_base, _apply_pin_base,
    plan_lines=lambda p: p.pin.lines(True), plan_json=lambda p: {**p.pin.to_json(), "dry_run": True, "written": False},
    result_lines=_pin_base_lines, result_json=_pin_base_json,
    failure=lambda p, r: (f"{p.pin.pins.reference} moved: " + "; ".join(p.pin.changes)
                          if p.request.check and p.pin.changes else None),
    dry=lambda r: r.dry_run and not r.check)  # --check only reads: it is never a dry run


# ---------------------------------------------------------------- pin fetch

@dataclass(frozen=True, kw_only=True)
class PinFetchRequest:
    digest: str = argument()
    pins: Path | None = pins_option()
    out: Path = option(None, "--out", kind="path", required=True, help="Where the verified object goes.")
    no_digest_check: bool = option(
        False, "--no-digest-check", kind="flag",
        help="Leave the sha256 comparison to the caller (sizes are still checked): for the flake's fixed-output "
             "derivations, where Nix checks the hash and names a wrong blob itself.")
    dry_run: bool = option(False, "--dry-run", kind="flag", help="Say what would be fetched from where; fetch nothing.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class PinFetchPlan:
    request: PinFetchRequest
    fetch: object  # oci.pins.FetchPlan


def _plan_pin_fetch(request: PinFetchRequest, environ: Mapping[str, str]) -> PinFetchPlan:
    from sparkstack.oci.pins import default_pins_path, plan_blob_fetch

    return PinFetchPlan(request, plan_blob_fetch(request.digest, default_pins_path(request.pins), request.out))


def _apply_pin_fetch(p: PinFetchPlan, view: View) -> bool:
    from sparkstack.oci.pins import apply_blob_fetch

    f = p.fetch
    with view.progress(f"fetching {f.what}", f.size, enabled=not f.up_to_date) as advance:
        return apply_blob_fetch(f, on_progress=advance, check_digest=not p.request.no_digest_check)


def _fetch_plan_line(p: PinFetchPlan) -> str:
    f = p.fetch
    size = human_bytes(f.size) if f.size is not None else "size unknown"
    return (("up to date: " if f.up_to_date else "would fetch ") +
            f"{f.what} {f.digest} ({size}) from {f.registry}/{f.repository} to {f.out}")


PIN_FETCH = Command(
    ("pin", "fetch"), PinFetchRequest, _plan_pin_fetch, _apply_pin_fetch,
    plan_lines=lambda p: [_fetch_plan_line(p)], plan_json=lambda p: p.fetch.to_json(),
    result_lines=lambda p, fetched: [("fetched " if fetched else "up to date: ") +
                                     f"{p.fetch.out} ({p.fetch.what} {p.fetch.digest})"],
    result_json=lambda p, fetched: {**p.fetch.to_json(), "fetched": fetched})


# ---------------------------------------------------------------- image pull

@dataclass(frozen=True, kw_only=True)
class PullRequest:
    out: Path = option(None, "--out", kind="path", required=True,
                       help="The OCI layout dir to assemble (absent, empty, or one an earlier pull left).")
    pins: Path | None = pins_option()
    platform: str = option("linux/arm64", "--platform", show_default=True, help="The pinned platform to pull.")
    dry_run: bool = option(False, "--dry-run", kind="flag",
                           help="Say what is missing, in bytes, from the pins and --out alone; fetch nothing.")
    as_json: bool = option(False, "--json", kind="flag")


@dataclass(frozen=True)
class PullPlan:
    request: PullRequest
    pull: object  # oci.pull.PullPlan


def _plan_pull(request: PullRequest, environ: Mapping[str, str]) -> PullPlan:
    from sparkstack.oci.pins import default_pins_path
    from sparkstack.oci.pull import plan_pull

    return PullPlan(request, plan_pull(default_pins_path(request.pins), request.platform, request.out))


def _apply_pull(p: PullPlan, view: View):
    from sparkstack.oci.pull import apply_pull

    f = p.pull
    if not f.up_to_date:
        view.say(f.lines()[0].replace("would pull", "pulling", 1))
    with view.progress(f"pulling {f.platform} base", f.missing_bytes, enabled=f.missing_bytes > 0) as advance:
        return apply_pull(f, on_progress=advance, on_wait=lambda dest, pid: view.note(
            f"waiting for another pull into {dest}" + (f" (pid {pid})" if pid else "")))


def _pull_result_lines(p: PullPlan, r) -> list[str]:
    f = p.pull
    if f.up_to_date:
        return f.lines()
    resumed = f", {len(r.resumed)} resumed" if r.resumed else ""
    return [f"pulled {f.out}: {f.reference} {f.platform}, manifest {f.manifest.digest}; "
            f"{human_bytes(r.bytes_fetched)} fetched ({len(r.fetched)} blobs{resumed}), every blob verified"]


PULL = Command(
    ("image", "pull"), PullRequest, _plan_pull, _apply_pull,
    plan_lines=lambda p: p.pull.lines(), plan_json=lambda p: {**p.pull.to_json(), "dry_run": True},
    result_lines=_pull_result_lines,
    result_json=lambda p, r: {**p.pull.to_json(), "dry_run": False, "result": r.to_json()},
    on_interrupt=" (verified blobs are kept, and a partial one under its .partial name: pull again to fetch the rest)")

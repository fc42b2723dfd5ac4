"""`sparkstack up`'s plan: every stage of the runbook, each planned by its own command's planner, as data.

A stage says one of three things: up to date (and what makes it so), what it will do (bytes where known), or
what blocks it (and the command that unblocks it). A stage whose input an earlier stage will produce is not
planned against today's disk: it says it will run after that stage, and is planned afresh when its turn comes
(up/apply.py). Reads are the stage commands' own dry runs: ship and tune ask the workers read-only, launch asks
each rank's docker what `launch status` asks.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.errors import SparkstackError, UsageError
from sparkstack.units import human_bytes

STAGES = ("fetch", "strip", "build", "ship", "tune", "launch", "verify", "bench")
# What each stage reads that an earlier stage writes.
NEEDS = {"strip": ("fetch",), "ship": ("strip", "build"), "launch": ("build", "ship"), "verify": ("launch",),
         "bench": ("launch",)}

UP_TO_DATE, WILL_RUN, BLOCKED, SKIPPED = "up to date", "will run", "blocked", "skipped"


@dataclass(frozen=True)
class UpInputs:
    """Everything `up` was given: the recipe and the options its stages' own commands take."""

    recipe: str | None
    image: Path | None  # a built image (the flake's, under `nix run .#up`): the build stage's output as given
    base: Path | None
    overlay_dir: Path
    overlay_src: Path | None
    pins: Path | None  # None: no checkout found upward and no --pins
    pins_given: bool  # --pins was passed: the pin command that unblocks names it too
    out: Path
    platform: str
    link_base: str
    ssh_config: Path | None
    host_root: Path
    profile: str
    streams: int | None
    via: str | None
    health_interval_s: float
    health_attempts: int
    worker_delay_s: float
    verify_timeout_s: float
    api_key_env: str
    bench: bool
    bench_concurrency: tuple[int, ...]
    bench_rounds: int
    bench_categories: tuple[str, ...]
    bench_out: Path
    stages: tuple[str, ...]  # the ones --from/--until leave in
    gates: bool = True  # launch runs the image's gates before the boot (`up --no-gates` skips them)
    temperature: float = 1.0  # the serving temperature verify's sampling check and bench's requests use

    @property
    def built_image(self) -> Path:
        return self.image if self.image is not None else self.out


@dataclass(frozen=True)
class Stage:
    name: str
    state: str  # UP_TO_DATE, WILL_RUN, BLOCKED or SKIPPED
    detail: str  # one line: what makes it up to date, what it will do, or what blocks it
    rerun: tuple[str, ...]  # the single command that runs this stage alone, as argv
    unblock: tuple[str, ...] | None = None  # BLOCKED: the command that unblocks it
    bytes: int | None = None  # what it will download, write or send
    after: tuple[str, ...] = ()  # earlier stages it waits for
    outputs: Mapping[str, object] = field(default_factory=dict)  # digests, revisions, run ids known now
    plan: Mapping[str, object] | None = None  # its own command's plan document (that command's --dry-run --json)
    work: object = field(default=None, compare=False, repr=False)  # the area's plan object, for apply

    def to_json(self) -> dict:
        return {"stage": self.name, "state": self.state, "detail": self.detail, "bytes": self.bytes,
                "after": list(self.after), "rerun": shlex.join(self.rerun),
                "unblock": shlex.join(self.unblock) if self.unblock else None, "outputs": dict(self.outputs),
                "plan": self.plan}


@dataclass(frozen=True)
class UpPlan:
    recipe: str
    stages: tuple[Stage, ...]
    last_run: Mapping[str, object] | None  # the previous up's record, as it was read
    licence: Mapping[str, object] | None = None  # the drafter's, as the recipe records it: shown before anything runs

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def blocked(self) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.state == BLOCKED)

    @property
    def to_run(self) -> tuple[Stage, ...]:
        return tuple(s for s in self.stages if s.state == WILL_RUN)

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "stages": [s.to_json() for s in self.stages],
                "up_to_date": all(s.state in (UP_TO_DATE, SKIPPED) for s in self.stages),
                "last_run": self.last_run, "licence": None if self.licence is None else dict(self.licence)}


def stage_range(start: str | None, until: str | None, bench: bool) -> tuple[str, ...]:
    names = [s for s in STAGES if bench or s != "bench"]
    for flag, value in (("--from", start), ("--until", until)):
        if value is not None and value not in names:
            why = " (bench is a stage only with --bench)" if value == "bench" else ""
            raise UsageError(f"{flag} {value}: expected one of {', '.join(names)}{why}")
    lo = names.index(start) if start else 0
    hi = names.index(until) if until else len(names) - 1
    if lo > hi:
        raise UsageError(f"--from {start} comes after --until {until}")
    return tuple(names[lo:hi + 1])


# ---------------------------------------------------------------- the single commands, as argv


def _recipe_args(inp: UpInputs) -> list[str]:
    return ["--recipe", inp.recipe] if inp.recipe is not None else []


def _ssh_args(inp: UpInputs) -> list[str]:
    return ["--ssh-config", str(inp.ssh_config)] if inp.ssh_config is not None else []


def _root_args(inp: UpInputs) -> list[str]:
    return ["--host-root", str(inp.host_root)] if inp.host_root != Path("/") else []


def command(inp: UpInputs, name: str, api_url: str = "http://127.0.0.1:8888") -> tuple[str, ...]:
    """The single command that runs stage `name` alone, with the options `up` was given."""
    if name == "fetch":
        argv = ["fetch", *_recipe_args(inp)]
    elif name == "build":
        argv = ["image", "build", "--base", str(inp.base or "BASE"), "--overlay", str(inp.overlay_dir),
                *(["--overlay-src", str(inp.overlay_src)] if inp.overlay_src else []), "--platform", inp.platform,
                "--link-base", inp.link_base, "--out", str(inp.out)]
    elif name == "ship":
        argv = ["ship", *_recipe_args(inp), "--image", str(inp.built_image), *_ssh_args(inp),
                *(["--via", inp.via] if inp.via else []), *(["--streams", str(inp.streams)] if inp.streams else [])]
    elif name == "tune":
        argv = ["tune", "all", *_recipe_args(inp), *_root_args(inp), *_ssh_args(inp)]
    elif name == "launch":
        argv = ["launch", "all", *_recipe_args(inp), "--image", str(inp.built_image), "--profile", inp.profile,
                *_root_args(inp), *_ssh_args(inp), "--health-interval", f"{inp.health_interval_s:g}",
                "--health-attempts", str(inp.health_attempts), "--worker-delay", f"{inp.worker_delay_s:g}",
                *([] if inp.gates else ["--no-gates"])]
    elif name == "verify":
        argv = ["verify", api_url, "--api-key-env", inp.api_key_env, "--timeout", f"{inp.verify_timeout_s:g}",
                "--temperature", f"{inp.temperature:g}"]
    else:
        argv = ["bench", api_url, "--api-key-env", inp.api_key_env,
                "--concurrency", ",".join(map(str, inp.bench_concurrency)), "--rounds", str(inp.bench_rounds),
                *[a for c in inp.bench_categories for a in ("--category", c)], "--temperature", f"{inp.temperature:g}"]
    return ("sparkstack", *argv)


# ---------------------------------------------------------------- one planner per stage

Planner = Callable[[UpInputs, Mapping[str, str], Mapping[str, Stage]], Stage]


def _waits(name: str, earlier: Mapping[str, Stage]) -> tuple[tuple[str, ...], Stage | None]:
    """The earlier stages `name` waits for (they will run), and the first of them that is blocked or left out."""
    waits, stuck = [], None
    todo = list(NEEDS.get(name, ()))
    seen = set()
    while todo:
        dep = todo.pop(0)
        if dep in seen or dep not in earlier:
            continue
        seen.add(dep)
        s = earlier[dep]
        if s.state == WILL_RUN:
            waits.append(dep)
        elif s.state in (BLOCKED, SKIPPED) and stuck is None:
            stuck = s
        todo += NEEDS.get(dep, ())
    return tuple(w for w in STAGES if w in waits), stuck


def _held_back(name: str, rerun: tuple[str, ...], earlier: Mapping[str, Stage]) -> Stage | None:
    """A stage that cannot be planned yet: it waits for a blocked (or left out) stage, or for one that will run."""
    waits, stuck = _waits(name, earlier)
    if stuck is not None:
        why = "is blocked" if stuck.state == BLOCKED else "is left out by --from/--until and not up to date"
        return Stage(name, BLOCKED, f"needs {stuck.name}, which {why}", rerun,
                     unblock=stuck.unblock or stuck.rerun, after=(stuck.name,))
    if waits:
        return Stage(name, WILL_RUN, f"after {', '.join(waits)}: planned then, against what {waits[-1]} leaves",
                     rerun, after=waits)
    return None


def _deployment(inp: UpInputs, environ: Mapping[str, str], with_image: bool = False):
    from sparkstack.deploy import load_deployment

    return load_deployment(inp.recipe, environ, str(inp.built_image) if with_image else None)


def plan_fetch_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.fetch import plan_fetch
    from sparkstack.fetch.plan import wanted

    rerun = command(inp, "fetch")
    deployment = _deployment(inp, environ)
    try:
        plan = plan_fetch(deployment, environ)
    except SparkstackError as exc:
        unpinned = any(w.revision is None for w in wanted(deployment.recipe))
        unblock = ("sparkstack", "fetch", "--resolve", *_recipe_args(inp)) if unpinned else rerun + ("--dry-run",)
        return Stage("fetch", BLOCKED, str(exc), rerun, unblock=unblock)
    revisions = {e.wanted.repo: e.revision for e in plan.entries}
    doc = {**plan.to_json(), "dry_run": True}
    if all(e.up_to_date for e in plan.entries):
        return Stage("fetch", UP_TO_DATE, "; ".join(f"{e.wanted.repo} @ {e.revision[:12]}" for e in plan.entries),
                     rerun, bytes=0, outputs={"revisions": revisions}, plan=doc, work=plan)
    todo = [e for e in plan.entries if not e.up_to_date]
    return Stage("fetch", WILL_RUN, f"download {sum(len(e.to_download) for e in todo)} files "
                 f"({human_bytes(plan.bytes_to_download)}) of {', '.join(f'{e.wanted.repo} @ {e.revision[:12]}' for e in todo)}",
                 rerun, bytes=plan.bytes_to_download, outputs={"revisions": revisions}, plan=doc, work=plan)


def strip_entries(inp: UpInputs, environ: Mapping[str, str]) -> tuple[Path, Path, str | None]:
    """The entry fetch writes (the recipe's model), the one launch serves, and the commit to strip."""
    from sparkstack.hfcache import entry_name

    deployment = _deployment(inp, environ)
    hub = deployment.local_hub
    return (hub / entry_name(deployment.recipe.model), hub / deployment.knobs["MODEL_CACHE_NAME"],
            deployment.recipe.model_pin)


def plan_strip_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.hfcache import no_mtp_destination, resolve_source, snapshot_dir
    from sparkstack.strip import plan_strip

    source_entry, served, revision = strip_entries(inp, environ)
    src = snapshot_dir(source_entry, revision) if revision else source_entry
    rerun = ("sparkstack", "strip", str(src))
    if served == source_entry:
        return Stage("strip", UP_TO_DATE, f"the recipe serves {served.name} as fetched: nothing to strip", rerun)
    held = _held_back("strip", rerun, earlier)
    if held is not None:
        return held
    try:
        source = resolve_source(src)
        if no_mtp_destination(source) != served:
            rerun = (*rerun, "--out", str(served))
        plan = plan_strip(source, served)
    except SparkstackError as exc:
        return Stage("strip", BLOCKED, str(exc), rerun, unblock=command(inp, "fetch"))
    outputs = {"entry": served.name, "revision": plan.dest.revision, "fingerprint": plan.fingerprint}
    if plan.up_to_date:
        return Stage("strip", UP_TO_DATE, f"{served.name} @ {(plan.dest.revision or '')[:12]}: stripped from these "
                     "shards already", rerun, bytes=0, outputs=outputs, plan=plan.to_json(), work=plan)
    rewrite = sum(1 for s in plan.shards if s.action == "rewrite")
    return Stage("strip", WILL_RUN, f"{len(plan.mtp_keys)} MTP tensors out of {rewrite} shards into {served.name} "
                 f"(writes {human_bytes(plan.bytes_to_write)}, frees {human_bytes(plan.bytes_freed)})", rerun,
                 bytes=plan.bytes_to_write, outputs=outputs, plan=plan.to_json(), work=plan)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _pin_base_argv(inp: UpInputs, reference: str) -> tuple[str, ...]:
    return ("sparkstack", "pin", "base", reference, "--platform", inp.platform,
            *(["--pins", str(inp.pins)] if inp.pins_given else []))


def _build_unblock(inp: UpInputs, rerun: tuple[str, ...]) -> tuple[str, ...]:
    """What unblocks a build its own planner refused: pinning the overlay when it is unpinned, else its dry run."""
    from sparkstack.patch.overlay import load_overlay

    try:
        unpinned = bool(load_overlay(inp.overlay_dir).unpinned)
    except SparkstackError:
        unpinned = False
    if unpinned:
        return ("sparkstack", "pin", "overlay", "--overlay", str(inp.overlay_dir), "--overlay-src",
                str(inp.overlay_src or "DIR"))
    return (*rerun, "--dry-run")


def plan_build_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.image import plan_build
    from sparkstack.image.plan import complete_output
    from sparkstack.oci.pins import read_pins

    rerun = command(inp, "build")
    if inp.image is not None:
        given = complete_output(inp.image)
        if given is None:
            return Stage("build", BLOCKED, f"--image {inp.image}: not a complete OCI layout or image archive", rerun,
                         unblock=("nix", "build", ".#image"))
        return Stage("build", UP_TO_DATE, f"the image given: {inp.image}, config {given.config_digest[:19]}", rerun,
                     outputs={"config": given.config_digest, "manifest": given.manifest_digest, "image": str(inp.image)})
    if inp.pins is None:
        return Stage("build", BLOCKED, "no nix/pins.json found from here upward: run up in the checkout, or pass "
                     "--pins FILE (or --image, an image built already)", rerun,
                     unblock=("sparkstack", "pin", "base", "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8",
                              "--platform", inp.platform, "--pins", "FILE"))
    try:
        pins = read_pins(inp.pins)
    except SparkstackError as exc:
        return Stage("build", BLOCKED, str(exc), rerun,
                     unblock=_pin_base_argv(inp, "ghcr.io/tonyd2wild/vllm-glm53-flash:sm121-v8"))
    pinned = dict(pins.platforms).get(inp.platform)
    if pinned is None:
        return Stage("build", BLOCKED, f"the base is not pinned for {inp.platform} in {inp.pins} (pinned: "
                     f"{', '.join(dict(pins.platforms)) or 'none'})", rerun, unblock=_pin_base_argv(inp, pins.reference))
    if inp.base is None:
        return Stage("build", BLOCKED, f"no base image here: pass --base DIR (an OCI layout or archive of the pinned "
                     f"manifest {pinned.manifest.digest[:19]}), or run `nix run .#up`, which builds it from the pins",
                     rerun, unblock=("nix", "run", ".#up", "--", *_recipe_args(inp)))
    try:
        plan = plan_build(inp.base, inp.overlay_dir, inp.overlay_src, inp.out, "plain", inp.platform, (), False, None,
                          inp.link_base)
    except SparkstackError as exc:
        return Stage("build", BLOCKED, str(exc), rerun, unblock=_build_unblock(inp, rerun))
    if plan.base_manifest_digest != pinned.manifest.digest:
        return Stage("build", BLOCKED, f"--base {inp.base} is manifest {plan.base_manifest_digest[:19]}, but "
                     f"{inp.pins} pins {pinned.manifest.digest[:19]} for {inp.platform}", rerun,
                     unblock=_pin_base_argv(inp, pins.reference))
    doc = plan.to_json()
    if plan.up_to_date:
        return Stage("build", UP_TO_DATE, f"{inp.out}: config {plan.existing.config_digest[:19]}, built from these "
                     "inputs", rerun, outputs={"config": plan.existing.config_digest,
                                               "manifest": plan.existing.manifest_digest, "image": str(inp.out)},
                     plan=doc, work=plan)
    return Stage("build", WILL_RUN, f"one layer ({_count(len(plan.overlay.installs), 'install')}, "
                 f"{_count(len(plan.steps), 'patch step')}) onto base {plan.base_manifest_digest[:19]}, into {inp.out}", rerun,
                 outputs={"base": plan.base_manifest_digest}, plan=doc, work=plan)


def plan_ship_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.ship import plan_deployment_ship

    rerun = command(inp, "ship")
    deployment = _deployment(inp, environ)
    if len(deployment.ranks) == 1:
        return Stage("ship", UP_TO_DATE, "one rank, this machine: nothing to ship", rerun)
    held = _held_back("ship", rerun, earlier)
    if held is not None:
        return held
    try:
        plan = plan_deployment_ship(deployment, (), inp.via, inp.ssh_config, str(inp.built_image), False, (), False,
                                    inp.streams, None, readonly=True)
    except SparkstackError as exc:
        return Stage("ship", BLOCKED, str(exc), rerun, unblock=(*rerun, "--dry-run"))
    failed = [h for h in plan.hosts if h.error]
    if failed:
        return Stage("ship", BLOCKED, "; ".join(f"{h.target.host}: {h.error}" for h in failed), rerun,
                     unblock=(*rerun, "--dry-run"), plan=plan.to_json(), work=plan)
    outputs = {"image": plan.image.config_digest if plan.image else None, "hosts": [h.target.host for h in plan.hosts]}
    if all(h.up_to_date for h in plan.hosts):
        held_entries = len(plan.entries)
        return Stage("ship", UP_TO_DATE, f"{', '.join(h.target.host for h in plan.hosts)}: hold the image and "
                     f"{held_entries} entries, verified", rerun, bytes=0, outputs=outputs, plan=plan.to_json(), work=plan)
    sends = [f"{h.target.host} {human_bytes(h.bytes_to_send, 'GiB')} in {len(h.send)} blobs" for h in plan.hosts
             if not h.up_to_date]
    total = sum(h.bytes_to_send for h in plan.hosts)
    return Stage("ship", WILL_RUN, "send " + ", ".join(sends) + " (then load and link there)", rerun, bytes=total,
                 outputs=outputs, plan=plan.to_json(), work=plan)


def plan_tune_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.tune.plan import plan_tune

    rerun = command(inp, "tune")
    try:
        plan, runners = plan_tune(_deployment(inp, environ), "all", inp.host_root, inp.ssh_config)
    except SparkstackError as exc:
        return Stage("tune", BLOCKED, str(exc), rerun, unblock=(*rerun, "--dry-run"))
    doc = plan.to_json()
    problems = [f"rank {r.rank}: {p}" for r in plan.ranks for p in r.problems]
    if problems:
        return Stage("tune", BLOCKED, "; ".join(problems), rerun, unblock=(*rerun, "--dry-run"), plan=doc,
                     work=(plan, runners))
    if plan.up_to_date:
        return Stage("tune", UP_TO_DATE, f"ranks {', '.join(str(r.rank) for r in plan.ranks)}: nothing differs", rerun,
                     plan=doc, work=(plan, runners))
    return Stage("tune", WILL_RUN, _tune_detail(plan), rerun, plan=doc, work=(plan, runners))


def _tune_detail(plan) -> str:
    """Per rank, the steps that differ (tune --dry-run shows each one's now -> want) and what it leaves alone."""
    parts = [f"rank {r.rank}: {', '.join(s.name for s in r.steps)}" for r in plan.ranks if r.steps]
    parts += [f"rank {r.rank}: {n}" for r in plan.ranks for n in r.notes]
    return "; ".join(parts) or "nothing to change"


def without_page_cache(stage: Stage) -> Stage:
    """Tune while the pair already serves: a page-cache drop matters only before a launch, so it is left out."""
    if stage.state != WILL_RUN or stage.work is None:
        return stage
    plan, runners = stage.work
    ranks = tuple(dataclasses.replace(r, steps=tuple(s for s in r.steps if s.name != "page-cache")) for r in plan.ranks)
    plan = dataclasses.replace(plan, ranks=ranks)
    if plan.up_to_date:
        return dataclasses.replace(stage, state=UP_TO_DATE, detail="only a page-cache drop differs, and the pair is "
                                   "already serving: left alone", plan=plan.to_json(), work=(plan, runners))
    return dataclasses.replace(stage, detail=_tune_detail(plan), plan=plan.to_json(), work=(plan, runners))


@dataclass(frozen=True)
class Serving:
    """What the ranks run now, against what the plan would start."""

    run_id: str  # the run the plan would start
    image_id: str | None
    rows: tuple[Mapping[str, object], ...]  # launch status's rows
    last_run: Mapping[str, object] | None  # launch's latest run record

    @property
    def current(self) -> bool:
        """Every rank running the plan's image, under the plan's very run, and the head healthy."""
        return (bool(self.rows) and all(r["state"] == "running" and r["image_id"] == self.image_id for r in self.rows)
                and self.rows[0]["health"] == 200 and self.last_run is not None
                and self.last_run.get("id") == self.run_id)

    @property
    def head_started_at(self) -> object:
        return self.rows[0]["started_at"] if self.rows else None

    @property
    def present(self) -> tuple[int, ...]:
        return tuple(int(r["rank"]) for r in self.rows if r["state"] != "absent")


def launch_plan(inp: UpInputs, environ: Mapping[str, str]):
    from sparkstack.launch import apply as launch_apply
    from sparkstack.launch.plan import plan_launch

    plan = plan_launch(_deployment(inp, environ, with_image=True), environ, inp.profile)
    return plan, launch_apply.runners_for(plan, inp.ssh_config)


def serving(plan, runners) -> Serving:
    from sparkstack.launch import apply as launch_apply

    rows, last_run = launch_apply.status(plan, runners)
    image_id = plan.image_config_digest
    return Serving(launch_apply.run_id(plan, image_id or "unknown"), image_id, tuple(rows), last_run)


def plan_launch_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage]) -> Stage:
    from sparkstack.launch import apply as launch_apply
    from sparkstack.launch import report

    rerun = command(inp, "launch")
    held = _held_back("launch", rerun, earlier)
    if held is not None:
        return held
    try:
        plan, runners = launch_plan(inp, environ)
        now = serving(plan, runners)
    except SparkstackError as exc:
        return Stage("launch", BLOCKED, str(exc), rerun, unblock=(*rerun, "--dry-run"))
    ranks = ", ".join(str(r.rank) for r in plan.ranks)
    outputs = {"run": now.run_id, "image": now.image_id, "model_revision": plan.model_revision,
               "drafter_revision": plan.drafter_revision, "head_started_at": now.head_started_at}
    if now.current:
        return Stage("launch", UP_TO_DATE, f"run {now.run_id}: ranks {ranks} serve {(now.image_id or '')[:19]}, "
                     "/health 200", rerun, outputs=outputs, work=(plan, runners, now))
    if now.present:
        return Stage("launch", WILL_RUN, f"replace what runs on ranks {', '.join(map(str, now.present))} (not run "
                     f"{now.run_id} of this plan): stop, then start ranks {ranks}", rerun, outputs=outputs,
                     work=(plan, runners, now))
    try:
        selected, checks = launch_apply.preflight(plan, "all", inp.host_root, runners, True, False, False,
                                                  dict(environ), dry_run=True)
    except SparkstackError as exc:
        return Stage("launch", BLOCKED, str(exc), rerun, unblock=(*rerun, "--dry-run"))
    doc = report.dry_run_document(plan, "all", selected, checks, False)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        return Stage("launch", BLOCKED, "preflight: " + "; ".join(f"{c.name} (rank {c.rank}): {c.detail}" if c.rank
                                                                   is not None else f"{c.name}: {c.detail}"
                                                                   for c in failed),
                     rerun, unblock=(*rerun, "--dry-run", "--probe"), outputs=outputs, plan=doc)
    return Stage("launch", WILL_RUN, f"start ranks {ranks} (workers first), watch the boot to /health", rerun,
                 outputs=outputs, plan=doc, work=(plan, runners, now))


def api_url(inp: UpInputs, environ: Mapping[str, str]) -> str:
    return f"http://127.0.0.1:{_deployment(inp, environ).api_port}"


def _checked_for(name: str, earlier: Mapping[str, Stage], last_run: Mapping[str, object] | None) -> dict | None:
    """The previous up's record of stage `name`, if it passed against the very launch that serves now."""
    launch = earlier.get("launch")
    if launch is None or launch.state != UP_TO_DATE or not last_run:
        return None
    done = next((s for s in last_run.get("stages", []) if s.get("stage") == name), None)
    if not done or done.get("outcome") not in ("done", "up to date"):
        return None
    out = done.get("outputs") or {}
    ok = (out.get("run") == launch.outputs.get("run") and out.get("head_started_at") is not None
          and out.get("head_started_at") == launch.outputs.get("head_started_at"))
    return dict(out) if ok else None


def plan_verify_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage],
                      last_run: Mapping[str, object] | None = None) -> Stage:
    from sparkstack.verify import plan_verify

    url = api_url(inp, environ)
    rerun = command(inp, "verify", url)
    plan = plan_verify(url, None, inp.api_key_env, environ, inp.verify_timeout_s, inp.temperature)
    held = _held_back("verify", rerun, earlier)
    if held is not None:
        return dataclasses.replace(held, plan=plan.to_json(), work=plan)
    seen = _checked_for("verify", earlier, last_run)
    if seen is not None and seen.get("temperature", 1.0) == inp.temperature:  # verify at 0 says nothing of 1
        return Stage("verify", UP_TO_DATE, f"passed against run {seen['run']} as it serves now ({seen.get('checks')} "
                     "checks)", rerun, outputs=seen, plan=plan.to_json(), work=plan)
    return Stage("verify", WILL_RUN, f"{len(plan.checks)} checks against {url}", rerun, plan=plan.to_json(), work=plan)


def plan_bench_stage(inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage],
                     last_run: Mapping[str, object] | None = None) -> Stage:
    from sparkstack.bench.plan import plan_bench

    url = api_url(inp, environ)
    rerun = command(inp, "bench", url)
    plan = plan_bench(url, concurrency=inp.bench_concurrency, rounds=inp.bench_rounds, categories=inp.bench_categories,
                     temperature=inp.temperature)
    held = _held_back("bench", rerun, earlier)
    if held is not None:
        return dataclasses.replace(held, plan=plan.to_json(), work=plan)
    seen = _checked_for("bench", earlier, last_run)
    if seen is not None and seen.get("settings") == plan.to_json().get("settings"):
        return Stage("bench", UP_TO_DATE, f"measured run {seen['run']} as it serves now: {seen.get('report')}", rerun,
                     outputs=seen, plan=plan.to_json(), work=plan)
    return Stage("bench", WILL_RUN, f"{plan.requests} requests at concurrency "
                 f"{','.join(map(str, inp.bench_concurrency))}, report to {inp.bench_out}", rerun,
                 plan=plan.to_json(), work=plan)


PLANNERS: dict[str, Callable] = {"fetch": plan_fetch_stage, "strip": plan_strip_stage, "build": plan_build_stage,
                                 "ship": plan_ship_stage, "tune": plan_tune_stage, "launch": plan_launch_stage,
                                 "verify": plan_verify_stage, "bench": plan_bench_stage}


def plan_stage(name: str, inp: UpInputs, environ: Mapping[str, str], earlier: Mapping[str, Stage],
               last_run: Mapping[str, object] | None) -> Stage:
    if name in ("verify", "bench"):
        return PLANNERS[name](inp, environ, earlier, last_run)
    return PLANNERS[name](inp, environ, earlier)


def plan_up(inp: UpInputs, environ: Mapping[str, str], last_run: Mapping[str, object] | None) -> UpPlan:
    """Every stage's plan, in order. A stage before --from is planned too (a stage in range may need its output)
    and shown as skipped when it has something to do; a stage after --until is not planned at all."""
    from sparkstack.recipe import load_recipe

    recipe = load_recipe(inp.recipe)
    if last_run and last_run.get("recipe") != recipe.name:
        last_run = None  # another recipe's run: nothing in it speaks for this one
    earlier: dict[str, Stage] = {}
    last = max(STAGES.index(n) for n in inp.stages)
    for name in STAGES:
        if name == "bench" and not inp.bench:
            continue
        if STAGES.index(name) > last:  # nothing in range needs it: not even probed
            earlier[name] = Stage(name, SKIPPED, f"after --until {STAGES[last]}: not planned", command(inp, name))
            continue
        stage = plan_stage(name, inp, environ, earlier, last_run)
        if name not in inp.stages and stage.state != UP_TO_DATE:
            stage = dataclasses.replace(stage, state=SKIPPED, detail=f"left out by --from/--until ({stage.state}: "
                                        f"{stage.detail})")
        earlier[name] = stage
    if "tune" in earlier and earlier.get("launch") is not None and earlier["launch"].state == UP_TO_DATE:
        earlier["tune"] = without_page_cache(earlier["tune"])
    from sparkstack.fetch.plan import licence_of

    return UpPlan(recipe.name, tuple(earlier.values()), last_run, licence_of(recipe))

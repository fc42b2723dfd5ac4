"""`sparkstack up`'s plan: every stage of the runbook, each planned by its own command object, as data.

A stage is a command object, the request `up` makes for it from its own, and what it waits for (`STAGES`). A
stage says one of three things: up to date (and what makes it so), what it will do (bytes where known), or what
blocks it (and the command line that unblocks it). A stage whose input an earlier stage will produce is not
planned against today's disk: it says it will run after that stage, and is planned afresh when its turn comes
(up/apply.py). What `up` adds to its commands is only its resume rules: a strip with nothing to strip, a ship to
one rank, an image given, a launch that serves already, a verify or bench of that very launch.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.bench import command as bench_cmd
from sparkstack.command import BLOCKED, UP_TO_DATE, WILL_RUN, Blocked, Command, Summary, request_from
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.fetch import command as fetch_cmd
from sparkstack.image import command as image_cmd
from sparkstack.launch import command as launch_cmd
from sparkstack.oci import command as oci_cmd
from sparkstack.patch import command as patch_cmd
from sparkstack.ship import command as ship_cmd
from sparkstack.strip import command as strip_cmd
from sparkstack.tune import command as tune_cmd
from sparkstack.verify import command as verify_cmd

SKIPPED = "skipped"


@dataclass(frozen=True)
class StageSpec:
    name: str
    command: Command
    needs: tuple[str, ...]  # what it reads that an earlier stage writes


STAGES_TABLE = (
    StageSpec("fetch", fetch_cmd.COMMAND, ()),
    StageSpec("strip", strip_cmd.COMMAND, ("fetch",)),
    StageSpec("build", image_cmd.COMMAND, ()),
    StageSpec("ship", ship_cmd.COMMAND, ("strip", "build")),
    StageSpec("tune", tune_cmd.COMMAND, ()),
    StageSpec("launch", launch_cmd.COMMAND, ("build", "ship")),
    StageSpec("verify", verify_cmd.COMMAND, ("launch",)),
    StageSpec("bench", bench_cmd.COMMAND, ("launch",)),
)
STAGES = tuple(s.name for s in STAGES_TABLE)
NEEDS = {s.name: s.needs for s in STAGES_TABLE}
SPECS = {s.name: s for s in STAGES_TABLE}


@dataclass(frozen=True)
class Stage:
    name: str
    state: str  # UP_TO_DATE, WILL_RUN, BLOCKED or SKIPPED
    detail: str  # one line: what makes it up to date, what it will do, or what blocks it
    rerun: str  # the single command that runs this stage alone
    unblock: str | None = None  # BLOCKED: the command line that unblocks it
    bytes: int | None = None  # what it will download, write or send
    after: tuple[str, ...] = ()  # earlier stages it waits for
    outputs: Mapping[str, object] = field(default_factory=dict)  # digests, revisions, run ids known now
    plan: Mapping[str, object] | None = None  # its own command's plan document (that command's --dry-run --json)
    work: object = field(default=None, compare=False, repr=False)  # the command's plan, for apply

    def to_json(self) -> dict:
        return {"stage": self.name, "state": self.state, "detail": self.detail, "bytes": self.bytes,
                "after": list(self.after), "rerun": self.rerun, "unblock": self.unblock,
                "outputs": dict(self.outputs), "plan": self.plan}


@dataclass(frozen=True)
class UpPlan:
    recipe: str
    stages: tuple[Stage, ...]
    last_run: Mapping[str, object] | None  # the previous up's record, as it was read
    licence: Mapping[str, object] | None = None  # the drafter's, as the recipe records it: shown before anything runs
    request: object = field(default=None, compare=False, repr=False)  # up's own request
    environ: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

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


# ---------------------------------------------------------------- what every stage plans against

class Ground:
    """What the stages plan against, read once: the deployment (and with the built image), the pins file. Made
    anew after a stage acts (its output may change them)."""

    def __init__(self, request, environ: Mapping[str, str]) -> None:
        self.request, self.environ = request, environ

    @functools.cached_property
    def deployment(self):
        from sparkstack.deploy import load_deployment

        return load_deployment(self.request.recipe, self.environ)

    @functools.cached_property
    def deployment_with_image(self):
        from sparkstack.deploy import load_deployment

        return load_deployment(self.request.recipe, self.environ, str(self.request.built_image))

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.deployment.api_port}"


# ---------------------------------------------------------------- each stage's request, from up's

def stage_request(name: str, r, ground: Ground):
    """The request `up` makes of stage `name`'s command: a dry run (up plans read-only; apply acts on the plan)."""
    if name == "fetch":
        return fetch_cmd.Request(recipe=r.recipe, dry_run=True)
    if name == "build":
        return image_cmd.Request(base=r.base or Path("BASE"), overlay=r.overlay, overlay_src=r.overlay_src,
                                 out=r.out, platform=r.platform, link_base=r.link_base, dry_run=True)
    if name == "ship":
        return ship_cmd.Request(recipe=r.recipe, image=str(r.built_image), ssh_config=r.ssh_config, via=r.via,
                                streams=r.streams, dry_run=True)
    if name == "tune":
        return tune_cmd.Request(target="all", recipe=r.recipe, host_root=r.host_root, ssh_config=r.ssh_config,
                                dry_run=True)
    if name == "launch":
        return request_from(launch_cmd.Request, r, target="all", recipe=r.recipe, image=str(r.built_image),
                            host_root=r.host_root, ssh_config=r.ssh_config, probe=True, dry_run=True)
    if name == "verify":
        return verify_cmd.Request(url=ground.api_url, api_key_env=r.api_key_env, timeout=r.verify_timeout,
                                  temperature=r.temperature, dry_run=True)
    if name == "bench":
        return request_from(bench_cmd.Request, r, url=ground.api_url, api_key_env=r.api_key_env, out=r.bench_out,
                            dry_run=True)
    raise AssertionError(name)


def rerun_line(command: Command, request) -> str:
    """The command line a person runs to do this stage alone: the request, as a real run (no probe, no dry run)."""
    fields = {f.name for f in dataclasses.fields(request)}
    real = dataclasses.replace(request, **{k: v for k, v in (("dry_run", False), ("probe", False)) if k in fields})
    return shlex.join(command.argv(real))


# ---------------------------------------------------------------- up's own rules, before a stage's command plans

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


def _held_back(name: str, rerun: str, earlier: Mapping[str, Stage]) -> Stage | None:
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


def _strip_source(r, ground: Ground) -> Stage | Path:
    """The snapshot fetch writes (the recipe's model), or the stage itself when the recipe serves it unstripped."""
    from sparkstack.hfcache import entry_name, snapshot_dir

    d = ground.deployment
    fetched, served = d.local_hub / entry_name(d.recipe.model), d.local_hub / d.knobs["MODEL_CACHE_NAME"]
    if served == fetched:
        return Stage("strip", UP_TO_DATE, f"the recipe serves {served.name} as fetched: nothing to strip",
                     shlex.join(("sparkstack", "strip", str(fetched))))
    return snapshot_dir(fetched, d.recipe.model_pin) if d.recipe.model_pin else fetched


def _pin_base_line(r, reference: str) -> str:
    return rerun_line(oci_cmd.PIN_BASE, oci_cmd.PinBaseRequest(reference=reference, platform=(r.platform,),
                                                               pins=r.pins if r.pins_given else None))


def _build_rule(r) -> Stage | None:
    """The build stage's inputs: an image given, the pins, and a base that is the pinned one."""
    from sparkstack.image.plan import complete_output
    from sparkstack.oci.pins import BLOG_BASE, read_pins

    rerun = rerun_line(image_cmd.COMMAND, stage_request("build", r, None))
    if r.image is not None:
        given = complete_output(r.image)
        if given is None:
            return Stage("build", BLOCKED, f"--image {r.image}: not a complete OCI layout or image archive", rerun,
                         unblock="nix build .#image")
        return Stage("build", UP_TO_DATE, f"the image given: {r.image}, config {given.config_digest[:19]}", rerun,
                     outputs={"config": given.config_digest, "manifest": given.manifest_digest, "image": str(r.image)})
    if r.pins_path is None:
        return Stage("build", BLOCKED, "no nix/pins.json found from here upward: run up in the checkout, or pass "
                     "--pins FILE (or --image, an image built already)", rerun,
                     unblock=shlex.join(("sparkstack", "pin", "base", BLOG_BASE, "--platform", r.platform,
                                         "--pins", "FILE")))
    try:
        pins = read_pins(r.pins_path)
    except SparkstackError as exc:
        return Stage("build", BLOCKED, str(exc), rerun, unblock=_pin_base_line(r, BLOG_BASE))
    pinned = dict(pins.platforms).get(r.platform)
    if pinned is None:
        return Stage("build", BLOCKED, f"the base is not pinned for {r.platform} in {r.pins_path} (pinned: "
                     f"{', '.join(dict(pins.platforms)) or 'none'})", rerun, unblock=_pin_base_line(r, pins.reference))
    if r.base is None:
        # Without Nix, the pinned base comes from `image pull`; `nix run .#up` builds it from the same pins itself.
        pull = rerun_line(oci_cmd.PULL, oci_cmd.PullRequest(out=Path("base"), pins=r.pins_path, platform=r.platform))
        return Stage("build", BLOCKED, f"no base image here: pass --base DIR (an OCI layout or archive of the pinned "
                     f"manifest {pinned.manifest.digest[:19]}; `{pull}` assembles one, then pass --base base), or run "
                     "`nix run .#up`, which builds it from the pins", rerun, unblock=pull)
    return None


def _build_unblock(r, rerun: str) -> str:
    """What unblocks a build its own planner refused: pinning the overlay when it is unpinned, else its dry run."""
    from sparkstack.patch.overlay import load_overlay

    where = patch_cmd.overlay_dir(r.overlay)
    try:
        unpinned = bool(load_overlay(where).unpinned)
    except SparkstackError:
        unpinned = False
    if unpinned:
        return rerun_line(patch_cmd.PIN, patch_cmd.PinRequest(overlay=where, overlay_src=r.overlay_src or Path("DIR")))
    return f"{rerun} --dry-run"


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


# ---------------------------------------------------------------- one stage

def _stage(name: str, summary: Summary, rerun: str, plan, doc) -> Stage:
    return Stage(name, summary.state, summary.detail, rerun, summary.unblock, summary.bytes, (),
                 summary.outputs, doc, plan)


def _launch_stage(plan, rerun: str) -> Stage:
    """Up to date when the plan's very run serves; else replace what runs, or start, or the preflight's block."""
    now = launch_cmd.serving(plan)
    lp = plan.launch
    ranks = ", ".join(str(r.rank) for r in lp.ranks)
    outputs = {"run": now.run_id, "image": now.image_id, "model_revision": lp.model_revision,
               "drafter_revision": lp.drafter_revision, "head_started_at": now.head_started_at}
    work = (plan, now)
    if now.current:
        return Stage("launch", UP_TO_DATE, f"run {now.run_id}: ranks {ranks} serve {(now.image_id or '')[:19]}, "
                     "/health 200", rerun, outputs=outputs, work=work)
    if now.present:
        return Stage("launch", WILL_RUN, f"replace what runs on ranks {', '.join(map(str, now.present))} (not run "
                     f"{now.run_id} of this plan): stop, then start ranks {ranks}", rerun, outputs=outputs, work=work)
    doc = launch_cmd.COMMAND.plan_json(plan)
    failed = [c for c in plan.checks if c.status == "fail"]
    if failed:
        return Stage("launch", BLOCKED, "preflight: " + "; ".join(
            f"{c.name} (rank {c.rank}): {c.detail}" if c.rank is not None else f"{c.name}: {c.detail}"
            for c in failed), rerun, unblock=f"{rerun} --dry-run --probe", outputs=outputs, plan=doc)
    return Stage("launch", WILL_RUN, f"start ranks {ranks} (workers first), watch the boot to /health", rerun,
                 outputs=outputs, plan=doc, work=work)


def plan_stage(name: str, r, environ: Mapping[str, str], earlier: Mapping[str, Stage],
               last_run: Mapping[str, object] | None, ground: Ground) -> Stage:
    """Stage `name`: up's rule for it first, then its command's own plan and summary."""
    spec = SPECS[name]
    rerun = ""  # until the stage's request is made
    try:
        if name == "build":
            ruled = _build_rule(r)
            if ruled is not None:
                return ruled
        if name == "strip":
            source = _strip_source(r, ground)
            if isinstance(source, Stage):
                return source
            request = strip_cmd.Request(src=source, out=ground.deployment.local_hub /
                                        ground.deployment.knobs["MODEL_CACHE_NAME"], dry_run=True)
        else:
            request = stage_request(name, r, ground)
        rerun = rerun_line(spec.command, request)
        if name in ("ship", "tune"):  # both reach the workers: not while one is still the recipe's placeholder
            waiting = tune_cmd.placeholder_ranks(ground.deployment)
            if waiting:
                raise Blocked(f"{', '.join(waiting)}: the ssh target is the placeholder {tune_cmd.PLACEHOLDER_SSH}",
                              tune_cmd.unblock_placeholder(ground.deployment))
        if name == "ship" and len(ground.deployment.ranks) == 1:
            return Stage("ship", UP_TO_DATE, "one rank, this machine: nothing to ship", rerun)
        held = _held_back(name, rerun, earlier)
        if held is not None and name not in ("verify", "bench"):
            return held
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock)
    try:
        plan = spec.command.plan(request, environ, **_ground_args(name, ground))
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock or f"{rerun} --dry-run")
    except SparkstackError as exc:
        unblock = {"strip": _fetch_rerun(r), "build": _build_unblock(r, rerun)}.get(name, f"{rerun} --dry-run")
        return Stage(name, BLOCKED, str(exc), rerun, unblock=unblock)
    doc = spec.command.plan_json(plan)
    if name == "launch":
        return _launch_stage(plan, rerun)
    if name in ("verify", "bench"):
        if held is not None:
            return dataclasses.replace(held, plan=doc, work=plan)
        return _checked_stage(name, plan, rerun, doc, earlier, last_run)
    try:
        summary = spec.command.summary(plan)
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock or f"{rerun} --dry-run", plan=doc,
                     work=plan)
    return _stage(name, summary, rerun, plan, doc)


def _rerun_of(name: str, r, ground: Ground) -> str:
    """The command line of a stage `up` does not plan (after --until), as far as it can be known unplanned."""
    try:
        return rerun_line(SPECS[name].command, stage_request(name, r, ground))
    except (SparkstackError, AssertionError):
        return ""


def _fetch_rerun(r) -> str:
    return rerun_line(fetch_cmd.COMMAND, fetch_cmd.Request(recipe=r.recipe))


def _ground_args(name: str, ground: Ground) -> dict:
    if name in ("fetch", "ship", "tune"):
        return {"deployment": ground.deployment}
    if name == "launch":
        return {"deployment": ground.deployment_with_image}
    return {}


def _checked_stage(name: str, plan, rerun: str, doc, earlier, last_run) -> Stage:
    """verify and bench: up to date when the previous up ran them, with these settings, on the launch serving now."""
    seen = _checked_for(name, earlier, last_run)
    if name == "verify":
        if seen is not None and seen.get("temperature", 1.0) == plan.verify.temperature:  # at 0 says nothing of 1
            return Stage(name, UP_TO_DATE, f"passed against run {seen['run']} as it serves now "
                         f"({seen.get('checks')} checks)", rerun, outputs=seen, plan=doc, work=plan)
        return Stage(name, WILL_RUN, f"{len(plan.verify.checks)} checks against {plan.verify.url}", rerun, plan=doc,
                     work=plan)
    if seen is not None and seen.get("settings") == doc.get("settings"):
        return Stage(name, UP_TO_DATE, f"measured run {seen['run']} as it serves now: {seen.get('report')}", rerun,
                     outputs=seen, plan=doc, work=plan)
    settings = plan.bench.settings
    return Stage(name, WILL_RUN, f"{plan.bench.requests} requests at concurrency "
                 f"{','.join(map(str, settings.concurrency))}, report to {plan.request.out}", rerun, plan=doc,
                 work=plan)


def without_page_cache(stage: Stage) -> Stage:
    """Tune while the pair already serves: a page-cache drop matters only before a launch, so it is left out."""
    if stage.state != WILL_RUN or stage.work is None:
        return stage
    plan = tune_cmd.without_page_cache(stage.work)
    doc = tune_cmd.COMMAND.plan_json(plan)
    summary = tune_cmd.COMMAND.summary(plan)
    if summary.state == UP_TO_DATE:
        return dataclasses.replace(stage, state=UP_TO_DATE, detail="only a page-cache drop differs, and the pair is "
                                   "already serving: left alone", plan=doc, work=plan)
    return dataclasses.replace(stage, detail=summary.detail, plan=doc, work=plan)


def plan_up(r, environ: Mapping[str, str], last_run: Mapping[str, object] | None) -> UpPlan:
    """Every stage's plan, in order. A stage before --from is planned too (a stage in range may need its output)
    and shown as skipped when it has something to do; a stage after --until is not planned at all."""
    from sparkstack.fetch.plan import licence_of

    ground = Ground(r, environ)
    recipe = ground.deployment.recipe
    if last_run and last_run.get("recipe") != recipe.name:
        last_run = None  # another recipe's run: nothing in it speaks for this one
    earlier: dict[str, Stage] = {}
    in_range = r.stages
    last = max(STAGES.index(n) for n in in_range)
    for name in STAGES:
        if name == "bench" and not r.bench:
            continue
        if STAGES.index(name) > last:  # nothing in range needs it: not even probed
            earlier[name] = Stage(name, SKIPPED, f"after --until {STAGES[last]}: not planned",
                                  _rerun_of(name, r, ground))
            continue
        stage = plan_stage(name, r, environ, earlier, last_run, ground)
        if name not in in_range and stage.state != UP_TO_DATE:
            stage = dataclasses.replace(stage, state=SKIPPED, detail=f"left out by --from/--until ({stage.state}: "
                                        f"{stage.detail})")
        earlier[name] = stage
    if "tune" in earlier and earlier.get("launch") is not None and earlier["launch"].state == UP_TO_DATE:
        earlier["tune"] = without_page_cache(earlier["tune"])
    return UpPlan(recipe.name, tuple(earlier.values()), last_run, licence_of(recipe), r, dict(environ))


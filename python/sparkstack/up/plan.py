"""`sparkstack up`'s plan: every stage of the runbook, each planned by its own command object, as data.

A stage is a row of `STAGES_TABLE`: its command object, the request `up` makes for it from its own, what it waits
for, and its behaviour in up (its resume rule, what "up to date" means for it, how it runs); the plan and apply
loops read the row and never branch on a stage's name. A
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
from collections.abc import Callable, Mapping
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


def serving_already(stages: Mapping[str, Stage]) -> bool:
    """The launch stage (the one judged by what serves) is up to date: the pair serves the plan's very run."""
    return any(SPECS[n].serves and s.state == UP_TO_DATE for n, s in stages.items())


def stage_range(start: str | None, until: str | None, bench: bool) -> tuple[str, ...]:
    names = [s.name for s in STAGES_TABLE if bench or not s.opt_in]
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
    return SPECS[name].request(r, ground)


def _fetch_request(r, ground: Ground):
    return fetch_cmd.Request(recipe=r.recipe, dry_run=True)


def _strip_request(r, ground: Ground):
    """strip of the snapshot fetch writes (the recipe's model), into the entry the recipe serves."""
    from sparkstack.hfcache import entry_name, snapshot_dir

    d = ground.deployment
    fetched = d.local_hub / entry_name(d.recipe.model)
    source = snapshot_dir(fetched, d.recipe.model_pin) if d.recipe.model_pin else fetched
    return strip_cmd.Request(src=source, out=d.local_hub / d.knobs["MODEL_CACHE_NAME"], dry_run=True)


def _build_request(r, ground: Ground):
    return image_cmd.Request(base=r.base or Path("BASE"), overlay=r.overlay, overlay_src=r.overlay_src, out=r.out,
                             platform=r.platform, link_base=r.link_base, dry_run=True)


def _ship_request(r, ground: Ground):
    return ship_cmd.Request(recipe=r.recipe, image=str(r.built_image), ssh_config=r.ssh_config, via=r.via,
                            streams=r.streams, dry_run=True)


def _tune_request(r, ground: Ground):
    return tune_cmd.Request(target="all", recipe=r.recipe, host_root=r.host_root, ssh_config=r.ssh_config,
                            dry_run=True)


def _launch_request(r, ground: Ground):
    return request_from(launch_cmd.Request, r, target="all", recipe=r.recipe, image=str(r.built_image),
                        host_root=r.host_root, ssh_config=r.ssh_config, probe=True, dry_run=True)


def _verify_request(r, ground: Ground):
    return verify_cmd.Request(url=ground.api_url, api_key_env=r.api_key_env, timeout=r.verify_timeout,
                              temperature=r.temperature, dry_run=True)


def _bench_request(r, ground: Ground):
    return request_from(bench_cmd.Request, r, url=ground.api_url, api_key_env=r.api_key_env, out=r.bench_out,
                        dry_run=True)


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


def _strip_rule(r, ground: Ground, rerun: str) -> Stage | None:
    """Nothing to strip when the recipe serves the model as fetched."""
    from sparkstack.hfcache import entry_name

    d = ground.deployment
    fetched, served = d.local_hub / entry_name(d.recipe.model), d.local_hub / d.knobs["MODEL_CACHE_NAME"]
    if served == fetched:
        return Stage("strip", UP_TO_DATE, f"the recipe serves {served.name} as fetched: nothing to strip",
                     shlex.join(("sparkstack", "strip", str(fetched))))
    return None


def _ship_rule(r, ground: Ground, rerun: str) -> Stage | None:
    if len(ground.deployment.ranks) == 1:
        return Stage("ship", UP_TO_DATE, "one rank, this machine: nothing to ship", rerun)
    return None


def _pin_base_line(r, reference: str) -> str:
    return rerun_line(oci_cmd.PIN_BASE, oci_cmd.PinBaseRequest(reference=reference, platform=(r.platform,),
                                                               pins=r.pins if r.pins_given else None))


def _build_rule(r, ground: Ground, rerun: str) -> Stage | None:
    """The build stage's inputs: an image given, the pins, and a base that is the pinned one."""
    from sparkstack.image.plan import complete_output
    from sparkstack.oci.pins import BLOG_BASE, read_pins

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


def _strip_unblock(r, rerun: str) -> str:
    return _fetch_rerun(r)


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
    launch = next((s for n, s in earlier.items() if SPECS[n].serves), None)
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


def _summarised(name: str, plan, rerun: str, doc, earlier, last_run) -> Stage:
    """Most stages: up to date, to run or blocked as their command's own summary says."""
    try:
        summary = SPECS[name].command.summary(plan)
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock or f"{rerun} --dry-run", plan=doc,
                     work=plan)
    return _stage(name, summary, rerun, plan, doc)


def _launch_judged(name: str, plan, rerun: str, doc, earlier, last_run) -> Stage:
    return _launch_stage(plan, rerun)


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
    """Stage `name`: up's rule for it first, then its command's own plan, judged as the stage's table row says."""
    spec = SPECS[name]
    rerun = ""  # until the stage's request is made
    try:
        request = spec.request(r, ground)
        rerun = rerun_line(spec.command, request)
        if spec.reaches_workers:  # not while a worker is still the recipe's placeholder
            waiting = tune_cmd.placeholder_ranks(ground.deployment)
            if waiting:
                raise Blocked(f"{', '.join(waiting)}: the ssh target is the placeholder {tune_cmd.PLACEHOLDER_SSH}",
                              tune_cmd.unblock_placeholder(ground.deployment))
        ruled = spec.rule(r, ground, rerun)
        if ruled is not None:
            return ruled
        held = _held_back(name, rerun, earlier)
        if held is not None and not spec.plans_waiting:
            return held
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock)
    try:
        plan = spec.command.plan(request, environ, **spec.deployment(ground))
    except Blocked as exc:
        return Stage(name, BLOCKED, exc.detail, rerun, unblock=exc.unblock or f"{rerun} --dry-run")
    except SparkstackError as exc:
        return Stage(name, BLOCKED, str(exc), rerun, unblock=spec.unblock(r, rerun))
    doc = spec.command.plan_json(plan)
    if held is not None:
        return dataclasses.replace(held, plan=doc, work=plan)
    return spec.judge(name, plan, rerun, doc, earlier, last_run)


def _rerun_of(name: str, r, ground: Ground) -> str:
    """The command line of a stage `up` does not plan (after --until), as far as it can be known unplanned."""
    try:
        return rerun_line(SPECS[name].command, stage_request(name, r, ground))
    except SparkstackError:
        return ""


def _fetch_rerun(r) -> str:
    return rerun_line(fetch_cmd.COMMAND, fetch_cmd.Request(recipe=r.recipe))


def _verify_judged(name: str, plan, rerun: str, doc, earlier, last_run) -> Stage:
    """Up to date when the previous up passed it, at this temperature, on the launch serving now."""
    seen = _checked_for(name, earlier, last_run)
    if seen is not None and seen.get("temperature", 1.0) == plan.verify.temperature:  # at 0 says nothing of 1
        return Stage(name, UP_TO_DATE, f"passed against run {seen['run']} as it serves now "
                     f"({seen.get('checks')} checks)", rerun, outputs=seen, plan=doc, work=plan)
    return Stage(name, WILL_RUN, f"{len(plan.verify.checks)} checks against {plan.verify.url}", rerun, plan=doc,
                 work=plan)


def _bench_judged(name: str, plan, rerun: str, doc, earlier, last_run) -> Stage:
    """Up to date when the previous up benched, with these settings, the launch serving now."""
    seen = _checked_for(name, earlier, last_run)
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


# ---------------------------------------------------------------- what each stage does when it runs (apply_up)

def _applied(command: Command, stage: Stage, view, finished: Mapping[str, Stage]) -> dict:
    """Its command's apply on the stage's plan; its failure line raised; what its command records of the run."""
    result = command.apply(stage.work, view)
    failed = command.failure(stage.work, result)
    if failed:
        raise SparkstackError(failed)
    return {**stage.outputs, **command.outputs(stage.work, result)}


def _applied_to_launch(command: Command, stage: Stage, view, finished: Mapping[str, Stage]) -> dict:
    """verify and bench: recorded with the launch they ran against (a later up judges them against the launch that
    serves then)."""
    result = command.apply(stage.work, view)
    failed = command.failure(stage.work, result)
    if failed:
        raise SparkstackError(failed)
    launch = next((s for n, s in finished.items() if SPECS[n].serves), None)
    out = dict(launch.outputs) if launch is not None else {}
    return {"run": out.get("run"), "head_started_at": out.get("head_started_at"),
            **command.outputs(stage.work, result)}


def _relaunched(command: Command, stage: Stage, view, finished: Mapping[str, Stage]) -> dict:
    """Stop what runs (only when something does), then start the plan's ranks; the run that serves after."""
    plan, now = stage.work
    started = launch_cmd.relaunch(plan, view, stop_first=bool(now.present))
    after = launch_cmd.serving(plan)
    return {**stage.outputs, "run": after.run_id, "head_started_at": after.head_started_at,
            "record": str(started.record)}


def _deployment(ground: Ground) -> dict:
    return {"deployment": ground.deployment}


@dataclass(frozen=True)
class StageSpec:
    """One stage: its command, what it waits for, and its behaviour in `up` (`STAGES_TABLE`).
    The plan and apply loops call these; neither asks a stage its name."""

    name: str
    command: Command
    needs: tuple[str, ...]  # what it reads that an earlier stage writes
    request: Callable  # (up's request, ground) -> its command's request, a dry run
    deployment: Callable = lambda ground: {}  # (ground) -> what its command's plan takes of the ground
    rule: Callable = lambda r, ground, rerun: None  # up's own resume rule, before its command plans: a Stage or None
    reaches_workers: bool = False  # blocked while a worker is still the recipe's placeholder
    plans_waiting: bool = False  # planned even while it waits for an earlier stage (its plan is shown)
    unblock: Callable = lambda r, rerun: f"{rerun} --dry-run"  # (r, rerun) -> what unblocks a plan it refused
    judge: Callable = _summarised  # (name, plan, rerun, doc, earlier, last_run) -> Stage: what "up to date" means
    while_serving: Callable = lambda stage: stage  # the stage while the pair already serves (launch up to date)
    run: Callable = _applied  # (command, stage, view, finished) -> what the run record keeps (apply_up calls it)
    serves: bool = False  # up to date means the pair serves its plan (launch): verify and bench are judged by it
    opt_in: bool = False  # a stage only with --bench


STAGES_TABLE = (
    StageSpec("fetch", fetch_cmd.COMMAND, (), _fetch_request, deployment=_deployment),
    StageSpec("strip", strip_cmd.COMMAND, ("fetch",), _strip_request, rule=_strip_rule, unblock=_strip_unblock),
    StageSpec("build", image_cmd.COMMAND, (), _build_request, rule=_build_rule, unblock=_build_unblock),
    StageSpec("ship", ship_cmd.COMMAND, ("strip", "build"), _ship_request, deployment=_deployment,
              rule=_ship_rule, reaches_workers=True),
    StageSpec("tune", tune_cmd.COMMAND, (), _tune_request, deployment=_deployment, reaches_workers=True,
              while_serving=without_page_cache),
    StageSpec("launch", launch_cmd.COMMAND, ("build", "ship"), _launch_request,
              deployment=lambda ground: {"deployment": ground.deployment_with_image}, judge=_launch_judged,
              run=_relaunched, serves=True),
    StageSpec("verify", verify_cmd.COMMAND, ("launch",), _verify_request, plans_waiting=True, judge=_verify_judged,
              run=_applied_to_launch),
    StageSpec("bench", bench_cmd.COMMAND, ("launch",), _bench_request, plans_waiting=True, judge=_bench_judged,
              run=_applied_to_launch, opt_in=True),
)
STAGES = tuple(s.name for s in STAGES_TABLE)
NEEDS = {s.name: s.needs for s in STAGES_TABLE}
SPECS = {s.name: s for s in STAGES_TABLE}


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
        if SPECS[name].opt_in and not r.bench:
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
    if serving_already(earlier):
        earlier = {name: SPECS[name].while_serving(stage) for name, stage in earlier.items()}
    return UpPlan(recipe.name, tuple(earlier.values()), last_run, licence_of(recipe), r, dict(environ))


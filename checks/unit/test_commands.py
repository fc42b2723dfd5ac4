"""The command objects (issue 30): one declaration of each option, and `up` acting only through them.

Each test here is one drift the review found between a command and `up`'s second copy of it; each failed on the
tree that had the copies (46dad07)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from clirun import assert_planned, sparkstack_cmd

import synth
from sparkstack.command import StageRows, View, argv, declared
from sparkstack.up import plan as up_plan
from sparkstack.up.plan import UP_TO_DATE, WILL_RUN, Stage

ROOT = Path(__file__).resolve().parents[2]


def up_request(tmp_path: Path, **kw):
    from sparkstack.up.command import Request

    return Request(**{"out": tmp_path / "image", "stages": ("fetch", "strip", "build", "ship", "tune", "launch",
                                                            "verify"), **kw})


def test_ups_launch_options_take_launchs_environment_variables(tmp_path):
    """HEALTH_INTERVAL=... worked for `launch all` and not for `up` (two declarations, one without envvar)."""
    env = {**os.environ, "HOME": str(tmp_path), "SPARKSTACK_STATE_DIR": str(tmp_path / "state"),
           "HEALTH_INTERVAL": "3", "HEALTH_ATTEMPTS": "7", "WORKER_DELAY": "2.5"}
    proc = subprocess.run([*sparkstack_cmd(), "up", "--dry-run", "--json", "--image", str(tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert_planned(proc)
    launch = {s["stage"]: s for s in json.loads(proc.stdout)["stages"]}["launch"]
    words = shlex.split(launch["rerun"])
    assert words[:3] == ["sparkstack", "launch", "all"], words
    got = {flag: words[words.index(flag) + 1] for flag in ("--health-interval", "--health-attempts", "--worker-delay")}
    assert got == {"--health-interval": "3", "--health-attempts": "7", "--worker-delay": "2.5"}


def test_every_option_up_shares_with_a_stage_is_declared_once():
    """up's options that a stage command also takes have that command's flag, default and environment variable."""
    from sparkstack.launch.command import Request as Launch
    from sparkstack.up.command import Request as Up

    up = {f.name: (f, o) for f, o in declared(Up)}
    launch = {f.name: (f, o) for f, o in declared(Launch)}
    for name in ("health_interval", "health_attempts", "worker_delay", "profile", "host_root", "ssh_config"):
        (uf, uo), (lf, lo) = up[name], launch[name]
        assert (uo.flags, uo.env, uo.kind, uf.default) == (lo.flags, lo.env, lo.kind, lf.default), name


class Recording(View):
    """A view that keeps every bar's total and every advance, per stage row."""

    def __init__(self):
        super().__init__()
        self.totals: dict[str, int | None] = {}
        self.advanced: dict[str, int] = {}
        rec = self

        class Rows(StageRows):
            def started(self, stage, total):
                rec.totals[stage] = total
                rec.advanced.setdefault(stage, 0)
                return lambda n: rec.advanced.__setitem__(stage, rec.advanced[stage] + n)

            def resize(self, stage, total):
                rec.totals[stage] = total

        self.rows = Rows()

    def stages(self, rows):
        return contextlib.nullcontext(self.rows)


def test_ups_strip_bar_ends_full(tmp_path, monkeypatch):
    """up's strip row was sized by the bytes strip writes, but strip advances by the tensor bytes it copies: the
    bar never reached its end. The row's total is now strip's own."""
    from sparkstack.strip import command as strip_cmd
    from sparkstack.up import apply as up_apply

    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    hub = tmp_path / "hub"
    synth.write_model_dir(tmp_path / "flat")
    entry = synth.cache_from_dir(tmp_path / "flat", hub)
    request = strip_cmd.Request(src=entry, out=hub / "models--x--y-no-MTP", dry_run=True)
    work = strip_cmd.plan(request, {})
    summary = strip_cmd.summary(work)
    stage = Stage("strip", WILL_RUN, summary.detail, "sparkstack strip", bytes=summary.bytes, work=work)
    view = Recording()
    result = up_apply.apply_up(up_plan.UpPlan("r", (stage,), None, None, up_request(tmp_path, stages=("strip",)), {}),
                               view)
    assert result.stopped is None, result.failure
    assert view.advanced["strip"] > 0 and view.totals["strip"] == view.advanced["strip"]


def test_up_loads_the_deployment_once_per_plan(tmp_path, monkeypatch):
    """up reloaded the deployment about seven times per plan; now once, and once more with the built image."""
    import sparkstack.deploy as deploy

    calls = []
    real = deploy.load_deployment
    monkeypatch.setattr(deploy, "load_deployment", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    env = {"HOME": str(tmp_path), "HF_HOME": str(tmp_path / "hf"), "WORKER_SSH": "user@worker-node"}
    up_plan.plan_up(up_request(tmp_path, image=tmp_path, bench=True,
                               stages=up_plan.stage_range(None, None, True)), env, None)
    images = sorted(str(a[2]) if len(a) > 2 else "" for a in calls)
    assert len(calls) <= 2 and len(set(images)) == len(images), calls


def test_the_base_up_offers_to_pin_is_the_one_the_checkout_pins():
    """With no pins file to read, up suggests pinning the blog's base: the reference nix/pins.json pins, spelled
    once in the code (it was spelled twice in up alone)."""
    from sparkstack.oci.pins import BLOG_BASE

    assert json.loads((ROOT / "nix/pins.json").read_text())["reference"] == BLOG_BASE
    offenders = [p for p in (ROOT / "python/sparkstack").rglob("*.py") if BLOG_BASE in p.read_text()]
    assert [p.relative_to(ROOT).as_posix() for p in offenders] == ["python/sparkstack/oci/pins.py"]


def test_ups_bench_stage_waits_as_long_as_bench_does(tmp_path):
    """up's bench stage had its own timeout (60 s, in code); it is now bench's own declared default."""
    from sparkstack.bench.command import Request as Bench

    ground = up_plan.Ground(up_request(tmp_path), {})
    made = up_plan.stage_request("bench", up_request(tmp_path, bench=True), ground)
    default = {f.name: f.default for f, _ in declared(Bench)}["timeout"]
    assert made.timeout == default


def test_a_rerun_line_is_the_request_it_came_from():
    """argv() writes each option back as its declaration spells it; parsing that line gives the same request."""
    from click.testing import CliRunner

    from sparkstack import cli
    from sparkstack.launch.command import COMMAND, Request

    request = Request(target="all", recipe="r.toml", image="img", profile="lab", gates=False, memory_guard=4.0,
                      health_interval=2.5, health_attempts=9, worker_delay=0.0)
    line = argv(("launch",), request)
    seen = {}
    original = cli.run
    try:
        cli.run = lambda command, given: seen.update(given)
        CliRunner().invoke(cli.main, list(line[1:]) + ["--dry-run"], catch_exceptions=False)
    finally:
        cli.run = original
    assert seen, line
    parsed = cli.request_of(COMMAND.request, seen)
    assert dataclasses.replace(parsed, dry_run=False) == request


def test_a_newcomers_up_names_the_steps_that_unblock_it(tmp_path, monkeypatch):
    """Outside a checkout, with the recipe sparkstack installed: fetch's unblock copies the recipe and pins the copy
    (pinning the installed one is refused), and tune's names the worker to set, not a dry run."""
    from sparkstack import shipped
    from sparkstack.fetch.plan import pin_steps
    from sparkstack.recipe import load_recipe

    recipe = load_recipe(None)
    monkeypatch.setattr(shipped, "installed_copy_root", lambda path: path.parent)
    line = pin_steps(recipe)
    assert line == (f"{shlex.join(['cp', str(recipe.path), 'my-recipe.toml'])} && "
                    "sparkstack fetch --resolve --recipe ./my-recipe.toml")

    monkeypatch.undo()
    odd = tmp_path / "my dir;$(touch PWNED)" / "r.toml"  # pasted into a shell, the line runs nothing of the path
    odd.parent.mkdir()
    odd.write_bytes(recipe.path.read_bytes())
    assert shlex.split(pin_steps(load_recipe(odd))) == ["sparkstack", "fetch", "--resolve", "--recipe", str(odd)]

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("WORKER_SSH", "IMAGE")}
    env.update(HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"), SPARKSTACK_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run([*sparkstack_cmd(), "up", "--dry-run", "--json"], cwd=empty, env=env, capture_output=True,
                          text=True, timeout=120)
    assert_planned(proc)
    stages = {s["stage"]: s for s in json.loads(proc.stdout)["stages"]}
    assert stages["fetch"]["unblock"].startswith("sparkstack fetch --resolve --recipe /")
    assert stages["tune"]["state"] == "blocked" and "placeholder user@worker-node" in stages["tune"]["detail"]
    assert stages["tune"]["unblock"].startswith("name the worker: WORKER_SSH=user@host")
    assert "--dry-run" not in stages["tune"]["unblock"]


def test_cli_maps_options_and_renders_nothing_itself():
    """cli.py stays a thin floor: under 500 lines, and of the areas it imports only their command objects."""
    import ast

    text = (ROOT / "python/sparkstack/cli.py").read_text()
    assert len(text.splitlines()) < 500
    beyond = [f"{node.module}.{a.name}" for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)
              and (node.module or "").startswith("sparkstack.")
              and node.module not in ("sparkstack.command", "sparkstack.errors", "sparkstack.text")
              for a in node.names if a.name != "command"]
    assert beyond == []


@pytest.mark.parametrize("module", sorted(p.parent.name for p in (ROOT / "python/sparkstack").glob("*/command.py")))
def test_every_request_is_frozen_and_keyword_only(module):
    import importlib

    mod = importlib.import_module(f"sparkstack.{module}.command")
    requests = [v for v in vars(mod).values() if dataclasses.is_dataclass(v) and isinstance(v, type)
                and v.__name__.endswith("Request")]
    assert requests, module
    for r in requests:
        params = r.__dataclass_params__
        assert params.frozen, r
        assert all(f.kw_only for f in dataclasses.fields(r)), r


def test_an_argument_of_many_values_is_written_as_they_are():
    """ship's HOSTS: none given writes none (a literal `()` once leaked into up's unblock line), several write each."""
    from sparkstack.ship.command import Request

    assert argv(("ship",), Request()) == ("sparkstack", "ship")
    assert argv(("ship",), Request(hosts=("w1", "w2"), streams=2)) == ("sparkstack", "ship", "w1", "w2",
                                                                       "--streams", "2")


def test_a_usage_error_shows_the_users_value_escaped_on_one_line(tmp_path):
    """A usage error echoes what was typed: an escape sequence or a line break in it is shown escaped."""
    env = {**os.environ, "HOME": str(tmp_path), "SPARKSTACK_STATE_DIR": str(tmp_path / "state")}
    for args in (["up", "--from", "fe\x1b[31mtch", "--dry-run"],
                 ["sweep", "--vary", "NUM_SPEC_TOKENS=2", "--plot", str(tmp_path / "a\nb" / "x.png"), "--dry-run"]):
        proc = subprocess.run([*sparkstack_cmd(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode in (1, 2) and "\x1b" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("sparkstack: error: "), proc.stderr

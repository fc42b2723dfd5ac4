"""Stages carry their behaviour (issue 40): up's stage table holds each stage's command, its needs, what "up to
date" means for it and how it runs, so `up/apply.py` never asks a stage its name; and stop-then-launch is written
once, in launch's command object, for up's launch stage and sweep's cells alike."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkstack.command import View
from sparkstack.errors import SparkstackError
from sparkstack.launch import command as launch_cmd
from sparkstack.up import apply as up_apply
from sparkstack.up import plan as up_plan
from sparkstack.up.plan import UP_TO_DATE, WILL_RUN, Stage

ROOT = Path(__file__).resolve().parents[2]
NAMES = {"fetch", "strip", "build", "ship", "tune", "launch", "verify", "bench"}


def test_ups_apply_names_no_stage():
    """No `stage.name == "launch"`, no `in ("verify", "bench")`: not a single stage's name in apply.py's code."""
    tree = ast.parse((ROOT / "python/sparkstack/up/apply.py").read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    named = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and n.value in NAMES and id(n) not in docstrings]
    assert named == []


def test_the_table_names_every_stage_once_in_order_with_its_behaviour():
    assert up_plan.STAGES == ("fetch", "strip", "build", "ship", "tune", "launch", "verify", "bench")
    assert [s.name for s in up_plan.STAGES_TABLE if s.serves] == ["launch"]
    assert [s.name for s in up_plan.STAGES_TABLE if s.opt_in] == ["bench"]
    for spec in up_plan.STAGES_TABLE:
        assert callable(spec.request) and callable(spec.judge) and callable(spec.run), spec.name
        assert set(spec.needs) <= set(up_plan.STAGES[:up_plan.STAGES.index(spec.name)]), spec.name


def stage(name: str, state: str, work=None, outputs=None) -> Stage:
    return Stage(name, state, f"{name} detail", f"sparkstack {name}", outputs=outputs or {}, work=work)


def inputs(tmp_path: Path):
    from sparkstack.up.command import Request

    return Request(out=tmp_path / "image", stages=("tune", "launch", "verify"))


def test_apply_runs_each_stage_as_its_row_says(tmp_path, monkeypatch):
    """A row's `run` is what apply calls: replace the launch row's, and apply does what the row says, not a branch
    of its own (which stopped and started ranks itself)."""
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path / "state"))
    ran = []

    def run(command, s, view, finished):
        ran.append((command, s.name, dict(finished)))
        return {"run": f"{s.name}-run", "head_started_at": 7}

    for name in ("launch", "verify"):
        monkeypatch.setitem(up_plan.SPECS, name, dataclasses.replace(up_plan.SPECS[name], run=run))
    monkeypatch.setattr(up_apply, "plan_stage", lambda name, *args: stage(name, WILL_RUN))
    plan = up_plan.UpPlan("r", (stage("launch", WILL_RUN), stage("verify", WILL_RUN)), None, None, inputs(tmp_path), {})
    result = up_apply.apply_up(plan)
    assert result.stopped is None, result.failure
    assert [(c, n) for c, n, _ in ran] == [(launch_cmd.COMMAND, "launch"), (up_plan.SPECS["verify"].command, "verify")]
    assert ran[1][2]["launch"].outputs == {"run": "launch-run", "head_started_at": 7}


def test_verify_and_bench_are_recorded_with_the_launch_they_ran_against():
    """What a later up judges them by: the run and head start of the stage that serves, whatever it is called."""
    command = SimpleNamespace(apply=lambda work, view: "ok", failure=lambda work, result: None,
                              outputs=lambda work, result: {"checks": 9})
    served = stage("launch", UP_TO_DATE, outputs={"run": "r1", "head_started_at": 5, "image": "sha256:x"})
    outputs = up_plan.SPECS["verify"].run(command, stage("verify", WILL_RUN, work="plan"), View(),
                                          {"fetch": stage("fetch", UP_TO_DATE), "launch": served})
    assert outputs == {"run": "r1", "head_started_at": 5, "checks": 9}
    failing = SimpleNamespace(**{**vars(command), "failure": lambda work, result: "2 of 9 checks failed"})
    with pytest.raises(SparkstackError, match="2 of 9 checks failed"):
        up_plan.SPECS["bench"].run(failing, stage("bench", WILL_RUN, work="plan"), View(), {"launch": served})


class Calls:
    def __init__(self, stop_failures=()):
        self.calls, self.stop_failures = [], tuple(stop_failures)

    def stop(self, plan, view):
        self.calls.append(("stop", plan))
        return launch_cmd.Stopped(("stopped",), self.stop_failures)

    def apply(self, plan, view):
        self.calls.append(("start", plan))
        return SimpleNamespace(record=Path("/runs/r1.json"), boot=None)


def test_relaunch_stops_then_starts_and_starts_nothing_when_the_stop_fails(monkeypatch):
    calls = Calls()
    monkeypatch.setattr(launch_cmd, "stop", calls.stop)
    monkeypatch.setattr(launch_cmd, "apply", calls.apply)
    launch_cmd.relaunch("p", View())
    assert calls.calls == [("stop", "p"), ("start", "p")]
    calls.calls.clear()
    launch_cmd.relaunch("p", View(), stop_first=False)
    assert calls.calls == [("start", "p")]
    failing = Calls(["rank 1: refused"])
    monkeypatch.setattr(launch_cmd, "stop", failing.stop)
    monkeypatch.setattr(launch_cmd, "apply", failing.apply)
    with pytest.raises(SparkstackError, match="rank 1: refused"):
        launch_cmd.relaunch("p", View())
    assert failing.calls == [("stop", "p")]


def test_up_and_sweep_boot_through_the_one_relaunch(monkeypatch):
    """up's launch stage stops only a pair that is there; each sweep cell always stops first: both call relaunch."""
    from sparkstack.sweep import command as sweep_cmd

    seen = []
    monkeypatch.setattr(launch_cmd, "relaunch", lambda plan, view, stop_first=True: seen.append((plan, stop_first))
                        or SimpleNamespace(record=Path("/runs/run-7.json"), boot=None))
    monkeypatch.setattr(launch_cmd, "serving", lambda plan: SimpleNamespace(run_id="run-7", head_started_at=3))
    for present in ((), (0, 1)):
        work = ("launch plan", SimpleNamespace(present=present))
        out = up_plan.SPECS["launch"].run(launch_cmd.COMMAND, stage("launch", WILL_RUN, work=work), View(), {})
        assert out == {"run": "run-7", "head_started_at": 3, "record": "/runs/run-7.json"}
    assert sweep_cmd._boot(None, "cell plan", View()) == ("run-7", None)
    assert seen == [("launch plan", False), ("launch plan", True), ("cell plan", True)]

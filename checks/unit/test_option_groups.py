"""Option groups (issue 40): each shared option is defined once, and `up` and `sweep` take launch's and bench's
options as those commands declare them.

The checks read the click commands `cli` builds (what a user's --help and parsing see), not the declarations, and
compare one command's option with another's: a copy that drifts in default, help, type or environment variable
fails here. On the tree before the groups (c0be690) up's --bench-concurrency defaulted to 1,2,4 and sweep's to 1
(bench's: all of 1..6), up had a bare --no-gates flag, and --temperature was declared in five places."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from sparkstack import cli

ROOT = Path(__file__).resolve().parents[2]

LAUNCH_SHARED = ("profile", "gates", "health_interval", "health_attempts", "worker_delay")
# (parent, child, prefix, the child's options the parent takes)
INHERITED = [
    ("up", "launch", "", LAUNCH_SHARED),
    ("up", "bench", "bench", ("concurrency", "rounds", "category")),
    ("up", "bench", "", ("temperature",)),
    ("sweep", "launch", "", ("image", *LAUNCH_SHARED)),
    ("sweep", "bench", "bench", ("concurrency", "rounds", "category", "max_tokens")),
    ("sweep", "bench", "", ("temperature",)),
]


def command(name: str) -> click.Command:
    return cli.main.get_command(click.Context(cli.main), name)


def by_flag(cmd: click.Command) -> dict[str, click.Option]:
    return {flag: p for p in cmd.params if isinstance(p, click.Option) for flag in p.opts}


def flag_of(name: str, prefix: str) -> str:
    flag = "--" + name.replace("_", "-")
    return f"--{prefix}-{flag[2:]}" if prefix else flag


def kind(t: click.ParamType) -> tuple:
    """A type as what it accepts: its class and its bounds or choices."""
    return type(t).__name__, sorted((k, repr(v)) for k, v in vars(t).items())


def shown(opt: click.Option) -> dict:
    """What a user meets of an option: its default, its help, its type, its environment variable, its toggle."""
    return {"default": opt.default, "help": opt.help, "type": kind(opt.type), "envvar": opt.envvar,
            "show_default": opt.show_default, "multiple": opt.multiple, "is_flag": opt.is_flag,
            "off": [f[len("--no-"):] for f in opt.secondary_opts]}


@pytest.mark.parametrize("parent,child,prefix,names", INHERITED, ids=lambda v: v if isinstance(v, str) else None)
def test_a_composed_command_takes_its_childs_options_as_the_child_declares_them(parent, child, prefix, names):
    theirs, ours = by_flag(command(child)), by_flag(command(parent))
    for name in names:
        flag = flag_of(name, prefix)
        assert flag in ours, f"{parent} has no {flag}"
        mine, source = shown(ours[flag]), shown(theirs[flag_of(name, "")])
        if prefix:  # a prefixed toggle would turn off as --no-bench-x: none is embedded so far
            assert mine["off"] == source["off"] == []
        assert mine == source, f"{parent} {flag} differs from {child} {flag_of(name, '')}"


def test_the_inherited_defaults_are_benchs_and_launchs_own():
    """The defaults up and sweep had of their own (1,2,4 and 1) are gone: bench's own plan default rules."""
    from sparkstack.bench.plan import DEFAULT_CONCURRENCY

    for parent in ("up", "sweep"):
        opt = by_flag(command(parent))["--bench-concurrency"]
        assert opt.default is None and str(DEFAULT_CONCURRENCY).strip("()").replace(" ", "") in opt.help
        assert by_flag(command(parent))["--temperature"].default == 1.0
        assert by_flag(command(parent))["--health-attempts"].envvar == "HEALTH_ATTEMPTS"


def test_gates_have_one_spelling_everywhere():
    """--gates/--no-gates, a toggle, wherever a command runs the gates; --no-gates alone is still typed by users."""
    seen = []
    for name in ("launch", "up", "sweep"):
        opt = by_flag(command(name)).get("--gates")
        assert opt is not None, f"{name} has no --gates"
        assert (opt.opts, opt.secondary_opts, opt.default) == (["--gates"], ["--no-gates"], True), name
        seen.append(name)
    for name in cli.main.list_commands(click.Context(cli.main)):
        cmd = command(name)
        if isinstance(cmd, click.Group):
            continue
        for p in cmd.params:
            if "--no-gates" in getattr(p, "opts", []):
                pytest.fail(f"{name} declares --no-gates as an option of its own")
    assert seen == ["launch", "up", "sweep"]


def parsed(*line: str):
    """The request cli makes of `sparkstack LINE` (nothing run)."""
    seen = {}
    original = cli.run
    try:
        cli.run = lambda cmd, given: seen.update(given, _command=cmd)
        result = CliRunner().invoke(cli.main, list(line), catch_exceptions=False)
    finally:
        cli.run = original
    assert seen, result.output
    cmd = seen.pop("_command")
    return cmd, cli.request_of(cmd.request, seen)


def test_up_takes_no_gates_and_gates_and_writes_the_choice_back():
    cmd, off = parsed("up", "--no-gates")
    assert off.gates is False and "--no-gates" in cmd.argv(off)
    cmd, on = parsed("up", "--gates")
    assert on.gates is True and "--gates" not in cmd.argv(on) and "--no-gates" not in cmd.argv(on)
    cmd, back = parsed(*cmd.argv(off)[1:])
    assert back == off


def test_a_parents_options_reach_the_child_request_in_one_call(tmp_path):
    """up's stage requests and sweep's bench request carry what the user gave up or sweep, prefix dropped."""
    from sparkstack.bench.command import Request as Bench
    from sparkstack.command import request_from
    from sparkstack.sweep.command import Request as Sweep
    from sparkstack.up import plan as up_plan

    _, up = parsed("up", "--no-gates", "--health-interval", "2.5", "--bench-rounds", "7", "--bench-concurrency",
                   "2,8", "--bench-category", "code,json", "--temperature", "0.5", "--profile", "lab", "--bench")
    ground = up_plan.Ground(up, {})
    launch = up_plan.stage_request("launch", up, ground)
    assert (launch.gates, launch.health_interval, launch.profile) == (False, 2.5, "lab")
    bench = up_plan.stage_request("bench", dataclasses.replace(up, out=tmp_path), ground)
    assert (bench.rounds, bench.concurrency, bench.category, bench.temperature) == (7, (2, 8), ("code", "json"), 0.5)
    verify = up_plan.stage_request("verify", up, ground)
    assert verify.temperature == 0.5

    sweep = Sweep(vary=("A=1,2",), bench_max_tokens=64, bench_rounds=2, temperature=0.7, image="img", gates=False)
    child = request_from(Bench, sweep, url="http://h:1")
    assert (child.max_tokens, child.rounds, child.temperature, child.url) == (64, 2, 0.7, "http://h:1")
    assert not hasattr(child, "gates") and child.recipe is None  # only the groups both embed pass down


def option_calls_naming(flag: str) -> list[str]:
    """Where the product's source calls `option(...)` with `flag` among its arguments."""
    found = []
    for path in sorted((ROOT / "python/sparkstack").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "option"
                    and any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@pytest.mark.parametrize("flag", ["--recipe", "--image", "--temperature", "--top-p", "--gates", "--profile",
                                  "--health-attempts", "--worker-delay", "--rounds"])  # soak's --health-interval and
# --concurrency are its own options (a /metrics cadence; one number of streams), not launch's or bench's
def test_each_shared_option_is_defined_once(flag):
    assert len(option_calls_naming(flag)) == 1, option_calls_naming(flag)


@pytest.mark.parametrize("flag", ["--bench-concurrency", "--bench-rounds", "--bench-category", "--no-gates"])
def test_an_embedded_or_negated_flag_is_never_spelled(flag):
    assert option_calls_naming(flag) == []

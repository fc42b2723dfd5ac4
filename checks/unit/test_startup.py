"""Start-up imports only what the command named uses (issue 39): click's lazy group, held to it here.

Each check runs in a fresh interpreter, since this process has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("requests", "prometheus_client", "urllib3", "rich", "huggingface_hub", "safetensors", "zstandard")


def modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def cli_help(*words: str) -> str:
    """Run `sparkstack WORDS --help` in-process of a fresh interpreter, then report its modules."""
    argv = ["sparkstack", *words, "--help"]
    return (f"import sys, contextlib, io\nsys.argv = {argv!r}\nfrom sparkstack import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    cli.entry()")


def top_level(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def test_importing_the_cli_loads_no_command_and_no_network_library():
    mods = modules_after("import sparkstack.cli")
    assert not top_level(mods) & set(HEAVY), sorted(top_level(mods) & set(HEAVY))
    areas = {m for m in mods if m.startswith("sparkstack.") and m.count(".") >= 1}
    assert areas <= {"sparkstack.cli", "sparkstack.command", "sparkstack.errors", "sparkstack.interrupt",
                     "sparkstack.terminal", "sparkstack.text"}, sorted(areas)


def test_the_top_help_lists_every_command_without_importing_one():
    mods = modules_after(cli_help())
    assert not {m for m in mods if m.split(".")[:2] != ["sparkstack", "cli"] and m.endswith(".command")
                and m != "sparkstack.command"}


@pytest.mark.parametrize(("words", "own", "foreign"), [
    (("strip",), "sparkstack.strip", ("requests", "prometheus_client", "sparkstack.verify", "sparkstack.bench")),
    (("pin", "base"), "sparkstack.oci", ("prometheus_client", "sparkstack.verify", "sparkstack.strip")),
    (("plan", "kv"), "sparkstack.launch", ("prometheus_client", "sparkstack.bench", "sparkstack.strip")),
])
def test_a_commands_help_imports_its_own_area_and_not_the_others(words, own, foreign):
    mods = modules_after(cli_help(*words))
    assert any(m == own or m.startswith(own + ".") for m in mods), own
    loaded = [f for f in foreign if any(m == f or m.startswith(f + ".") for m in mods)]
    assert loaded == []


def test_the_lazy_listing_names_exactly_the_commands_that_load():
    """Each name in a group's listing loads a command whose help is the listing's (no name lost, none that fails)."""
    import click

    from sparkstack import cli

    def walk(group, path):
        ctx = click.Context(group, info_name=path[-1])
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None, (*path, name)
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*path, name))
            else:
                yield (*path, name), cmd

    found = dict(walk(cli.main, ("sparkstack",)))
    assert {" ".join(p[1:]) for p in found} >= {"strip", "image build", "image verify", "image load", "patch check",
                                                "pin overlay", "pin base", "pin fetch", "fetch", "launch", "tune",
                                                "plan kv", "ship", "verify", "soak", "top", "bench", "compare",
                                                "sweep", "up"}
    assert all(cmd.help and cmd.params for cmd in found.values())

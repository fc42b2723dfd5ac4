"""The `sparkstack` command: click options mapped to each command's request, its plan and result handed to
their renderers. The options are made from the requests' own declarations (`sparkstack.command`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import json
import os
import signal
import sys
from pathlib import Path

import click

from sparkstack import interrupt, terminal
from sparkstack.command import Command, declared, names
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.text import printable


def _by() -> str:
    """" by SIGTERM" or " by SIGHUP" after "interrupted"; nothing for Ctrl-C."""
    return "" if interrupt.received() == signal.SIGINT else f" by {interrupt.name()}"


def _fail(message: str) -> None:
    click.echo(f"sparkstack: error: {message}", err=True)
    sys.exit(1)


# ---------------------------------------------------------------- options, from the requests' declarations

def _click_type(kind):
    if isinstance(kind, tuple):
        name = kind[0]
        if name in ("float", "float?"):
            return terminal.FiniteFloat(kind[1], kind[2])
        if name == "int":
            return click.IntRange(min=kind[1], max=kind[2])
        if name == "choice":
            return click.Choice(list(kind[1]))
    return {"path": click.Path(path_type=Path), "ints": terminal.IntList(), "duration": terminal.Duration(),
            "file": click.Path(path_type=Path, exists=True, dir_okay=False),
            "dir": click.Path(path_type=Path, exists=True, file_okay=False)}.get(kind)


def _parameter(f, opt):
    kind = opt.kind
    if not opt.flags:  # an argument
        many = kind == "hosts"
        given = {} if opt.required or many else {"default": f.default}  # click 8.3: an explicit None default is a value
        return click.argument(f.name, nargs=-1 if many else 1, required=opt.required and not many,
                              metavar=opt.metavar, type=None if many else _click_type(kind), **given)
    common = {"help": opt.help or None, "envvar": opt.env, "show_default": bool(opt.show_default),
              "required": opt.required, "metavar": opt.metavar, "cls": terminal.EnvOption if opt.env else click.Option}
    if kind == "flag":
        return click.option(*opt.flags, f.name, is_flag=True, **common)
    if kind == "toggle":
        flag = opt.flags[0]
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=f.default, **common)
    if kind in ("names", "many"):
        return click.option(*opt.flags, f.name, multiple=True, **common)
    if isinstance(kind, tuple) and kind[0] == "float?":
        return click.option(*opt.flags, f.name, type=_click_type(kind), is_flag=False, flag_value=kind[3],
                            default=f.default, **common)
    if kind == "path?":  # given bare: "", the command's own default
        return click.option(*opt.flags, f.name, is_flag=False, flag_value="", default=f.default, **common)
    default = f.default
    if kind == "ints" and default is not None:
        default = ",".join(map(str, default))
    elif kind == "duration" and default is not None:  # as help shows it (5m), which the type reads back
        default = opt.show_default if isinstance(opt.show_default, str) else f"{default:g}s"
    given = {} if opt.required else {"default": default}
    return click.option(*opt.flags, f.name, type=_click_type(kind), **given, **common)


def options(request_type, only: tuple[str, ...] | None = None):
    """click parameters for a request's declared fields (or only those named)."""

    def decorate(fn):
        for f, opt in reversed(declared(request_type)):
            if only is None or f.name in only:
                fn = _parameter(f, opt)(fn)
        return fn

    return decorate


def request_of(request_type, given: dict):
    """The request from click's values: repeatable names split on commas, argument lists as tuples."""
    values = {}
    for f, opt in declared(request_type):
        if f.name not in given:
            continue
        value = given[f.name]
        if opt.kind == "names":
            value = names(value)
        elif opt.kind in ("many", "hosts"):
            value = tuple(value)
        values[f.name] = value
    return request_type(**values)


# ---------------------------------------------------------------- running a command

def one_line_errors(fn):
    """Turn expected failures into one stderr line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            raise click.UsageError(_shown(str(exc))) from None
        except SparkstackError as exc:
            _fail(_shown(str(exc)))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(_shown(f"{where}{exc.strerror or exc}"))
        except KeyboardInterrupt:
            command = _current.get("command")
            if command is not None and command.quiet_interrupt:
                sys.exit(0 if interrupt.received() == signal.SIGINT else interrupt.exit_code())
            said = command.on_interrupt if command is not None else Command.on_interrupt
            click.echo(f"sparkstack: interrupted{_by()}{said}", err=True)
            sys.exit(interrupt.exit_code())

    return wrapper


_current: dict = {}  # the command running and its view: errors are shown through the view (its secrets masked)


def _shown(text: str) -> str:
    view = _current.get("view")
    return view.shown(text) if view is not None else text


def _emit(as_json: bool, doc, lines) -> None:
    """--json: the document (`doc()`); else the lines (`lines()`): text, or rich renderables (tables)."""
    if as_json:
        made = doc()
        if made is not None:
            click.echo(json.dumps(made, indent=2))
        return
    for line in lines():
        if isinstance(line, str):  # a renderer's own line breaks stay; anything else is escaped
            click.echo("\n".join(_shown(part) for part in line.split("\n")))
        else:
            terminal.print_rich(line)


def _with_verdict(doc, verdict):
    return doc if verdict is None or doc is None else {**doc, "verdict": verdict.to_json()}


def run(command: Command, given: dict) -> None:
    """Plan; a dry run shows the plan; else apply through a terminal view and show the result."""
    request = request_of(command.request, given)
    view = terminal.TerminalView(request.as_json)
    _current.update(command=command, view=view)
    plan = command.plan(request, os.environ)
    for w in command.warnings(plan):
        view.warn(w)
    if command.dry(request):
        verdict = command.verdict(plan)
        _emit(request.as_json, lambda: _with_verdict(command.plan_json(plan), verdict),
              lambda: command.plan_lines(plan))
        if verdict is not None:  # the last line, after any note (stderr under --json: the document is stdout)
            click.echo(view.shown(verdict.line()), err=request.as_json)
            if verdict.exit_code:
                sys.exit(verdict.exit_code)
        result = None
    else:
        if command.preview:  # what is about to happen, before it does (stderr under --json)
            for line in command.plan_lines(plan):
                click.echo(view.shown(line), err=request.as_json)
        if command.consent(plan) and not request.yes:
            _consent(command)
        result = command.apply(plan, view)
        _emit(request.as_json, lambda: command.result_json(plan, result), lambda: command.result_lines(plan, result))
        if request.as_json:
            for w in command.after_json(plan, result):
                view.warn(w)
        cut = command.cut(plan, result)
        if cut is not None:  # "": the command said where it stands itself
            if cut:
                click.echo(f"sparkstack: interrupted{_by()}{cut}", err=True)
            sys.exit(interrupt.exit_code())
    failed = command.failure(plan, result)
    if failed:
        _fail(view.shown(failed))


def _consent(command: Command) -> None:
    """A yes to the plan above, asked on a terminal; off one, --yes is needed."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError("not a terminal: pass --yes to apply the plan above (or --dry-run to only see it)")
    if not click.confirm("apply this plan?", err=True):
        click.echo(f"sparkstack: {' '.join(command.path)}: nothing applied", err=True)
        sys.exit(1)


def click_command(cmd: Command, name: str, help: str, cls=None) -> click.Command:
    """The click command running `cmd`: its options from the request's declarations, its help as given."""

    @options(cmd.request)
    @one_line_errors
    def callback(**given):
        run(cmd, given)

    return (cls or click.Command)(name, callback=callback, params=getattr(callback, "__click_params__", [])[::-1],
                                  help=help)


@dataclasses.dataclass(frozen=True)
class Lazy:
    """A subcommand named by where its command object lives ("module:NAME"), imported on first use."""

    target: str
    help: str
    cls: type | None = None

    def load(self, name: str) -> click.Command:
        module, _, attr = self.target.partition(":")
        return click_command(getattr(importlib.import_module(module), attr), name, self.help, self.cls)


class LazyGroup(click.Group):
    """click's lazy-loading group: a subcommand is imported when it is named, so `sparkstack strip` loads strip's
    modules alone and `sparkstack --help` none (its listing reads the table's help, not the commands)."""

    def __init__(self, *args, lazy: dict[str, Lazy | click.Group], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = {n: e for n, e in lazy.items() if isinstance(e, Lazy)}
        for name, group in lazy.items():
            if isinstance(group, click.Group):
                self.add_command(group, name)

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def resolve_command(self, ctx, args):
        # click (before 8.4 and after) suggests from the commands loaded so far; the lazy table's are never among
        # them. A name that is no command is told the ones it is near, among all, in click's own words.
        name = click.utils.make_str(args[0])
        known = self.list_commands(ctx)
        if name not in known and not name.startswith("-") and not ctx.resilient_parsing:
            near = difflib.get_close_matches(name, known)
            hint = "" if not near else f" Did you mean {near[0]!r}?" if len(near) == 1 else \
                f" (Did you mean one of: {', '.join(map(repr, sorted(near)))}?)"
            raise click.UsageError(f"No such command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            self.add_command(self.lazy[name].load(name), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        limit = formatter.width - 6 - max(map(len, self.list_commands(ctx)), default=0)
        rows = [(name, self.lazy[name].help if name in self.lazy else self.commands[name].help or "")
                for name in self.list_commands(ctx)]
        rows = [(name, click.Command(name, help=text).get_short_help_str(limit)) for name, text in rows]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def group(name: str, help: str, **lazy: Lazy | click.Group) -> LazyGroup:
    return LazyGroup(name, help=help, lazy=lazy, context_settings={"help_option_names": ["-h", "--help"]})


# ---------------------------------------------------------------- the commands, by name (nothing imported here)

main = click.version_option(package_name="sparkstack")(group(
    "sparkstack", "Plan, build, ship and launch GLM-5.3-Flash NVFP4 + DFlash2 on DGX Spark pairs.",
    strip=Lazy("sparkstack.strip.command:COMMAND",
               "Remove the MTP layer from a checkpoint, writing a new cache entry and never touching SRC."),
    image=group("image", "Build, verify and load the serving image (build and verify need no daemon).",
                build=Lazy("sparkstack.image.command:COMMAND",
                           "Pinned base + overlay + patch steps -> one new layer; base layers reused by digest."),
                pull=Lazy("sparkstack.oci.command:PULL", "Assemble the pinned base as an OCI layout dir from the "
                          "registry: every blob verified, resumable."),
                verify=Lazy("sparkstack.oci.command:VERIFY", "Re-hash every blob and check every layer's diff_id."),
                load=Lazy("sparkstack.oci.command:LOAD", "Stream an OCI image into docker/podman load (no temp "
                          "tar); its image ID must be the config digest.")),
    patch=group("patch", "Inspect the overlay's patch steps against a base image.",
                check=Lazy("sparkstack.patch.command:CHECK",
                           "The drift report: every step applied, applicable, drifted or gone; every install target "
                           "absent, identical or present upstream. Exit 1 when a step drifted or its file is gone.")),
    pin=group("pin", "Pin inputs by content: the base image's digests (nix/pins.json) and the overlay's files.",
              overlay=Lazy("sparkstack.patch.command:PIN", "Fill a checkout's overlay.toml sha256 fields from the "
                           "real overlay files (and wheels)."),
              base=Lazy("sparkstack.oci.command:PIN_BASE", "Resolve the base REF (a tag or digest) through its "
                        "registry and pin it, per platform, in nix/pins.json."),
              fetch=Lazy("sparkstack.oci.command:PIN_FETCH", "Download one blob or manifest the pins file names, "
                         "verify it, and write it atomically to --out.")),
    fetch=Lazy("sparkstack.fetch.command:COMMAND",
               "Download exactly the recipe's pinned model and drafter commits into the head's HF cache."),
    launch=Lazy("sparkstack.launch.command:COMMAND", "Launch rank N, all ranks, or `stop` / `status` them, from a "
                "recipe.", terminal.OptionalValueCommand),
    tune=Lazy("sparkstack.tune.command:COMMAND", "Tune every rank's host: swappiness 0 (now and at boot), GPU "
              "persistence mode and clock cap, page cache."),
    plan=group("plan", "Plans that need no machine.",
               kv=Lazy("sparkstack.launch.command:PLAN_KV",
                       "Tokens a KV pin buys, its coverage of max-model-len, and whether KV pages unify.")),
    ship=Lazy("sparkstack.ship.command:COMMAND", "Send each host only the image and weight blobs it lacks, verified "
              "on arrival; then load and link there."),
    verify=Lazy("sparkstack.verify.command:COMMAND", "Prove a served endpoint works: /health, chat, streamed usage, "
                "a tool call, the reasoning split and spec decode (required); an image part, a U+FFFD probe and the "
                "prefix cache (warn only). Exit 1 if a required check fails."),
    soak=Lazy("sparkstack.soak.command:COMMAND",
              "Bounded load for hours: C streams of the prompt suite, a JSONL log, flaps and restarts counted."),
    top=Lazy("sparkstack.top.command:COMMAND", "A live view of an engine from /metrics: requests, tok/s, acceptance, "
             "KV and prefix cache, preemptions."),
    bench=Lazy("sparkstack.bench.command:COMMAND", "Measure a served stack on the fixed prompt suite: one block per "
               "(concurrency, category); exit 1 on a fault."),
    compare=Lazy("sparkstack.bench.command:COMPARE",
                 "Per-cell change from bench report A to B, marking changes beyond the spread of each run's rounds."),
    sweep=Lazy("sparkstack.sweep.command:COMMAND", "Run the recipe once per cell of the knobs' product (--vary "
               "KNOB=V1,V2): boot, bench with one salt, and one table of every cell's figures beside the first's "
               "noise. Resumable; relaunches the recipe as it stands at the end."),
    up=Lazy("sparkstack.up.command:COMMAND", "The whole runbook, planned first: fetch, strip, build, ship, tune, "
            "launch, verify (and bench with --bench). A second run after a fix resumes: finished stages are up to "
            "date."),
))


def entry() -> None:
    """The `sparkstack` program: click in non-standalone mode, so that usage errors are one line too."""
    sys.stdout = terminal.GuardedStdout(sys.stdout)
    _current.clear()  # a fresh run: nothing of a run before it in this process (the in-process test runner)
    interrupt.install()  # SIGTERM and SIGHUP take Ctrl-C's paths
    try:
        code = main.main(prog_name="sparkstack", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "sparkstack"
        click.echo(f"sparkstack: error: {printable(exc.format_message())} (see `{where} --help`)", err=True)
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

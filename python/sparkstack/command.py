"""What every command is made of, declared once: a frozen keyword-only request, a plan, an apply, and a view.

A command object (each area's `command.py`) has:

- `Request`: a frozen, keyword-only dataclass of the command's options. Each field is declared by `option()` or
  `argument()` with its default, its flags, its help and its environment variable, once. The CLI builds its
  click options from these declarations; `argv()` turns a request back into the command line that re-runs it.
- `plan(request, environ)` -> a frozen plan (it holds the request). No side effects.
- `apply(plan, view)` -> a result. All I/O is here; progress and lines go to the view.
- `plan_lines`, `plan_json`, `result_lines`, `result_json`: the plan's and result's human and JSON forms.
- `summary(plan)` -> `Summary`: one shape for every command (state, detail, bytes, outputs), which `up` shows.

A view is where a command's progress and lines go: the terminal (cli), `up`'s live view, or a test. It masks the
secrets it was told of and escapes control characters, once, for every line it shows; commands never do.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.errors import SparkstackError

UP_TO_DATE, WILL_RUN, BLOCKED = "up to date", "will run", "blocked"


@dataclass(frozen=True)
class Opt:
    """One option or argument of a command, as the CLI shows it and as `argv` writes it back.

    kind: "text", "path", "file" and "dir" (a path that must exist, refused up front), "flag" (a bare --x),
    "toggle" (--x/--no-x), ("float", lo, hi), ("int", lo, hi), ("choice", names), "ints" (1,2,4), "duration" (90s), "names" (repeatable, each may be comma-separated),
    "many" (repeatable text), ("float?", lo, hi, value) (an option whose value may be left out: that value),
    "path?" (a path that may be left out: then "", which the command reads as its own default, such as the latest
    run record or the recipe's file).
    """

    flags: tuple[str, ...]  # empty for an argument
    help: str = ""
    kind: object = "text"
    env: str | None = None
    metavar: str | None = None
    show_default: bool | str = False  # a text: the default as help shows it (5m, not 300.0)
    required: bool = False


def option(default, *flags: str, help: str = "", kind: object = "text", env: str | None = None,
           metavar: str | None = None, show_default: bool | str = False, required: bool = False):
    """A request field that is a command-line option (its first flag is the one `argv` writes)."""
    if env:  # "Seconds between polls (env X)."
        stop = "." if help.endswith(".") else ""
        help = f"{help.removesuffix('.')} (env {env}){stop}".lstrip()
    meta = {"cli": Opt(tuple(flags), help, kind, env, metavar, show_default, required)}
    if isinstance(default, (list, dict, set)):
        raise TypeError("a request's default is immutable")
    return field(default=default, metadata=meta)


def argument(default=dataclasses.MISSING, *, help: str = "", kind: object = "text", metavar: str | None = None):
    """A request field that is a positional argument."""
    return field(default=default, metadata={"cli": Opt((), help, kind, None, metavar, False,
                                                        default is dataclasses.MISSING)})


@dataclass(frozen=True)
class Embed:
    """A group's options (a frozen dataclass of `option()` fields) as they stand in a request: `prefix` before each
    flag and field name (bench's --rounds in up is --bench-rounds, field bench_rounds), the same default and help."""

    group: type
    prefix: str = ""
    only: tuple[str, ...] | None = None

    def fields(self) -> list[tuple[str, str, dataclasses.Field]]:
        """(field name, annotation, field) of each option, in the group's order."""
        made = []
        hints = {}
        for klass in reversed(self.group.__mro__):
            hints.update(klass.__dict__.get("__annotations__", {}))
        for f in dataclasses.fields(self.group):
            if self.only is not None and f.name not in self.only:
                continue
            opt = f.metadata["cli"]
            flags = tuple(f"--{self.prefix}-{flag[2:]}" for flag in opt.flags) if self.prefix else opt.flags
            name = f"{self.prefix.replace('-', '_')}_{f.name}" if self.prefix else f.name
            meta = {"cli": dataclasses.replace(opt, flags=flags), "from": (self.group, f.name)}
            made.append((name, hints[f.name], field(default=f.default, metadata=meta)))
        return made


def embed(group: type, prefix: str = "", only: tuple[str, ...] | None = None) -> Embed:
    """In a `request` class body (`_launch: object = embed(LaunchOptions)`): the group's options, in its place."""
    if only is not None:
        unknown = set(only) - {f.name for f in dataclasses.fields(group)}
        if unknown:
            raise TypeError(f"{group.__name__} has no option {', '.join(sorted(unknown))}")
    return Embed(group, prefix, only)


def request(cls):
    """A command's request: a frozen, keyword-only dataclass, each `embed()` replaced by the group's options."""
    annotations = {}
    for name, hint in cls.__dict__.get("__annotations__", {}).items():
        value = cls.__dict__.get(name)
        if not isinstance(value, Embed):
            annotations[name] = hint
            continue
        delattr(cls, name)
        for made, made_hint, made_field in value.fields():
            annotations[made] = made_hint
            setattr(cls, made, made_field)
    cls.__annotations__ = annotations
    return dataclass(frozen=True, kw_only=True)(cls)


def request_from(request_type, parent, **given):
    """The request of a command that `parent`'s composes (launch in up): every option the two embed from the same
    group, taken from the parent (its prefix dropped), then `given`. One call, not field by field."""
    theirs = {f.metadata["from"]: f.name for f in dataclasses.fields(parent) if "from" in f.metadata}
    values = {f.name: getattr(parent, theirs[f.metadata["from"]]) for f in dataclasses.fields(request_type)
              if f.metadata.get("from") in theirs}
    return request_type(**{**values, **given})


def declared(request_type) -> list[tuple[dataclasses.Field, Opt]]:
    """The request's fields that the command line sets, in declaration order."""
    return [(f, f.metadata["cli"]) for f in dataclasses.fields(request_type) if "cli" in f.metadata]


def _value_args(opt: Opt, value) -> list[str]:
    kind = opt.kind[0] if isinstance(opt.kind, tuple) else opt.kind
    if kind in ("float", "float?"):
        return [f"{value:g}"]
    if kind == "duration":
        return [f"{value:g}s"]
    if kind == "ints":
        return [",".join(map(str, value))]
    return [str(value)]


def argv(path: tuple[str, ...], request) -> tuple[str, ...]:
    """The command line that runs `request` again: its arguments, then each option whose value is not its
    default (the ones the output shows and the reader may want to change are set explicitly by the caller)."""
    args: list[str] = []
    opts: list[str] = []
    for f, opt in declared(type(request)):
        value = getattr(request, f.name)
        if not opt.flags:
            if isinstance(value, tuple):  # an argument taking many (ship's hosts)
                args += [str(v) for v in value]
            elif value is not None:
                args.append(str(value))
            continue
        default = f.default
        if value == default or value is None or f.name in ("dry_run", "as_json"):
            continue
        flag = opt.flags[0]
        if opt.kind == "flag" or (opt.kind == "path?" and value == ""):
            opts.append(flag)
        elif opt.kind == "toggle":
            opts.append(flag if value else "--no-" + flag[2:])
        elif opt.kind in ("names", "many"):
            opts += [a for v in value for a in (flag, str(v))]
        else:
            opts += [flag, *_value_args(opt, value)]
    return ("sparkstack", *path, *args, *opts)


def absolute(path: Path | None) -> Path | None:
    """A path the commands `up` prints can use from any directory."""
    return None if path is None else path.absolute()


def names(given: tuple[str, ...]) -> tuple[str, ...]:
    """Repeatable values, each possibly a comma-separated list (code,json), as one tuple of names."""
    return tuple(n.strip() for c in given for n in c.split(",") if n.strip())


@dataclass(frozen=True)
class Summary:
    """What a command's plan says, in the one shape every command shares (what `up` shows of a stage)."""

    state: str  # UP_TO_DATE, WILL_RUN or BLOCKED
    detail: str  # one line: what makes it up to date, what it will do, or what blocks it
    bytes: int | None = None  # what it will download, write or send
    outputs: Mapping[str, object] = field(default_factory=dict)  # digests, revisions, run ids known now
    unblock: str | None = None  # BLOCKED: the command line that unblocks it


class Blocked(SparkstackError):
    """A plan cannot be made: `detail` says why (one line, as any error), `unblock` the command line that fixes it."""

    def __init__(self, detail: str, unblock: str | None = None) -> None:
        super().__init__(detail)
        self.detail, self.unblock = detail, unblock


class StageRows:
    """`up`'s rows, one per stage, as a view shows them (this one shows nothing)."""

    def started(self, stage: str, total: int | None) -> Callable[[int], None] | None:
        return None

    def resize(self, stage: str, total: int | None) -> None:
        pass

    def finished(self, run) -> None:
        pass

    def say(self, line: str) -> None:
        pass


class View:
    """Where a command's progress and lines go. This one shows nothing (a test's, or a stage run out of sight).

    - `say`: a line of the command's own story (stdout; under --json, stderr);
    - `note`: a line beside it that never goes to stdout (waiting for a lock, a window of soak);
    - `warn`: a warning;
    - `out`: a line of output proper, as it is made (JSON lines);
    - `progress` / `hosts_progress` / `requests_progress`: bars, yielding their advance callbacks (or None).
    Every line passes `shown()` first: the secrets the view was told of masked, control characters escaped.
    """

    def __init__(self) -> None:
        self._secrets: list[str] = []

    def hide(self, secret: str | None) -> None:
        """Mask `secret` in every line shown from now on (an API key a server may echo)."""
        if secret:
            self._secrets.append(secret)

    def shown(self, text: str) -> str:
        """`text` as one line that may be shown: secrets masked, control characters (line breaks too) escaped."""
        from sparkstack.text import printable

        for secret in self._secrets:
            text = text.replace(secret, "***")
        return printable(text)

    def say(self, line: str) -> None:
        pass

    def note(self, line: str) -> None:
        pass

    def warn(self, line: str) -> None:
        pass

    def out(self, line: str) -> None:
        """A line of the command's output stream itself (JSON lines, one per read)."""

    @contextlib.contextmanager
    def progress(self, label: str, total: int | None, enabled: bool = True) -> Iterator[Callable[[int], None] | None]:
        yield None

    @contextlib.contextmanager
    def hosts_progress(self, totals: dict[str, int]) -> Iterator[Callable[[str, int], None] | None]:
        yield None

    @contextlib.contextmanager
    def requests_progress(self, planned: int) -> Iterator[Callable[[str, int, int], None] | None]:
        yield None

    @contextlib.contextmanager
    def stages(self, rows: list[tuple[str, str]]) -> Iterator[StageRows]:
        """`up`'s rows: (stage, what its plan said) each."""
        yield StageRows()


def _nothing(*_args) -> None:
    return None


@dataclass(frozen=True)
class Command:
    """One command: its request type and its functions. `cli` runs it from options; `up` runs it as a stage."""

    path: tuple[str, ...]  # ("image", "build")
    request: type
    plan: Callable  # (request, environ) -> plan
    apply: Callable  # (plan, view) -> result
    plan_lines: Callable  # (plan) -> lines
    plan_json: Callable  # (plan) -> document
    result_lines: Callable = lambda p, r: []  # (plan, result) -> lines (str, or rich renderables)
    result_json: Callable = lambda p, r: None  # (plan, result) -> document
    failure: Callable = _nothing  # (plan, result or None after a dry run) -> the one line of an exit 1, or None
    warnings: Callable = lambda p: ()  # (plan) -> warnings shown before anything else
    summary: Callable | None = None  # (plan) -> Summary, for the commands that are stages of `up`
    outputs: Callable = lambda p, r: {}  # (plan, result) -> what `up` records of a run
    after_json: Callable = lambda p, r: ()  # (plan, result) -> warnings said after the --json document
    dry: Callable = lambda r: r.dry_run  # (request) -> whether to stop after the plan
    verdict: Callable = _nothing  # (plan) -> checkline.Verdict after a dry run: its last line and its exit code
    cut: Callable = _nothing  # (plan, result) -> a line after a run its own Ctrl-C handling ended early
    on_interrupt: str = " (outputs are published atomically: nothing half-written)"  # said after "interrupted"
    quiet_interrupt: bool = False  # Ctrl-C is how it is quit (top): exit 0, and other stop signals say nothing
    preview: bool = False  # show the plan before applying it (to stderr under --json)
    consent: Callable = lambda p: False  # (plan) -> whether applying it needs a yes (--yes, or one asked for)

    def argv(self, request) -> tuple[str, ...]:
        return argv(self.path, request)

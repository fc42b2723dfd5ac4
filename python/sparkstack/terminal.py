"""What the CLI needs of a terminal: option types that refuse bad values with click's own message, progress
bars on stderr (only on a terminal), rich tables, and a stdout whose reader may go away."""

from __future__ import annotations

import math
import sys

import click
from click.core import ParameterSource

from sparkstack.command import StageRows, View
from sparkstack.errors import UsageError
from sparkstack.text import quoted


class FiniteFloat(click.ParamType):
    """A float in [low, high]: unlike click.FloatRange, also refuses nan and inf (nan passes every comparison)."""

    name = "number"

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            self.fail(f"{value!r} is not a finite number in [{self.low:.10g}, {self.high:.10g}]", param, ctx)
        return number


class OptionalValueCommand(click.Command):
    """click reads `--opt=-1`, for an option whose value may be left out (`flag_value`), as the bare option and then
    an unknown option `-1`: such a value goes to the option's type first, so a bad one gets the type's own message."""

    def parse_args(self, ctx, args):
        ahead = args[:args.index("--")] if "--" in args else args
        for param in self.params:
            if isinstance(param, click.Option) and getattr(param, "_flag_needs_value", False):
                for arg in ahead:
                    name, eq, value = arg.partition("=")
                    if eq and name in param.opts and value.startswith("-"):
                        param.type.convert(value, param, ctx)
        return super().parse_args(ctx, args)


class EnvOption(click.Option):
    """An option an environment variable may set: a bad value from the variable is refused naming the variable,
    which the user may not know is set (HEALTH_INTERVAL='abc' (for --health-interval): ...); a bad value from the
    command line keeps click's own message."""

    def type_cast_value(self, ctx, value):
        try:
            return super().type_cast_value(ctx, value)
        except click.BadParameter as exc:
            if ctx.get_parameter_source(self.name) is not ParameterSource.ENVIRONMENT:
                raise
            raise click.UsageError(f"{self.envvar}={quoted(value)} (for {self.opts[0]}): {exc.message}", ctx) from None


def transfer_bar():
    """A started rich Progress on stderr with bytes, speed and time left; gone when stopped."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=True)
    bar.start()
    return bar


class progress:
    """A rich progress bar on stderr, shown only on a terminal; yields an `advance(n)` callback."""

    def __init__(self, label: str, total: int | None, enabled: bool = True) -> None:
        self.label, self.total = label, total
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        self._bar = transfer_bar()
        task = self._bar.add_task(self.label, total=self.total)  # None: size unknown up front
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

class multi_progress:
    """One rich bar per host and one for the total, on stderr, only on a terminal. Yields advance(host, n)."""

    def __init__(self, totals: dict[str, int]) -> None:
        self.totals = totals
        self.enabled = sys.stderr.isatty() and sum(totals.values()) > 0
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        import threading

        self._bar = transfer_bar()
        tasks = {host: self._bar.add_task(host, total=n) for host, n in self.totals.items()}
        total = self._bar.add_task("total", total=sum(self.totals.values()))
        lock = threading.Lock()

        def advance(host: str, n: int) -> None:
            with lock:  # streams of every host report from their own threads
                self._bar.advance(tasks[host], n)
                self._bar.advance(total, n)

        return advance

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

class Duration(click.ParamType):
    """90s, 30m, 2h, 1h30m: a bare number or a nonsense unit is a usage error."""

    name = "duration"

    def convert(self, value, param, ctx):
        from sparkstack.soak.plan import parse_duration

        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except UsageError as exc:
            self.fail(str(exc), param, ctx)

class IntList(click.ParamType):
    """Comma-separated whole numbers of at least 1, e.g. 1,2,4."""

    name = "N,N,..."

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = [p.strip() for p in str(value).split(",")]
        # ASCII digits only: str.isdigit() takes superscripts and other scripts' digits, which int() may refuse
        if not all(p.isascii() and p.isdigit() and len(p) <= 4 and 1 <= int(p) <= 1024 for p in parts):
            self.fail(f"{value!r} is not a comma-separated list of whole numbers from 1 to 1024", param, ctx)
        return tuple(int(p) for p in parts)


class request_progress:
    """Requests done of planned, per block, on stderr; only on a terminal. Yields on_progress(label, done, planned)."""

    def __init__(self, planned: int, enabled: bool) -> None:
        self.planned = planned
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        self._bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("bench", total=self.planned)
        return lambda label, done, planned: self._bar.update(task, description=label, completed=done, total=planned)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


def print_rich(renderable) -> None:
    from rich.console import Console

    # off a terminal rich would wrap at 80 columns: the tables are wider
    Console(width=None if sys.stdout.isatty() else 200).print(renderable)

class StdoutClosed(Exception):
    """Our stdout's reader went away. Not an OSError, so no error handler mistakes it for a failed operation."""


class GuardedStdout:
    """sys.stdout, but a write to a closed pipe raises StdoutClosed (a broken pipe to ssh or docker stays an error)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise StdoutClosed from None

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            raise StdoutClosed from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


class stage_view(StageRows):
    """`up`'s live view on stderr: one row per stage (waiting, running with its bar, done), on a terminal; off a
    terminal, one line as each stage ends. Lines said by a stage print above the rows."""

    def __init__(self, stages: list[tuple[str, str]]) -> None:
        self.stages = stages  # (name, what the plan said of it)
        self.live = sys.stderr.isatty()
        self._bar = None
        self._tasks: dict[str, int] = {}

    def __enter__(self):
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description:<7}"), TextColumn("{task.fields[state]:<10}"),
                                 BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[note]}"), console=Console(stderr=True))
            self._bar.start()
            for name, planned in self.stages:
                self._tasks[name] = self._bar.add_task(name, total=None, start=False, state="waiting", note=planned)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def started(self, stage: str, total: int | None):
        if self._bar is None:
            click.echo(f"up: {stage}: running", err=True)
            return None
        task = self._tasks[stage]
        self._bar.start_task(task)
        self._bar.update(task, total=total, state="running")
        return lambda n: self._bar.advance(task, n)

    def resize(self, stage: str, total: int | None) -> None:
        if self._bar is not None:
            self._bar.update(self._tasks[stage], total=total)

    def finished(self, run) -> None:
        if self._bar is None:
            if run.outcome != "up to date":
                click.echo(f"up: {run.stage}: {run.outcome}" + (f" in {run.seconds:.1f} s" if run.seconds else ""),
                           err=True)
            return
        task = self._tasks[run.stage]
        self._bar.update(task, state=run.outcome, total=1, completed=1, note=run.detail)
        self._bar.stop_task(task)

    def say(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False)
        else:
            click.echo(line, err=True)


class TerminalView(View):
    """A command's view on this terminal: its story on stdout (stderr under --json, whose stdout is the
    document), notes and warnings on stderr, bars on stderr only on a terminal."""

    def __init__(self, as_json: bool = False) -> None:
        super().__init__()
        self.as_json = as_json

    def say(self, line: str) -> None:
        click.echo(self.shown(line), err=self.as_json)

    def note(self, line: str) -> None:
        click.echo(self.shown(line), err=True)

    def warn(self, line: str) -> None:
        click.echo(f"sparkstack: warning: {self.shown(line)}", err=True)

    def out(self, line: str) -> None:
        click.echo(line)

    def progress(self, label: str, total: int | None, enabled: bool = True):
        return progress(label, total, enabled)

    def stages(self, rows: list[tuple[str, str]]):
        return stage_view(rows)

    def hosts_progress(self, totals: dict[str, int]):
        return multi_progress(totals)

    def requests_progress(self, planned: int):
        return request_progress(planned, enabled=not self.as_json)

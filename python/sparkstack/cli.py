"""The `sparkstack` command: parse options, call plan/apply, render. No logic of its own."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from sparkstack.errors import SparkstackError


def _fail(message: str) -> None:
    click.echo(f"sparkstack: error: {message}", err=True)
    sys.exit(1)


def _warn(message: str) -> None:
    click.echo(f"sparkstack: warning: {message}", err=True)


def one_line_errors(fn):
    """Turn expected failures into one stderr line and exit 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SparkstackError as exc:
            _fail(str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}")
        except KeyboardInterrupt:
            click.echo("sparkstack: interrupted; nothing was published", err=True)
            sys.exit(130)

    return wrapper


def _print_json(doc: object) -> None:
    click.echo(json.dumps(doc, indent=2))


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError("unreachable")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="sparkstack")
def main() -> None:
    """Plan, build, ship and launch GLM-5.3-Flash NVFP4 + DFlash2 on DGX Spark pairs."""


@main.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Output cache entry or dir (default: sibling ...-no-MTP).")
@click.option("--index-only", is_flag=True, help="Edit only config.json and the index; leave shards as they are.")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (and result) as JSON.")
@one_line_errors
def strip(src: Path, out: Path | None, index_only: bool, dry_run: bool, as_json: bool) -> None:
    """Remove the MTP layer from a checkpoint, writing a new cache entry and never touching SRC."""
    from sparkstack.hfcache import no_mtp_destination, resolve_source
    from sparkstack.strip import apply_plan, make_plan

    source = resolve_source(src)
    dest = (out.absolute() if out else no_mtp_destination(source))
    plan = make_plan(source, dest, index_only=index_only)
    for w in plan.warnings:
        _warn(w)
    if dry_run:
        _print_json(plan.to_json()) if as_json else _render_strip_plan(plan)
        return
    total = sum(s.out_size - len(s.new_prefix) for s in plan.shards if s.action == "rewrite")
    with _progress("rewriting shards", total, enabled=not plan.up_to_date and total > 0) as advance:
        result = apply_plan(plan, on_progress=advance)
    if as_json:
        _print_json({"plan": plan.to_json(), "result": result.to_json()})
    elif result.up_to_date:
        click.echo(f"up to date: {result.dest}" + (f" @ {result.revision}" if result.revision else ""))
    else:
        counts = {how: sum(1 for f in result.files if f.how == how) for how in ("rewrite", "link", "copy", "new")}
        click.echo(f"wrote {result.dest}" + (f" @ {result.revision}" if result.revision else ""))
        click.echo("  " + ", ".join(f"{n} {how}" for how, n in counts.items() if n)
                   + f"; {human_bytes(plan.bytes_to_write)} written, {human_bytes(plan.bytes_freed)} freed")


def _render_strip_plan(plan) -> None:
    src = plan.source
    click.echo(f"source: {src.root}" + (f" @ {src.revision}" if src.revision else ""))
    click.echo(f"dest:   {plan.dest.root}" + (" (up to date)" if plan.up_to_date else ""))
    click.echo(f"num_hidden_layers: {plan.num_layers} ({plan.num_layers_source})")
    keys = plan.mtp_keys
    click.echo(f"MTP tensors: {len(keys)}")
    for k in keys[:8]:
        click.echo(f"  {k}")
    if len(keys) > 8:
        click.echo(f"  ... and {len(keys) - 8} more")
    for s in plan.shards:
        detail = f"{human_bytes(s.source.size)}"
        if s.action != "link":
            detail += f" -> {human_bytes(s.out_size)}, drops {len(s.dropped)} tensors"
        click.echo(f"  {s.action:<8} {s.relpath}  {detail}")
    click.echo(f"new files: {', '.join(n for n, _ in plan.new_files)}; carried as links: {len(plan.carried)}")
    click.echo(f"bytes to write: {human_bytes(plan.bytes_to_write)}; bytes freed: {human_bytes(plan.bytes_freed)}")


class _progress:
    """A rich progress bar on stderr, shown only on a terminal; yields an `advance(n)` callback."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total = label, total
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        self._bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(), console=Console(stderr=True),
                             transient=True)
        self._bar.start()
        task = self._bar.add_task(self.label, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


if __name__ == "__main__":
    main()

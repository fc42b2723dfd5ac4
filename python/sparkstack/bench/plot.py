"""The bench's figure as a PNG (matplotlib, Agg): output tok/s and acceptance length against concurrency, one line
per category, and per-position acceptance as bars. Drawn from the JSON document, so flagged cells (withheld
figures) never appear as results."""

from __future__ import annotations

import io
import struct
import tempfile
from pathlib import Path

from sparkstack import fsio, outputs
from sparkstack.errors import UsageError

COMMAND = "sparkstack bench"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_destination(path: Path, command: str = COMMAND) -> None:
    """Before a long run: the PNG must be writable where asked, and replace only a plot `command` wrote."""
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"--plot {path}: no such directory {parent}")
    if path.is_dir():
        raise UsageError(f"--plot {path}: is a directory")
    outputs.claim_file(path, command, png_marker, what="a plot", option="--plot")
    try:  # a directory that looks fine may still refuse files (read-only, /proc): try, as the write will
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise UsageError(f"--plot {path}: cannot write in {parent}: {exc.strerror or exc}") from None


def agg_figure(**kwargs):
    """A matplotlib Figure on the Agg backend (no display, no pyplot state)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def figure_png(fig, command: str = COMMAND) -> bytes:
    """The figure as PNG bytes, marked as written by `command` (png_marker reads it back)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={outputs.WRITTEN_BY: command})
    return buf.getvalue()


def png_marker(path: Path) -> outputs.OutputMarker | None:
    """The marker in a PNG's tEXt chunks (bench writes one); None for any other file."""
    with open(path, "rb") as f:
        if f.read(8) != PNG_SIGNATURE:
            return None
        text = {}
        while head := f.read(8):
            if len(head) < 8:
                break
            size, kind = struct.unpack(">I4s", head)
            if kind == b"IDAT" or size > 1 << 20:  # text chunks we write come before the image data
                break
            data = f.read(size)
            f.read(4)  # crc
            if kind == b"tEXt":
                key, _, value = data.partition(b"\0")
                text[key.decode("latin-1")] = value.decode("latin-1")
    return outputs.marker_from_annotations(text)


def _per_position(cells: list[dict]) -> list[float] | None:
    """Across a category's unflagged cells, weighted by their drafts (each rate is accepted_per_pos / drafts)."""
    rows = [(c["per_position"], c["drafts"]) for c in cells if c["per_position"] and c["drafts"]]
    if not rows:
        return None
    total = sum(d for _, d in rows)
    width = max(len(p) for p, _ in rows)
    return [sum(p[i] * d for p, d in rows if i < len(p)) / total for i in range(width)]


def render_png(doc: dict) -> bytes:
    s = doc["settings"]
    categories = list(s["categories"])
    fig = agg_figure(figsize=(15, 4.8), dpi=100, layout="constrained")
    tok_ax, al_ax, pos_ax = fig.subplots(1, 3, width_ratios=[1, 1, 1.2])
    for cat in categories:
        cells = sorted((c for c in doc["cells"] if c["category"] == cat), key=lambda c: c["concurrency"])
        xs = [c["concurrency"] for c in cells]
        line, = tok_ax.plot(xs, [c["output_tok_s"] for c in cells], marker="o", label=cat)
        tok_ax.plot(xs, [c["per_stream_tok_s"] for c in cells], marker=".", linestyle=":", color=line.get_color())
        al_ax.plot(xs, [c["acceptance_length"] for c in cells], marker="o", label=cat)
    tok_ax.set(title="output tok/s (solid: aggregate, dotted: per stream)", xlabel="concurrency", ylabel="tok/s")
    al_ax.set(title="acceptance length (1 + accepted/drafts)", xlabel="concurrency", ylabel="tokens per step")
    for ax in (tok_ax, al_ax):
        ax.set_xticks(sorted({c["concurrency"] for c in doc["cells"]}))
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    tok_ax.legend(fontsize="small")
    rates = {cat: _per_position([c for c in doc["cells"] if c["category"] == cat]) for cat in categories}
    shown = {cat: r for cat, r in rates.items() if r}
    width = 0.8 / max(1, len(shown))
    for k, (cat, r) in enumerate(shown.items()):
        pos_ax.bar([i + k * width for i in range(len(r))], r, width=width, label=cat)
    npos = max((len(r) for r in shown.values()), default=0)
    # positions 1..N, as top shows them (the metric's position label counts from 0)
    pos_ax.set_xticks([i + width * (len(shown) - 1) / 2 for i in range(npos)], [str(i + 1) for i in range(npos)])
    pos_ax.set(title="acceptance per draft position (accepted_per_pos / drafts)", xlabel="position",
               ylabel="rate", ylim=(0, 1.05))
    pos_ax.grid(alpha=0.3, axis="y")
    if shown:
        pos_ax.legend(fontsize="small")
    flagged = [f"c={c['concurrency']} {c['category']}" for c in doc["cells"] if c["flags"]]
    title = (f"sparkstack bench · suite v{doc['suite_version']} · {s['url']} · model {s['model']} · "
             f"temperature {s['temperature']} · top_p {s['top_p']} · max_tokens {s['max_tokens']} · "
             f"rounds {s['rounds']}" + (f"\nflagged, not shown: {', '.join(flagged)}" if flagged else ""))
    fig.suptitle(title.replace("$", r"\$"), fontsize="medium")  # a $ in the model name or URL is not mathtext
    return figure_png(fig)


def write_plot(doc: dict, path: Path) -> None:
    fsio.write_atomic(path, render_png(doc))

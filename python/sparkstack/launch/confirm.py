"""The boot lines a recipe expects (its `[boot] expect`: lines the blog confirms by eye), derived where they depend
on the recipe, and judged against the head's log: each one seen, missing, or seen with another value than the one
derived.

Derived: the Eagle3 aux layers from the drafter's config (as vLLM reads them), the NvFp4 MoE backend from the
argv's --moe-backend, the two graph lines only when the argv has no --enforce-eager (EAGER off), and under a KV pin
the pool's GiB (within 1%) and its tokens (the KV plan's, within one block: vLLM counts whole blocks, the plan does
not). The one read is the drafter's config.json in the head's hub; judging is pure. Each judged line gets
preflight's words: pass when seen (with its value), else the recipe's `missing` (fail or warn).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sparkstack.hfcache import snapshot_dir
from sparkstack.launch.bootlines import CONFIRM
from sparkstack.launch.kv import kv_inputs, plan_launch_kv
from sparkstack.launch.plan import LaunchPlan
from sparkstack.recipe.kv import KvPlan
from sparkstack.launch.timeline import message, split_stamp
from sparkstack.units import GIB

_BY_KEY = {c.key: c for c in CONFIRM}
KV_GIB_WITHIN = 0.01  # the pool's GiB against the pin: vLLM prints two decimals of it


@dataclass(frozen=True)
class Expected:
    key: str
    value: str | None  # what the line's value must be; None: any
    text: str  # the line as it should read (its fixed part where the value is not decided)
    missing: str  # fail | warn: what verify makes of it missing
    derived: str = ""  # where the value came from, or why it could not be derived
    within: float | None = None  # a number: how far the boot's may be from `value` and still be it

    def to_json(self) -> dict:
        return {"key": self.key, "expect": self.text, "value": self.value, "missing": self.missing,
                "derived": self.derived, "within": self.within}

    def takes(self, got: str | None) -> bool:
        """Whether a matched line's value is the one expected."""
        if self.value is None:
            return True
        if self.within is None or got is None:
            return got == self.value
        return abs(float(got.replace(",", "")) - float(self.value.replace(",", ""))) <= self.within


def aux_layers(config: dict) -> tuple[int, ...] | None:
    """The aux layer ids vLLM logs for a drafter config (eagle3_utils.get_eagle3_aux_layers_from_config):
    `eagle_aux_hidden_state_layer_ids` as they are, else DFlash's `dflash_config.target_layer_ids` (and a plain
    `target_layer_ids`) each + 1, since DFlash counts the layer whose output it reads, vLLM the one after it."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        dflash = config.get("dflash_config")
        ids = [i + 1 for i in (dflash.get("target_layer_ids") or [])] if isinstance(dflash, dict) else None
    if not ids and config.get("target_layer_ids"):
        ids = [i + 1 for i in config["target_layer_ids"]]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    return tuple(ids)


def expectations(keys: tuple[str, ...], missing: str, engine_argv: list[str], drafter_config: dict | None,
                 drafter_note: str = "", kv: KvPlan | None = None, block_size: int = 0) -> tuple[Expected, ...]:
    """The recipe's expected lines for this argv and its KV plan (pure). A graph line under --enforce-eager is
    left out."""
    eager = "--enforce-eager" in engine_argv
    out = []
    for key in keys:
        line = _BY_KEY[key]
        if line.graphs_only and eager:
            continue
        value, derived, within = None, "", None
        if key == "kv-cache-memory" and kv is not None and kv.kv_bytes is not None:
            gib = kv.kv_bytes / GIB
            value, within = f"{gib:.2f}", round(gib * KV_GIB_WITHIN, 4)
            derived = f"the pin {kv.kv_bytes:,} B = {gib:.4f} GiB, within 1%"
        elif key == "kv-cache-memory":
            derived = "no KV pin: the profiler sizes the pool, any GiB"
        elif key == "kv-cache-size" and kv is not None and kv.tokens is not None:
            value, within = f"{kv.tokens:,}", float(block_size)
            derived = (f"the KV plan: {kv.kv_bytes:,} B at {kv.per_token_bytes:,.2f} B per token, within one "
                       f"{block_size}-token block (vLLM counts whole blocks)")
        elif key == "kv-cache-size":
            derived = "no KV pin (or no measured per-token cost): any tokens"
        elif key == "eagle3-aux-layers":
            layers = aux_layers(drafter_config) if drafter_config is not None else None
            if layers is not None:
                value, derived = str(layers), "the drafter's config"
            else:
                derived = drafter_note or "the drafter's config names no aux layers: any layers"
        elif key == "nvfp4-moe-backend" and "--moe-backend" in engine_argv[:-1]:
            value = engine_argv[engine_argv.index("--moe-backend") + 1].upper()
            derived = "--moe-backend"
        text = line.sample.format(value=value) if value is not None else line.shown
        if key == "nvfp4-moe-backend" and value is not None:
            text = f"Using '{value}' NvFp4 MoE backend"
        out.append(Expected(key, value, text, missing, derived, within))
    return tuple(out)


def drafter_config(plan: LaunchPlan) -> tuple[dict | None, str]:
    """The drafter's config.json from the head's hub (the snapshot the argv serves), and a note when it is not read."""
    drafter = next((s for s in plan.served if s.label == "drafter"), None)
    if drafter is None or drafter.revision is None:
        return None, "no drafter snapshot in the head's hub: aux layers not derived"
    path = snapshot_dir(plan.deployment.local_hub / drafter.cache_name, drafter.revision) / "config.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None, f"{path} not readable: aux layers not derived"
    return (doc, "") if isinstance(doc, dict) else (None, f"{path} is not a JSON object: aux layers not derived")


def plan_expectations(plan: LaunchPlan) -> tuple[Expected, ...]:
    boot = plan.recipe.boot
    if not boot.expect:
        return ()
    config, note = drafter_config(plan) if "eagle3-aux-layers" in boot.expect else (None, "")
    return expectations(boot.expect, boot.missing, list(plan.ranks[0].engine_argv), config, note,
                        plan_launch_kv(plan), kv_inputs(plan).block_size)


@dataclass(frozen=True)
class Confirmed:
    expected: Expected
    status: str  # seen | missing | differs (the line is there with another value)
    line: str | None  # the message that matched, without vLLM's prefix

    @property
    def verdict(self) -> str:
        """Preflight's word for it: pass when seen, else what the recipe makes of it (fail or warn)."""
        return "pass" if self.status == "seen" else self.expected.missing

    def to_json(self) -> dict:
        return {**self.expected.to_json(), "status": self.status, "verdict": self.verdict, "line": self.line}


def judge(expected: tuple[Expected, ...], logs: str) -> tuple[Confirmed, ...]:
    """Each expected line against a log (docker's timestamps and vLLM's prefixes allowed): the first match wins,
    except that a match with the derived value beats one with another."""
    messages = [message(split_stamp(raw)[1]) for raw in logs.splitlines()]
    out = []
    for e in expected:
        rx = re.compile(_BY_KEY[e.key].pattern)
        found = None
        for msg in messages:
            m = rx.search(msg)
            if not m:
                continue
            got, text = m.groupdict().get("value"), msg[m.start():]  # the line from where it starts matching
            if e.takes(got):
                found = (text, "seen")
                break
            found = found or (text, "differs")
        out.append(Confirmed(e, found[1] if found else "missing", found[0] if found else None))
    return tuple(out)


def confirm_lines(confirm: list[dict] | None) -> list[str]:
    """The human form of a boot's judged lines (a live boot's or a run record's)."""
    if not confirm:
        return []
    lines = ["expected boot lines:"]
    for c in confirm:
        word = c.get("verdict") or ("pass" if c["status"] == "seen" else c["missing"])  # a record from before verdicts
        if c["status"] == "seen":
            lines.append(f"  {word:<4}  seen: {c['line']}")
        elif c["status"] == "differs":
            lines.append(f"  {word:<4}  differs: expected {c['expect']}{_why(c)}; the boot says {c['line']!r}")
        else:
            lines.append(f"  {word:<4}  missing: {c['expect']}")
    return lines


def _why(c: dict) -> str:
    return f" ({c['derived']})" if c.get("derived") and c.get("value") is not None else ""

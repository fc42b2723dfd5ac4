"""KV calibration (`plan kv --from-boot`): what a boot measured of the KV pool, beside the plan's arithmetic.

The blog's author booted, read `GPU KV cache size: 989,727 tokens` off the log and wrote the figures into the
launcher by hand. Here a boot's measurement comes from one of two places:

- a run record (launch's `write_record`: the latest one, or a file): its boot document holds each rank's timeline
  (`kv_cache_tokens`, `kv_available_gib`) and each rank's `docker_run` argv (the pin, when it set one);
- a raw boot log (`docker logs [--timestamps]` of the head, or a captured file): read line by line through the
  boot-line table (launch/bootlines.py), as the timeline reads it, plus the vLLM version and the pin vLLM echoes
  in its `non-default args: {...}` line.

The pool's tokens are the engine core's `<device> KV cache size: N tokens` line (printed once, by the head, for the
pool the ranks agreed on: the minimum across ranks). The pool's bytes are exact when the boot ran with a pin
(`--kv-cache-memory-bytes`: every rank sizes the pool to it); without one they are the smallest `Available KV cache
memory: X GiB` any rank printed, good to vLLM's two decimals (about 5 MiB).

Pure apart from `read_boot_file`, which reads one local file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from sparkstack.errors import SparkstackError
from sparkstack.launch.kv import argv_kv_bytes
from sparkstack.launch.timeline import message, parse_rank, split_stamp
from sparkstack.units import GIB
from sparkstack.recipe import KvBoot
from sparkstack.recipe.kv import KvPlan

MAX_LOG_BYTES = 512 << 20  # a boot log is a few MB; anything larger is not one
POOL_PIN = "pin"  # the argv's --kv-cache-memory-bytes: exact
POOL_PROFILED = "profiled"  # the smallest `Available KV cache memory: X GiB`: to 0.01 GiB

# Where a log names its vLLM version: the engine core's config line (0.10 on), the API server's start line (older
# builds), 0.32's banner (`█  version 0.32.0` at the end of its block-letter line).
_VERSION = (
    re.compile(r"Initializing a V1 LLM engine \(v(?P<v>[0-9]+\.[0-9]+[\w.+-]*)\) with config"),
    re.compile(r"vLLM API server version (?P<v>[0-9]+\.[0-9]+[\w.+-]*)"),
    re.compile(r"\u2588\s+version (?P<v>[0-9]+\.[0-9]+\.[0-9]+[\w.+-]*)\s*$"),
)
_NON_DEFAULT_PIN = re.compile(r"non-default args: \{.*'kv_cache_memory_bytes': (?P<b>[0-9]{1,19})\b")
_DATE = re.compile(r"^(\d{4}-\d\d-\d\d)T")


@dataclass(frozen=True)
class BootMeasure:
    """One boot's KV figures as it measured them."""

    source: str  # "run <id>" or the log file's path
    tokens: int | None  # `<device> KV cache size: N tokens`
    pool_bytes: int | None
    pool: str | None  # POOL_PIN or POOL_PROFILED; None when the bytes are unknown
    available_gib: float | None  # the smallest `Available KV cache memory` (or the CPU build's KV space)
    ranks: tuple[int, ...] = ()  # the ranks whose lines were read (a log file: rank 0 stands for "this log")
    vllm_version: str | None = None
    image_id: str | None = None
    run_id: str | None = None
    booted_at: str | None = None  # ISO date-time (a record's started_at) or date (a log's first stamp)
    fatal: str | None = None  # the fatal boot line, when the boot died (then there is no pool)

    @property
    def per_token_bytes(self) -> float | None:
        return round(self.pool_bytes / self.tokens, 2) if self.pool_bytes and self.tokens else None

    def to_json(self) -> dict:
        return {"source": self.source, "tokens": self.tokens, "pool_bytes": self.pool_bytes, "pool": self.pool,
                "available_gib": self.available_gib, "per_token_bytes": self.per_token_bytes,
                "ranks": list(self.ranks), "vllm_version": self.vllm_version, "image_id": self.image_id,
                "run_id": self.run_id, "booted_at": self.booted_at, "fatal": self.fatal}

    def require(self) -> BootMeasure:
        """This measure, or the one line saying why it holds no KV pool."""
        if self.tokens is not None:
            return self
        if self.fatal:
            raise SparkstackError(f"{self.source}: the boot died before its KV pool was sized: {self.fatal}")
        raise SparkstackError(f"{self.source}: no `KV cache size: N tokens` line: not the log or record of a boot "
                              "that got as far as sizing its KV pool")


def _pool(pin: int | None, gib: float | None) -> tuple[int | None, str | None]:
    if pin is not None:
        return pin, POOL_PIN
    if gib is not None:
        return round(gib * GIB), POOL_PROFILED
    return None, None


def measure_log(text: str, source: str) -> BootMeasure:
    """The KV figures of a raw boot log (one container's output, with or without docker's timestamps)."""
    tl = parse_rank(0, text, 0.0)
    version = pin = date = None
    for raw in text.splitlines():
        stamp, line = split_stamp(raw)
        if date is None and stamp is not None:
            m = _DATE.match(raw)
            date = m[1] if m else None
        msg = message(line)
        if version is None:
            version = next((m["v"] for rx in _VERSION if (m := rx.search(msg))), None)
        if pin is None and (m := _NON_DEFAULT_PIN.search(msg)):
            pin = int(m["b"])
    pool_bytes, pool = _pool(pin, tl.kv_gib)
    return BootMeasure(source, tl.kv_tokens, pool_bytes, pool, tl.kv_gib, (0,), version, None, None, date,
                       tl.fatal.text if tl.fatal else None)


def measure_record(record: dict, source: str | None = None) -> BootMeasure:
    """The KV figures of a launch run record (launch/apply.py's write_record). A record of a head that was never
    started (`launch 1`) holds no boot: tokens None."""
    rid = record.get("id")
    where = source or f"run {rid}"
    boot = record.get("boot")
    if not isinstance(boot, dict):
        return BootMeasure(where, None, None, None, None, run_id=rid, image_id=record.get("image_id"),
                           booted_at=record.get("started_at"))
    timeline = [t for t in boot.get("timeline") or [] if isinstance(t, dict)]
    tokens = next((t["kv_cache_tokens"] for t in timeline if isinstance(t.get("kv_cache_tokens"), int)), None)
    gibs = [t["kv_available_gib"] for t in timeline if isinstance(t.get("kv_available_gib"), (int, float))]
    fatal = next((t["fatal"]["line"] for t in timeline if isinstance(t.get("fatal"), dict)), None)
    head = next((r for r in record.get("ranks") or [] if isinstance(r, dict) and r.get("rank") == 0), None)
    try:
        pin = argv_kv_bytes(head["docker_run"]) if head and isinstance(head.get("docker_run"), list) else None
    except SparkstackError:
        pin = None
    gib = min(gibs) if gibs else None
    pool_bytes, pool = _pool(pin, gib)
    return BootMeasure(where, tokens, pool_bytes, pool, gib, tuple(t.get("rank") for t in timeline), None,
                       record.get("image_id"), rid, record.get("started_at"), fatal)


def read_boot_file(path: Path) -> BootMeasure:
    """A run record (JSON with a "boot") or a raw boot log, by its content."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise SparkstackError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_LOG_BYTES:
        raise SparkstackError(f"{path}: larger than {MAX_LOG_BYTES >> 20} MiB: not a boot log or run record")
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict) and "boot" in doc:
            return measure_record(doc, str(path))
    return measure_log(text, str(path))


# Why a boot's pool has no bytes, and the two ways to get them: what a user can act on.
UNSTATED_POOL = ("its argv pins no --kv-cache-memory-bytes and its log holds no `Available KV cache memory: N GiB` "
                 "line; boot with a pin (KV_CACHE_MEMORY=BYTES), or give the head's whole `docker logs` from the "
                 "boot's start, not a --tail")


@dataclass(frozen=True)
class Calibration:
    """The plan's arithmetic (recipe/kv.py, at the plan's pin) beside a boot's measurement."""

    plan: KvPlan
    measured: BootMeasure

    @property
    def ratio(self) -> float | None:
        """Measured tokens over planned tokens."""
        if self.plan.tokens and self.measured.tokens is not None:
            return round(self.measured.tokens / self.plan.tokens, 4)
        return None

    @property
    def same_pool(self) -> bool | None:
        """Whether the boot's pool is the plan's pin (then the two token counts answer the same question)."""
        if self.measured.pool_bytes is None or self.plan.kv_bytes is None:
            return None
        if self.measured.pool == POOL_PIN:
            return self.measured.pool_bytes == self.plan.kv_bytes
        return abs(self.measured.pool_bytes - self.plan.kv_bytes) <= GIB // 200  # within the GiB figure's rounding

    @property
    def predicted_tokens(self) -> int | None:
        """What the recipe's per-token cost gives for the pool the boot measured."""
        if self.measured.pool_bytes is None or not self.plan.per_token_bytes:
            return None
        return int(self.measured.pool_bytes / self.plan.per_token_bytes)

    def to_json(self) -> dict:
        return {"plan": self.plan.to_json(), "measured": self.measured.to_json(), "ratio": self.ratio,
                "same_pool": self.same_pool, "predicted_tokens": self.predicted_tokens}

    def lines(self) -> list[str]:
        p, m = self.plan, self.measured
        if p.tokens is None:
            why = "no KV bytes given" if p.kv_bytes is None else "no measured per-token cost in the recipe"
            plan = f"plan:     tokens unknown ({why})"
        else:
            plan = (f"plan:     {p.kv_bytes:,} B / {p.per_token_bytes:,.2f} B per token = {p.tokens:,} tokens "
                    "(the recipe's arithmetic)")
        if m.pool_bytes is None:
            pool = f"a pool of bytes this boot never stated ({UNSTATED_POOL})"
        elif m.pool == POOL_PIN:
            pool = f"a pool of {m.pool_bytes:,} B (the argv's pin, exact) = {m.per_token_bytes:,.2f} B per token"
        else:
            pool = (f"a pool of {m.pool_bytes:,} B (profiled: {m.available_gib:g} GiB, the smallest any rank "
                    f"printed) = {m.per_token_bytes:,.2f} B per token")
        where = ", ".join(x for x in (m.source, f"vLLM {m.vllm_version}" if m.vllm_version else "",
                                      m.booted_at or "") if x)
        lines = [plan, f"measured: {m.tokens:,} tokens in {pool} ({where})"]
        if self.ratio is not None:
            lines.append(f"measured / planned: {self.ratio:.4f} ({(self.ratio - 1) * 100:+.2f} %)")
        if self.same_pool is False and self.predicted_tokens is not None:
            lines.append(f"note: the boot's pool is not the plan's pin ({p.kv_bytes:,} B): at the recipe's per-token "
                         f"cost its {m.pool_bytes:,} B buy about {self.predicted_tokens:,} tokens; it measured "
                         f"{m.tokens:,}")
        return lines


def calibrate(plan: KvPlan, measured: BootMeasure) -> Calibration:
    """The plan beside the boot; a measure without a KV pool is the one-line error saying why."""
    return Calibration(plan, measured.require())


def kv_boot_entry(measured: BootMeasure, date: str) -> KvBoot:
    """What `--write` records in the recipe's [kv.boot]; `date` is the day of the calibration (YYYY-MM-DD)."""
    m = measured.require()
    if m.pool_bytes is None:
        raise SparkstackError(f"{m.source}: nothing to calibrate against: the boot never stated its KV pool's bytes "
                              f"({UNSTATED_POOL})")
    return KvBoot(tokens=m.tokens, pool_bytes=m.pool_bytes, pool=m.pool, source=m.source, date=date,
                  vllm_version=m.vllm_version, image_id=m.image_id)

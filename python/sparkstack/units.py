"""Figures rounded and formatted one way for every report: never a NaN or an Infinity (JSON has neither, and
a screen should say n/a), seconds shown as milliseconds."""

from __future__ import annotations

import math

GIB = 1 << 30  # one binary gigabyte: what vLLM and the kernel's meminfo figures are counted in


def finite(value: float | None) -> float | None:
    """The value, or None when it is missing or not finite (NaN, Inf): a figure that cannot be shown."""
    return value if value is not None and math.isfinite(value) else None


def rounded(value: float | None, digits: int = 4) -> float | None:
    """The value rounded to `digits`; None when missing or not finite."""
    value = finite(value)
    return None if value is None else round(value, digits)


def ms(seconds: float | None, digits: int = 0, missing: str = "n/a") -> str:
    """Seconds as milliseconds, `digits` after the point; `missing` when missing or not finite."""
    seconds = finite(seconds)
    return missing if seconds is None else f"{seconds * 1000:.{digits}f}"


def human_bytes(n: int, largest: str = "TiB") -> str:
    """A byte count in binary units, one decimal (`12 B`, `1.5 GiB`), going no higher than `largest`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == largest:
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError(f"unknown unit {largest!r}")

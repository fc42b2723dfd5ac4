"""TEMPORARY: `printable` until the lead's sparkstack.endpoint.client.printable reaches main; then this module
goes and its callers import that name from endpoint.client."""

from __future__ import annotations

try:
    from .endpoint.client import printable
except ImportError:  # not on main yet
    def printable(text: str) -> str:
        """Server text made safe for a terminal: every control or non-printable character escaped."""
        return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))

__all__ = ["printable"]

"""Untrusted text (a server's reply, a file's bytes, a user's value) made safe for one line of a terminal.

Every message that quotes such text goes through here, so an escape sequence cannot repaint the terminal and a
newline cannot forge a second line (an extra `pass` line, say) in a report.
"""

from __future__ import annotations

import reprlib


def printable(text: object) -> str:
    """str(text) with every character str.isprintable() refuses, except the plain space, written as its Python
    escape: controls (C0 and C1, so ESC and newlines too), invisible format marks, line and paragraph separators,
    other spaces, lone surrogates, private-use and unassigned code points. The result is one line."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in str(text))


def quoted(value: object, limit: int = 60) -> str:
    """A value as it appears inside a one-line message: its repr (quoted, escaped), cut short, since a hostile
    value may be megabytes long. A string is cut before it is quoted, so its closing quote stays."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    text = printable(_brief_repr(limit).repr(value))  # an object's own repr may hold anything
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _brief_repr(limit: int) -> reprlib.Repr:
    """reprlib, so a parsed document's megabyte list is not written out in full only to be cut."""
    brief = reprlib.Repr()
    brief.maxstring = brief.maxother = brief.maxlong = limit
    brief.maxlist = brief.maxtuple = brief.maxdict = brief.maxset = 6
    brief.maxlevel = 2
    return brief

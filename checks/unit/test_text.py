"""text.printable and text.quoted: hostile text comes out as one line of printable characters."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkstack.text import printable, quoted

HOSTILE = {
    "newline": ("a\nb", "a\\nb"),
    "carriage return": ("ok\rFAIL", "ok\\rFAIL"),
    "ansi escape": ("\x1b[2J\x1b[31mred", "\\x1b[2J\\x1b[31mred"),
    "c1 control (CSI)": ("a\x9b31mb", "a\\x9b31mb"),
    "next line (NEL)": ("a\x85b", "a\\x85b"),
    "line separator": ("a\u2028b", "a\\u2028b"),
    "paragraph separator": ("a\u2029b", "a\\u2029b"),
    "bidi override": ("a\u202eb", "a\\u202eb"),
    "lone surrogate": ("a\ud800b", "a\\ud800b"),
    "NUL": ("a\0b", "a\\x00b"),
    "tab": ("a\tb", "a\\tb"),
    "no-break space": ("a\xa0b", "a\\xa0b"),
}


@pytest.mark.parametrize("hostile, shown", HOSTILE.values(), ids=HOSTILE.keys())
def test_printable_escapes(hostile, shown):
    assert printable(hostile) == shown


def test_printable_keeps_plain_text():
    assert printable("GLM-5.3 naïve 模型 /a b/c") == "GLM-5.3 naïve 模型 /a b/c"
    assert printable(ValueError("bad\nthing")) == "bad\\nthing"  # anything str() takes


@given(st.text())
def test_printable_is_one_printable_line(text):
    shown = printable(text)
    assert all(c.isprintable() or c == " " for c in shown)
    shown.encode("utf-8")  # no lone surrogate survives


def test_quoted_cuts_strings_before_quoting():
    assert quoted("x\ny") == "'x\\ny'"
    assert quoted("a" * 100, 10) == "'aaaaaaaaaa'..."


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_quoted_is_short_and_printable(value):
    shown = quoted(value, 40)
    assert all(c.isprintable() or c == " " for c in shown)
    if not isinstance(value, str):
        assert len(shown) <= 40


def test_quoted_escapes_an_objects_own_repr():
    class Loud:
        def __repr__(self):
            return "\x1b[2Jok\nFAIL"

    assert quoted(Loud()) == "\\x1b[2Jok\\nFAIL"

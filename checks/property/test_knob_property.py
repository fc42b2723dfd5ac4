"""Any value in any knob: the launcher either plans (its verdict the one stderr line, exit 0 or 1 by that verdict)
or refuses with one error line (exit 1), never a traceback.

In-process with click's CliRunner for speed; catch_exceptions=False lets a traceback fail the test.
"""

import json
import sys
import unicodedata

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkstack.cli import main
from sparkstack.recipe import KNOB_DEFAULTS

# Text an environment variable can hold: anything but NUL; lone surrogates only as the escapes of
# undecodable bytes (what Python makes of a non-UTF-8 byte in the environment).
ENV_CHAR = st.one_of(st.characters(exclude_categories=("Cs",), exclude_characters="\0"),
                     st.integers(0xDC80, 0xDCFF).map(chr))
HOSTILE = st.one_of(
    st.text(ENV_CHAR, max_size=40),
    st.just(""),
    st.integers(-(2**70), 2**70).map(str),
    st.integers(0, 6000).map(lambda n: "9" * n),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(ENV_CHAR, max_size=20).map(lambda s: "-" + s),
    st.text(ENV_CHAR, max_size=20).map(lambda s: "--" + s),
    st.sampled_from(["{rank}", "{", "}", "{0}", "{rank.x}", "/a:/etc", "~", "~root", "0", "1", "65535", "65536",
                     "0.0", "1.0", "1e3", "+1", " 1", "1\n", "\u202e", "\u2028", "８", "10.0.0.2", "::1",
                     "a b", "$(id)", "`id`", "%s%n", "\\", "'", '"']),
)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")


def check_plans_or_refuses_naming(knob, value, hf_home):
    env = {k: None for k in KNOB_DEFAULTS} | {"VLLM_API_KEY": None, "HF_HOME": str(hf_home), knob: value}
    result = CliRunner().invoke(main, ["launch", "0", "--dry-run", "--json", "--host-root", str(hf_home)], env=env,
                                catch_exceptions=False)
    lines = result.stderr.splitlines()
    if len(lines) == 1 and lines[0].startswith("preflight: "):  # planned: the verdict is the only stderr line
        assert result.exit_code == (0 if lines[0].endswith("would start") else 1), (knob, value, result.stderr)
        argv = json.loads(result.stdout)["docker_run"]
        # Whatever was accepted cannot pose as an option or smuggle a line break into the argv.
        assert not (value.startswith("-") and value in argv), (knob, value)
        assert not any("\n" in a or "\0" in a for a in argv), (knob, value)
    else:
        assert result.exit_code == 1, (knob, value, result.exit_code, result.stderr)
        assert len(lines) == 1 and result.stderr.endswith("\n"), (knob, value, result.stderr)
        assert lines[0].startswith("sparkstack: error: ") and knob in lines[0], (knob, value, lines)
        assert "Traceback" not in result.stderr


def first_of_each_category() -> dict[str, str]:
    """The lowest code point of every Unicode general category (NUL aside: no environment holds it). A lone
    surrogate reaches the environment only as an undecodable byte's escape (U+DC80..U+DCFF), so Cs is that."""
    found = {}
    for cp in range(1, sys.maxunicode + 1):
        found.setdefault(unicodedata.category(chr(cp)), chr(cp))
    found["Cs"] = "\udc80"
    return found


CHARACTER_CLASSES = first_of_each_category()


def test_the_classes_cover_every_category():
    # 30 general categories in Unicode; a lost one would quietly shrink the test below.
    assert set(CHARACTER_CLASSES) == {
        "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po",
        "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"}


@pytest.mark.parametrize("knob", sorted(KNOB_DEFAULTS))
def test_every_character_class_plans_or_is_refused_naming_the_knob(knob, hf_home):
    """Deterministic twin of the property test below: every knob, each character class alone and inside a
    plausible value (CI's failing draw was WORKER_SSH='\ud7fc', an unassigned code point)."""
    default = KNOB_DEFAULTS[knob] or "x"
    for category, char in CHARACTER_CLASSES.items():
        for value in (char, default + char, char + default):
            check_plans_or_refuses_naming(knob, value, hf_home)


def test_an_unassigned_code_point_in_the_ssh_target_is_refused_naming_the_knob(hf_home):
    env = {k: None for k in KNOB_DEFAULTS} | {"VLLM_API_KEY": None, "HF_HOME": str(hf_home), "WORKER_SSH": "\ud7fc"}
    result = CliRunner().invoke(main, ["launch", "all", "--dry-run", "--host-root", str(hf_home)], env=env)
    assert result.exit_code == 1
    assert result.stderr == ("sparkstack: error: environment variable WORKER_SSH='\\ud7fc' holds the unassigned "
                             "code point '\\ud7fc'\n")


@pytest.mark.parametrize("knob", sorted(KNOB_DEFAULTS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE)
def test_any_value_plans_or_is_refused_in_one_line(knob, value, hf_home):
    check_plans_or_refuses_naming(knob, value, hf_home)

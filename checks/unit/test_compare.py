"""`sparkstack compare A.json B.json` on synthetic bench documents (the --json contract), and on a real pair."""

import json
import re

import pytest
from inprocess_engine import serving

SETTINGS = {"url": "http://127.0.0.1:8888", "model": "m", "concurrency": [1], "rounds": 3, "max_tokens": 512,
            "temperature": 1.0, "top_p": 0.95, "categories": ["code"]}


def cell(concurrency, category, tok, length, steps, flags=()):
    """A contract cell whose three per-round figures are the means of the given rounds."""
    def mean(xs):
        return sum(xs) / len(xs)

    withheld = bool(flags)
    doc = {"concurrency": concurrency, "category": category, "output_tok_s": None if withheld else mean(tok),
           "per_stream_tok_s": None, "ttft_first_chunk_p50_s": None, "ttft_content_p50_s": None,
           "ttft_content_p95_s": None, "itl_p50_s": None, "itl_p95_s": None, "itl_p99_s": None, "tpot_p50_s": None,
           "errors": 0, "drafts": 100, "draft_tokens": 400, "accepted_tokens": 175,
           "acceptance_length": None if withheld else mean(length), "per_position": None,
           "steps_per_s": None if withheld else mean(steps),
           "rounds": [{"output_tok_s": t, "acceptance_length": a, "steps_per_s": s} for t, a, s in
                      zip(tok, length, steps)],
           "flags": list(flags)}
    return doc


def write(path, cells, version="1", **settings):
    path.write_text(json.dumps({"suite_version": version, "settings": {**SETTINGS, **settings}, "cells": cells}))
    return path


@pytest.fixture
def pair(tmp_path):
    # tok/s: A's rounds span 4, B's 2, B is 20 higher: beyond both spreads.
    # acceptance length: A spans 0.10, B 0.12, B is 0.03 higher: within them.
    a = write(tmp_path / "a.json", [cell(1, "code", [98, 100, 102], [2.70, 2.75, 2.80], [9.0, 9.1, 9.2]),
                                    cell(2, "code", [150, 160, 170], [2.7, 2.7, 2.7], [8.0, 8.0, 8.0])])
    b = write(tmp_path / "b.json", [cell(1, "code", [119, 120, 121], [2.72, 2.78, 2.84], [9.0, 9.1, 9.2]),
                                    cell(2, "code", [150, 160, 170], [1.0, 1.0, 1.0], [8, 8, 8],
                                         flags=["spec_decode_collapse"])])
    return a, b


def test_changes_beyond_the_rounds_spread_are_marked(run_cli, pair):
    proc = run_cli("compare", *pair, "--json", check=0)
    doc = json.loads(proc.stdout)
    first, second = doc["cells"]
    tok, length = first["figures"]["output_tok_s"], first["figures"]["acceptance_length"]
    assert tok["change"] == pytest.approx(20) and tok["change_pct"] == pytest.approx(20)
    assert (tok["spread_a"], tok["spread_b"]) == (4, 2) and tok["exceeds_spread"] is True
    assert length["change"] == pytest.approx(0.03) and length["spread_b"] == pytest.approx(0.12)
    assert length["exceeds_spread"] is False
    assert first["figures"]["steps_per_s"]["change"] == pytest.approx(0) and \
        first["figures"]["steps_per_s"]["exceeds_spread"] is False
    # a flagged cell's figures are withheld: no change is claimed
    assert second["flags_b"] == ["spec_decode_collapse"]
    assert second["figures"]["output_tok_s"]["change"] is None
    assert second["figures"]["output_tok_s"]["exceeds_spread"] is None


def test_the_table_marks_them(run_cli, pair):
    out = run_cli("compare", *pair, check=0).stdout
    row = next(line for line in out.splitlines() if line.startswith("│    1"))
    assert "100.0 → 120.0" in row and "+20.0% *" in row and "2.75 → 2.78" in row and "+1.1% ~" in row
    row2 = next(line for line in out.splitlines() if line.startswith("│    2"))
    assert "- ?" in row2 and "spec_decode_collapse" in row2
    assert "A: url http://127.0.0.1:8888" in out and "temperature 1.0 · top_p 0.95" in out


def test_different_settings_are_said(run_cli, tmp_path, pair):
    b = write(tmp_path / "cold.json", json.loads(pair[1].read_text())["cells"], temperature=0.0)
    proc = run_cli("compare", pair[0], b, check=0)
    assert "sparkstack: warning: settings differ: temperature 1.0 -> 0.0" in proc.stderr


def test_different_suite_versions_are_refused(run_cli, tmp_path, pair):
    b = write(tmp_path / "v2.json", json.loads(pair[1].read_text())["cells"], version="2")
    proc = run_cli("compare", pair[0], b)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sparkstack: error: suite versions differ") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("cells", [
    [cell(1, "code", [1, 1, 1], [2, 2, 2], [1, 1, 1])],
    [cell(1, "code", [1, 1, 1], [2, 2, 2], [1, 1, 1]), cell(4, "code", [1, 1, 1], [2, 2, 2], [1, 1, 1])],
    [cell(2, "code", [1, 1, 1], [2, 2, 2], [1, 1, 1]), cell(1, "code", [1, 1, 1], [2, 2, 2], [1, 1, 1])],
])
def test_different_shapes_are_refused(run_cli, tmp_path, pair, cells):
    proc = run_cli("compare", pair[0], write(tmp_path / "other.json", cells))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sparkstack: error: the runs have different shapes") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("text,says", [
    ("not json", "not JSON"),
    ("[]", "suite_version"),
    ('{"suite_version": "1", "settings": {}, "cells": []}', "settings"),
    (json.dumps({"suite_version": "1", "settings": SETTINGS, "cells": [{"concurrency": 1}]}), "cells[0]: no 'category'"),
    (json.dumps({"suite_version": "1", "settings": SETTINGS,
                 "cells": [{**cell(1, "code", [1], [2], [3]), "output_tok_s": "fast"}]}), "not a number"),
    (json.dumps({"suite_version": "1", "settings": SETTINGS, "cells": [cell(1, "code", [1], [2], [3])] * 2}), "twice"),
])
def test_a_file_that_is_not_a_bench_report_is_one_line(run_cli, tmp_path, pair, text, says):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    proc = run_cli("compare", pair[0], bad)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert says in proc.stderr and str(bad) in proc.stderr


def test_a_missing_file_is_one_line(run_cli, tmp_path, pair):
    proc = run_cli("compare", pair[0], tmp_path / "absent.json")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "absent.json" in proc.stderr


def test_two_real_runs_compare(run_cli, tmp_path):
    with serving(cycles=1, step_delay=0.02) as engine:
        for name in ("a", "b"):
            proc = run_cli("bench", engine.url, "--json", "--concurrency", "1,2", "--rounds", "2", "--category",
                           "json")
            (tmp_path / f"{name}.json").write_text(proc.stdout)
    doc = json.loads(run_cli("compare", tmp_path / "a.json", tmp_path / "b.json", "--json", check=0).stdout)
    assert [(c["concurrency"], c["category"]) for c in doc["cells"]] == [(1, "json"), (2, "json")]
    for c in doc["cells"]:
        if not (c["flags_a"] or c["flags_b"]):  # same pattern both times: acceptance does not move
            assert c["figures"]["acceptance_length"]["change"] == 0
            assert c["figures"]["acceptance_length"]["exceeds_spread"] is False


@pytest.mark.parametrize("change,says", [
    ({"settings": {**SETTINGS, "concurrency": 5}}, "settings.concurrency: not a list of whole numbers"),
    ({"settings": {**SETTINGS, "categories": None}}, "settings.categories: not a list of texts"),
    ({"settings": {**SETTINGS, "rounds": True}}, "settings.rounds: not a whole number"),
    ({"cells": [{**cell(1, "code", [1], [2], [3]), "output_tok_s": 10 ** 400}]}, "cells[0].output_tok_s: not a number"),
    ({"cells": [{**cell(1, "code", [1], [2], [3]), "drafts": 1e300}]}, "cells[0].drafts: not a number"),
    ({"cells": [{**cell(1, "code", [1], [2], [3]), "flags": [7]}]}, "cells[0].flags: not a list of texts"),
    ({"cells": [{**cell(1, "code", [1], [2], [3]), "per_position": "high"}]}, "cells[0].per_position"),
    ({"cells": [{**cell(1, "code", [1], [2], [3]), "errors": None}]}, "cells[0].errors: not a whole number"),
])
def test_wrong_types_anywhere_and_huge_numbers_are_not_a_bench_report(run_cli, tmp_path, pair, change, says):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"suite_version": "1", "settings": SETTINGS, "cells": [cell(1, "code", [1], [2], [3])],
                               **change}))
    proc = run_cli("compare", bad, bad)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr and "not a bench report" in proc.stderr


def test_non_finite_figures_are_not_judged_and_never_printed(run_cli, tmp_path):
    a = write(tmp_path / "a.json", [cell(1, "code", [98, 100, 102], [2.7, 2.7, 2.7], [9.0, 9.1, 9.2])])
    doc = json.loads(a.read_text())
    doc["cells"][0]["output_tok_s"] = float("nan")
    doc["cells"][0]["rounds"][0]["steps_per_s"] = float("inf")
    b = tmp_path / "b.json"
    b.write_text(json.dumps(doc))  # json writes NaN and Infinity
    proc = run_cli("compare", a, b, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "NaN" not in proc.stdout and "Infinity" not in proc.stdout
    figs = json.loads(proc.stdout)["cells"][0]["figures"]
    assert figs["output_tok_s"]["b"] is None and figs["output_tok_s"]["exceeds_spread"] is None
    assert figs["steps_per_s"]["spread_b"] == pytest.approx(9.2 - 9.1)  # the infinite round is left out
    table = run_cli("compare", a, b)
    assert re.search(r"100\.0 → - │ +- \? │", table.stdout), table.stdout

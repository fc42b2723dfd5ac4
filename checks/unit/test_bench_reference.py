"""The published figures as a reference (recipes/<name>/reference.toml, bench/reference.py): the shipped file holds
the blog's published figures (its serving numbers, acceptance, count ceiling and KV pool) with their conditions; a bad file is one line; hand-built bench reports are set beside it,
steps/s and acceptance apart, the count category judged against its ceiling."""

from pathlib import Path

import pytest

from sparkstack.bench.compare import read_report
from sparkstack.bench.reference import (
    Served,
    compare_reference,
    find_reference,
    load_reference,
    served_from_knobs,
)
from sparkstack.errors import SparkstackError

RECIPE = "glm53-flash-dflash2-nvfp4"


def cell(category: str, concurrency: int = 1, *, steps=9.2, al=2.6, pos=(0.7, 0.45, 0.28, 0.2), tok=24.0,
         rounds=((9.0, 2.5, 23.0), (9.4, 2.7, 25.0)), flags=()) -> dict:
    """One contract cell (bench/report.py's Cell.to_json), figures given by hand."""
    flagged = bool(flags)
    return {"concurrency": concurrency, "category": category, "output_tok_s": None if flagged else tok,
            "per_stream_tok_s": None if flagged else tok, "ttft_first_chunk_p50_s": 0.2, "ttft_content_p50_s": 0.3,
            "ttft_content_p95_s": 0.4, "itl_p50_s": 0.1, "itl_p95_s": 0.2, "itl_p99_s": 0.3, "tpot_p50_s": 0.04,
            "errors": 0, "drafts": 100, "draft_tokens": 400, "accepted_tokens": 160,
            "acceptance_length": None if flagged else al, "per_position": None if flagged else list(pos),
            "steps_per_s": None if flagged else steps,
            "rounds": [{"steps_per_s": s, "acceptance_length": a, "output_tok_s": t} for s, a, t in rounds],
            "server_timing": None, "timing_notes": [], "sampled_tokens": 0, "implausible_tokens": 0,
            "flags": list(flags)}


def report(*cells, temperature=1.0) -> dict:
    cats = list(dict.fromkeys(c["category"] for c in cells))
    conc = sorted({c["concurrency"] for c in cells})
    return {"suite_version": "1", "salt": "ab12cd34", "cells": list(cells),
            "settings": {"url": "http://127.0.0.1:8888", "model": "m", "concurrency": conc, "rounds": 2,
                         "max_tokens": 512, "temperature": temperature, "top_p": 0.95, "categories": cats}}


COUNT_GOOD = dict(steps=9.6, al=4.87, pos=(1.0, 0.99, 0.96, 0.92), tok=46.8,
                  rounds=((9.5, 4.86, 46.2), (9.7, 4.88, 47.3)))


def test_the_shipped_reference_holds_the_blogs_figures():
    ref = find_reference(RECIPE)
    by = {(f.figure, f.n, f.graphs, f.category): f for f in ref.figures}
    assert by[("steps_per_s", 4, True, "real traffic")].value == 9.3
    assert by[("steps_per_s", 4, False, "real traffic")].value == 9.1
    assert by[("steps_per_s", 7, False, "real traffic")].value == 7.5
    assert by[("output_tok_s", 4, True, "real traffic")].value == 25.0
    assert by[("per_position", 4, None, "count")].values == (1.0, 0.99, 0.97, 0.94)
    assert by[("per_position", 4, None, "real traffic")].values == (0.70, 0.46, 0.29, 0.22)
    assert by[("acceptance_length", 4, None, "count")].value == 4.89
    count_tok = by[("output_tok_s", 4, None, "count")]
    assert (count_tok.low, count_tok.high) == (46.5, 47.8)
    kv = [f for f in ref.figures if f.figure == "kv_tokens"]
    assert {(f.value, f.kv_bytes, f.gpu_memory_utilization) for f in kv} == {
        (989727, 10247694336, None), (481488, None, 0.89)}
    assert all(f.source.startswith("the blog's ") for f in ref.figures)
    assert ref.temperature == 1.0 and ref.top_p == 0.95
    assert ref.path.name == "reference.toml" and ref.path.parent.name == RECIPE


def test_a_recipe_without_a_reference_is_one_line():
    with pytest.raises(SparkstackError, match="no reference.toml beside"):
        find_reference("lab-vllm-cpu")


GOOD_FIGURE = 'figure = "steps_per_s"\nvalue = 9.3\nsource = "x"\n'


@pytest.mark.parametrize("body, error", [
    ("version = 2\nrecipe = 'r'\ntitle = 't'\n[[figures]]\n" + GOOD_FIGURE, "version must be 1"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\nfigures = []\n", "no \\[\\[figures\\]\\]"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'speed'\nvalue = 1.0\nsource = 'x'\n",
     "figure 'speed' is not one of"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'steps_per_s'\nsource = 'x'\n",
     "needs a value, or low and high"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\n" + GOOD_FIGURE + "speed = 3\n", "unknown key 'speed'"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'per_position'\nvalues = [0.5, 0.9]\n"
     "source = 'x'\n", "rise with the position"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'per_position'\nvalues = [0.9, 0.5]\nn = 4\n"
     "source = 'x'\n", "2 values for n=4"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\n" + GOOD_FIGURE + "judge = 'at_least'\n",
     "needs its tolerance"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\n" + GOOD_FIGURE + "judge = 'at_least'\ntolerance = 0.1\n",
     "only the count category's acceptance is judged"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'steps_per_s'\nvalue = 'fast'\nsource = 'x'\n",
     "value must be a number"),
    ("version = 1\nrecipe = 'r'\ntitle = 't'\n[[figures]]\nfigure = 'output_tok_s'\nlow = 5.0\nsource = 'x'\n",
     "low and high come together"),
    ("version = 1\nrecipe = 'r\n", "not valid TOML"),
])
def test_a_bad_reference_is_one_line(tmp_path, body, error):
    path = tmp_path / "reference.toml"
    path.write_text(body)
    with pytest.raises(SparkstackError, match=error) as exc:
        load_reference(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)


def rows(cmp, section=None, figure=None, cell_name=None):
    return [r for r in cmp.rows if (section is None or r.section == section)
            and (figure is None or r.figure.figure == figure) and (cell_name is None or r.cell == cell_name)]


def test_n4_graphs_kit_and_content_apart_and_the_count_ceiling_holds(tmp_path):
    doc = report(cell("code"), cell("prose", steps=9.0, al=2.4), cell("count", **COUNT_GOOD))
    path = tmp_path / "bench.json"
    import json
    path.write_text(json.dumps(doc))
    doc = read_report(path)  # the contract's own reader accepts the hand-built document
    cmp = compare_reference(doc, find_reference(RECIPE), Served(4, True, "knobs"))
    kit = rows(cmp, "kit")
    # the n=4 graphs figure stands beside every non-count cell; the eager and n=7 ones are shown as differing
    at_93 = [r for r in kit if r.figure.value == 9.3]
    assert [(r.cell, r.ours, r.status) for r in at_93] == [("c=1 code", 9.2, "shown"), ("c=1 prose", 9.0, "shown")]
    assert at_93[0].detail == "0.99x" and at_93[0].spread == pytest.approx(0.4)  # 9.2/9.3; rounds 9.0..9.4
    assert {r.status for r in kit if r.figure.value in (9.1, 7.5)} == {"differs"}
    assert [r.section for r in cmp.rows if r.figure.figure == "acceptance_length"] == ["count"]
    content = rows(cmp, "content", "per_position", "c=1 code")
    assert content[0].ours == (0.7, 0.45, 0.28, 0.2) and content[0].status == "shown"
    count = rows(cmp, "count")
    judged = {r.figure.figure: r for r in count if r.figure.judge}
    assert judged["acceptance_length"].status == "ok" and judged["per_position"].status == "ok"
    tok = next(r for r in count if r.figure.figure == "output_tok_s")
    assert (tok.ours, tok.status, tok.detail) == (46.8, "shown", "within")
    assert cmp.verdict() == "" and cmp.lines()[-1] == "verdict: the count ceiling holds"
    text = "\n".join(cmp.lines())
    # the sections in the blog's order: the kit, then the content, then their product, then the count ceiling
    order = [text.index(h) for h in ("what the kit delivers", "what your content allows", "their product",
                                     "the count ceiling")]
    assert order == sorted(order)
    assert cmp.to_json()["served"] == {"n": 4, "graphs": True, "n_from": "knobs"}


def test_a_drafter_regression_shows_in_count_first():
    weak = dict(COUNT_GOOD, al=4.5, pos=(1.0, 0.97, 0.80, 0.73))
    cmp = compare_reference(report(cell("code"), cell("count", **weak)), find_reference(RECIPE), Served(4, True))
    judged = {r.figure.figure: r for r in rows(cmp, "count") if r.figure.judge}
    assert judged["acceptance_length"].status == "below" and "4.500 < 4.89 - 0.1" in judged["acceptance_length"].detail
    assert judged["per_position"].status == "below" and judged["per_position"].detail.startswith("position 3: 0.800")
    assert "below its ceiling (2 figure(s)" in cmp.verdict() and "drafter or parser regression" in cmp.verdict()


def test_a_collapsed_count_cell_fails_the_judgement():
    cmp = compare_reference(report(cell("count", flags=("spec_decode_collapse",))), find_reference(RECIPE),
                            Served(4, True))
    judged = [r for r in rows(cmp, "count") if r.figure.judge]
    assert {r.status for r in judged} == {"withheld"} and "spec_decode_collapse" in judged[0].detail
    assert cmp.verdict().startswith("the count category is below its ceiling")


def test_n_is_read_from_the_per_position_rates_when_the_knobs_are_not_given():
    cmp = compare_reference(report(cell("count", **COUNT_GOOD)), find_reference(RECIPE))
    assert cmp.served == Served(4, None, "per_position")
    assert {r.status for r in rows(cmp, "count") if r.figure.judge} == {"ok"}


def test_another_n_or_temperature_is_shown_not_judged():
    seven = dict(COUNT_GOOD, pos=(1.0, 0.99, 0.97, 0.94, 0.9, 0.85, 0.8), al=7.4)
    cmp = compare_reference(report(cell("count", **seven)), find_reference(RECIPE), Served(7, False, "knobs"))
    assert {r.status for r in rows(cmp, "count")} == {"differs"} and cmp.verdict() == ""
    assert "measured at n=4, ours n=7" in rows(cmp, "count")[0].detail
    cold = compare_reference(report(cell("count", **COUNT_GOOD), temperature=0.0), find_reference(RECIPE),
                             Served(4, True))
    assert {r.status for r in rows(cold, "count")} == {"differs"}
    assert "another temperature moves acceptance" in cold.lines()[1] and cold.lines()[-1] == "verdict: nothing judged"


def test_lowest_concurrency_when_the_source_states_none_and_missing_categories():
    cmp = compare_reference(report(cell("code", 2), cell("code", 4, steps=7.0)), find_reference(RECIPE),
                            Served(4, True))
    at_93 = [r for r in rows(cmp, "kit") if r.figure.value == 9.3]
    assert [r.cell for r in at_93] == ["c=2 code"] and "ours at c=2, the report's lowest" in at_93[0].detail
    assert {r.status for r in rows(cmp, "count")} == {"absent"}


def test_kv_tokens_beside_the_figure_of_the_same_pool():
    cmp = compare_reference(report(cell("code")), find_reference(RECIPE), Served(4, True), kv_tokens=989_727,
                            kv_bytes=10_247_694_336, kv_pool="pin")
    kv = {r.figure.value: r for r in rows(cmp, "kv")}
    assert kv[989727].ours == 989_727 and (kv[989727].status, kv[989727].detail) == ("shown", "1.000x")
    assert "989,727 vs 989,727" in kv[989727].line()
    assert kv[481488].status == "differs"  # the self-profiled figure is not a pinned boot's
    prof = compare_reference(report(cell("code")), find_reference(RECIPE), kv_tokens=470_000,
                             kv_bytes=4_900_000_000, kv_pool="profiled")
    kv = {r.figure.value: r for r in rows(prof, "kv")}
    assert (kv[481488].status, kv[481488].detail) == ("shown", "0.976x")  # 470,000 / 481,488 = 0.9761
    assert kv[989727].status == "differs" and "ours no pin" in kv[989727].detail
    assert rows(compare_reference(report(cell("code")), find_reference(RECIPE)), "kv")[0].status == "absent"


def test_served_from_knobs():
    assert served_from_knobs({"NUM_SPEC_TOKENS": "4", "EAGER": "0"}) == Served(4, True, "knobs")
    assert served_from_knobs({"NUM_SPEC_TOKENS": "7", "EAGER": "1"}) == Served(7, False, "knobs")
    assert served_from_knobs({}) == Served(None, None, "unknown")
    from sparkstack.deploy import plan_deployment
    from sparkstack.recipe import load_recipe

    deployment = plan_deployment(load_recipe(RECIPE), {"NUM_SPEC_TOKENS": "7", "EAGER": "1"})
    assert served_from_knobs(deployment.knobs) == Served(7, False, "knobs")

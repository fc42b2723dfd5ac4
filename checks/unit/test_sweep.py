"""sweep's pure parts: --vary parsing against the recipe's knob tables, the cells in the order that boots least,
boot identities from the real launch plans, content keys, boot estimates from run records, the state record, the
table with compare's noise bands and the boot's figures, a failed cell's row, and the picture."""

import json
import os
from pathlib import Path

import hostfix
import pytest
import standins
from clirun import PLANNED

from sparkstack.bench.plot import PNG_SIGNATURE, png_marker
from sparkstack.errors import SparkstackError, UsageError
from sparkstack.launch.apply import run_id
from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.recipe import load_recipe
from sparkstack.sweep.plan import (
    DEFAULT_BOOT_S,
    CellLaunch,
    Vary,
    boot_estimates,
    cell_environ,
    content_key,
    launch_cells,
    parse_vary,
    plan_sweep,
    product,
    run_order,
)
from sparkstack.sweep.plot import render_png, x_positions
from sparkstack.sweep.report import boot_figures, sweep_report
from sparkstack.sweep.state import (
    cut,
    failure_of,
    finished,
    mark,
    new_state,
    progress_lines,
    read_run_records,
    read_state,
    recover,
    report_path,
    sweep_id,
    write_state,
)

RECIPE = "glm53-flash-dflash2-nvfp4"
NOW = "2026-12-05T01:00:00Z"
BENCH = {"url": "http://127.0.0.1:8888", "concurrency": [1], "rounds": 2, "max_tokens": 256, "temperature": 1.0,
         "top_p": 0.95, "categories": ["code", "count"]}


# ---------------------------------------------------------------- --vary


def test_vary_parses_in_order_and_the_product_keeps_it():
    vs = parse_vary(["NUM_SPEC_TOKENS=2,4", "EAGER=0,1"])
    assert vs == (Vary("NUM_SPEC_TOKENS", ("2", "4")), Vary("EAGER", ("0", "1")))
    assert product(vs) == ((("NUM_SPEC_TOKENS", "2"), ("EAGER", "0")), (("NUM_SPEC_TOKENS", "2"), ("EAGER", "1")),
                           (("NUM_SPEC_TOKENS", "4"), ("EAGER", "0")), (("NUM_SPEC_TOKENS", "4"), ("EAGER", "1")))


def test_an_empty_value_where_the_knob_gives_it_a_meaning():
    assert parse_vary(["KV_CACHE_MEMORY=,10247694336"]) == (Vary("KV_CACHE_MEMORY", ("", "10247694336")),)


def test_values_that_differ_for_the_knob_are_kept_as_spelled():
    """Only the knob's kind decides sameness: no pin and a pin of 0 bytes differ, and a name's case is its own."""
    assert parse_vary(["KV_CACHE_MEMORY=,0", "GPU_MEM_UTIL=0.9,0.95"]) == (
        Vary("KV_CACHE_MEMORY", ("", "0")), Vary("GPU_MEM_UTIL", ("0.9", "0.95")))
    assert parse_vary(["MOE_BACKEND=marlin,Marlin"]) == (Vary("MOE_BACKEND", ("marlin", "Marlin")),)


def test_one_value_spelled_twice_is_one_line_from_the_cli(run_cli, tmp_path):
    proc = run_cli("sweep", "--vary", "GPU_MEM_UTIL=0.9,0.90", "--dry-run",
                   env={"SPARKSTACK_STATE_DIR": str(tmp_path / "state"), "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == ["sparkstack: error: --vary GPU_MEM_UTIL: '0.9' and '0.90' are the same value; "
                                        "give it once (see `sparkstack sweep --help`)"]


@pytest.mark.parametrize("specs, error", [
    ([], "at least one --vary"),
    (["NUM_SPEC_TOKENS"], "expected KNOB=V1,V2"),
    (["NUM_SPEC_TOKEN=2,4"], "not a knob \\(did you mean NUM_SPEC_TOKENS\\?\\)"),
    (["FLUX=2"], "not a knob; the knobs a sweep varies: IMAGE, MODEL_CACHE_NAME"),
    (["API_PORT=8888,8889"], "API_PORT: not swept: it is where bench and /health reach the pair"),
    (["EAGER=0", "EAGER=1"], "given twice: list its values in one --vary EAGER=V1,V2"),
    (["NUM_SPEC_TOKENS=2,x"], "NUM_SPEC_TOKENS='x' is not a whole number >= 1"),
    (["EAGER=2"], "EAGER='2' is not valid: expected 0 or 1"),
    (["NUM_SPEC_TOKENS=2,"], "NUM_SPEC_TOKENS='' is not a whole number"),
    (["GPU_MEM_UTIL=0.9,1.5"], "GPU_MEM_UTIL='1.5' is not a fraction"),
    (["NUM_SPEC_TOKENS=2,4,2"], "the value '2' is given twice"),
    # two spellings of one value, as the knob's kind reads them: one configuration, not two cells
    (["GPU_MEM_UTIL=0.9,0.90"], "GPU_MEM_UTIL: '0.9' and '0.90' are the same value; give it once"),
    (["GPU_MEM_UTIL=.85,0.9,0.850"], "GPU_MEM_UTIL: '.85' and '0.850' are the same value"),
    (["NUM_SPEC_TOKENS=4,2,04"], "NUM_SPEC_TOKENS: '4' and '04' are the same value"),
    (["KV_CACHE_MEMORY=,010,10"], "KV_CACHE_MEMORY: '010' and '10' are the same value"),
    (["EAGER=,0"], "EAGER: '' and '0' are the same value"),
    (["NUM_SPEC_TOKENS=" + ",".join(map(str, range(1, 10))), "MAX_NUM_SEQS=" + ",".join(map(str, range(1, 9)))],
     "72 cells \\(the product of 9 x 8\\); at most 64"),
])
def test_a_bad_vary_is_one_usage_line(specs, error):
    with pytest.raises(UsageError, match=error) as exc:
        parse_vary(specs)
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- the order


def test_cells_of_one_boot_run_together_serving_first_baseline_last():
    boots = ["a", "b", "a", "c", "b"]
    assert run_order(boots, None, None, False) == [0, 2, 1, 4, 3]
    assert run_order(boots, "c", None, False) == [3, 0, 2, 1, 4]
    assert run_order(boots, None, "a", False) == [1, 4, 3, 0, 2]
    assert run_order(boots, None, "a", True) == [0, 2, 1, 4, 3]  # the last cell stays up: no final relaunch to save
    assert run_order(boots, "a", "a", False) == [0, 2, 1, 4, 3]  # serving and baseline alike: first or last cost one
    assert run_order(boots, "b", "c", False) == [1, 4, 0, 2, 3]


def fake(argv: str, image: str = "img:1") -> CellLaunch:
    return CellLaunch(image, (("docker", "run", argv),), "m" * 40, "d" * 40)


def test_the_plan_counts_boots_and_says_which_cells_reuse_one():
    vs = parse_vary(["NUM_SPEC_TOKENS=2,3,4"])
    # cells 1 and 2 boot the same argv (say the knob has no effect for this value); cell 3 is the baseline
    launches = [fake("x"), fake("x"), fake("base")]
    plan = plan_sweep(RECIPE, vs, fake("base"), launches)
    assert [c.index for c in plan.cells] == [0, 1, 2]
    assert [c.boots for c in plan.cells] == [True, False, True]
    assert plan.cells[1].reuses == "the boot of cell 1" and plan.cells[1].boot_s == 0.0
    assert plan.final_boot is False and plan.boots == 2
    assert plan.estimate_s == 2 * DEFAULT_BOOT_S
    assert plan.lines()[-1] == "then: the last cell is the recipe as it stands: it stays serving, no relaunch"


def test_a_cell_equal_to_what_serves_now_needs_no_boot():
    vs = parse_vary(["EAGER=0,1"])
    launches = [fake("graphs"), fake("eager")]
    serving = launches[1].boot("sha256:" + "1" * 64)
    plan = plan_sweep(RECIPE, vs, fake("graphs"), launches, image_id="sha256:" + "1" * 64, serving=serving)
    assert [(c.index, c.boots, c.reuses) for c in plan.cells] == [(1, False, "what serves now"), (0, True, None)]
    assert plan.boots == 1 and not plan.final_boot  # cell 1 (graphs) is the baseline, last
    left = plan_sweep(RECIPE, vs, fake("other"), launches, image_id="sha256:" + "1" * 64, serving=serving)
    assert left.final_boot and left.boots == 2 and "relaunch the recipe as it stands" in left.lines()[-1]
    up = plan_sweep(RECIPE, vs, fake("other"), launches, image_id="sha256:" + "1" * 64, serving=serving,
                    leave_last_up=True)
    assert not up.final_boot and up.boots == 1 and "left serving" in up.lines()[-1]


def test_a_resume_counts_only_the_cells_left():
    """Cells an earlier run finished (their content keys in the record) are kept: no boot, no time in the estimate."""
    vs = parse_vary(["NUM_SPEC_TOKENS=2,3,4"])
    image = "sha256:" + "5" * 64
    launches = [fake("n2"), fake("n3"), fake("n4")]
    whole = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image, bench=BENCH)
    assert whole.boots == 4 and whole.estimate_s == 4 * DEFAULT_BOOT_S  # three cells and the final relaunch
    resumed = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image, bench=BENCH,
                         finished={whole.cells[0].key, whole.cells[1].key})
    assert [(c.index, c.finished, c.boots, c.boot_s) for c in resumed.cells] == [
        (0, True, False, 0.0), (1, True, False, 0.0), (2, False, True, DEFAULT_BOOT_S)]
    assert resumed.boots == 2 and resumed.estimate_s == 2 * DEFAULT_BOOT_S  # cell 3 and the final relaunch
    lines = resumed.lines()
    assert lines[0] == f"sweep {RECIPE}: NUM_SPEC_TOKENS (2, 3, 4): 3 cells (2 finished), 2 boot(s), about 30 min + bench"
    assert lines[1:3] == ["  1. cell 1: NUM_SPEC_TOKENS=2: finished in an earlier run: kept",
                          "  2. cell 2: NUM_SPEC_TOKENS=3: finished in an earlier run: kept"]
    assert resumed.to_json()["cells"][0]["finished"] is True and resumed.to_json()["estimate_s"] == 2 * DEFAULT_BOOT_S


def test_a_resume_boots_the_cell_whose_boot_was_a_finished_cells():
    """Cells 1 and 2 share a boot; cell 1 is finished, so nothing booted it in this run: cell 2 boots."""
    vs = parse_vary(["NUM_SPEC_TOKENS=2,3,4"])
    image = "sha256:" + "6" * 64
    launches = [fake("x"), fake("x"), fake("base")]
    whole = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image)
    assert [c.boots for c in whole.cells] == [True, False, True] and whole.boots == 2
    resumed = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image, finished={whole.cells[0].key})
    assert [(c.boots, c.reuses) for c in resumed.cells] == [(False, None), (True, None), (True, None)]
    assert resumed.boots == 2 and resumed.estimate_s == 2 * DEFAULT_BOOT_S
    # every cell finished and the recipe as it stands serving: nothing to boot, nothing to wait for
    serving = fake("base").boot(image)
    done = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image, serving=serving,
                      finished={c.key for c in whole.cells})
    assert done.boots == 0 and done.estimate_s == 0 and not done.final_boot
    assert done.lines()[0].endswith("3 cells (3 finished), 0 boot(s), about 0 min")


def test_a_resumed_dry_run_estimates_the_cells_left(run_cli, tmp_path):
    """Through the CLI: a record with cell 1 done; the dry run counts cell 2's boot alone (the recipe as it stands,
    NUM_SPEC_TOKENS=4, runs last: no final relaunch). --image is a layout, so the content keys are known."""
    import imagefix as fx

    base = tmp_path / "base"
    fx.write_base(base)
    env = {"SPARKSTACK_STATE_DIR": str(tmp_path / "state"), "HF_HOME": str(tmp_path / "hf")}
    sweep = ("sweep", "--vary", "NUM_SPEC_TOKENS=2,4", "--image", base, "--dry-run")
    first = json.loads(run_cli(*sweep, "--json", env=env, check=PLANNED).stdout)
    assert first["boots"] == 2 and first["estimate_s"] == 2 * DEFAULT_BOOT_S and first["finished_already"] == []
    cells = [{"index": c["index"], "knobs": c["knobs"], "key": c["key"], "status": "pending", "run_id": None,
              "boot": None, "report": None, "failure": None, "started_at": None, "finished_at": None}
             for c in first["cells"]]
    cells[0]["status"] = "done"
    write_state(Path(first["record"]), {"version": 1, "sweep": "x", "recipe": RECIPE, "vary": first["vary"],
                                       "salt": first["salt"], "bench": {}, "cells": cells, "serving": None})
    again = json.loads(run_cli(*sweep, "--json", env=env, check=PLANNED).stdout)
    assert again["finished_already"] == [0] and again["boots"] == 1 and again["estimate_s"] == DEFAULT_BOOT_S
    lines = run_cli(*sweep, env=env, check=PLANNED).stdout.splitlines()
    assert lines[0] == f"sweep {RECIPE}: NUM_SPEC_TOKENS (2, 4): 2 cells (1 finished), 1 boot(s), about 15 min + bench"
    assert lines[1] == "  1. cell 1: NUM_SPEC_TOKENS=2: finished in an earlier run: kept"
    resumes = [line for line in lines if line.startswith("resumes ")]
    assert len(resumes) == 1 and resumes[0].endswith(": cells 1 finished already"), lines
    assert lines[-1].startswith("preflight: "), lines  # the verdict of the cell left


def test_boot_estimates_from_run_records():
    records = [{"id": "r1", "recipe": RECIPE, "boot": {"health_s": 600.0}},
               {"id": "r2", "recipe": RECIPE, "boot": {"health_s": 800.0}},
               {"id": "r3", "recipe": RECIPE, "boot": {"health_s": 1000.0}},
               {"id": "r4", "recipe": "other", "boot": {"health_s": 10.0}},
               {"id": "r5", "recipe": RECIPE, "boot": None}]  # workers only: no boot watched
    typical, own = boot_estimates(records, RECIPE)
    assert (typical.seconds, typical.runs) == (820.0, 3)  # the median 800 s plus the worker's 20 s lead
    assert own["r1"].seconds == 620.0 and "r4" not in own
    none, _ = boot_estimates([], RECIPE)
    assert none.seconds == 900.0 and none.runs == 0


def test_run_records_are_read_from_the_state_dir(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "r1.json").write_text(json.dumps({"id": "r1", "recipe": RECIPE, "boot": {"health_s": 500.0}}))
    (runs / "broken.json").write_text("{")
    (runs / "latest").write_text("r1")
    monkeypatch.setenv("SPARKSTACK_STATE_DIR", str(tmp_path))
    records = read_run_records()
    assert [r["id"] for r in records] == ["r1"]
    assert boot_estimates(records, RECIPE)[0].seconds == 520.0


def test_a_cell_with_its_own_record_is_estimated_by_it():
    vs = parse_vary(["EAGER=0,1"])
    launches = [fake("graphs"), fake("eager")]
    image = "sha256:" + "2" * 64
    records = [{"id": launches[1].boot(image), "recipe": RECIPE, "boot": {"health_s": 400.0}},
               {"id": "zz", "recipe": RECIPE, "boot": {"health_s": 1000.0}}]
    plan = plan_sweep(RECIPE, vs, fake("base"), launches, image_id=image, records=records)
    by = {c.index: c for c in plan.cells}
    assert by[1].boot_s == 420.0 and "own record" in by[1].boot_from
    assert by[0].boot_s == 720.0  # the median of 420 and 1020


def test_content_keys():
    launch = fake("x")
    knobs = (("EAGER", "1"),)
    key = content_key(RECIPE, knobs, launch, "sha256:aa", BENCH)
    assert len(key) == 16 and key == content_key(RECIPE, knobs, launch, "sha256:aa", {**BENCH, "url": "http://x"})
    assert key != content_key(RECIPE, knobs, launch, "sha256:bb", BENCH)  # another image
    assert key != content_key(RECIPE, knobs, fake("y"), "sha256:aa", BENCH)  # another argv (an edited recipe)
    assert key != content_key(RECIPE, knobs, launch, "sha256:aa", {**BENCH, "rounds": 3})  # another bench
    assert key != content_key(RECIPE, (("EAGER", "0"),), launch, "sha256:aa", BENCH)
    other_rev = CellLaunch("img:1", launch.argvs, "e" * 40, "d" * 40)
    assert key != content_key(RECIPE, knobs, other_rev, "sha256:aa", BENCH)
    plan = plan_sweep(RECIPE, parse_vary(["EAGER=0,1"]), fake("b"), [fake("g"), fake("e")])
    assert [c.key for c in plan.cells] == [None, None]  # the image's ID is read at apply


# ---------------------------------------------------------------- the real launch plans


def test_real_launch_plans_give_each_cell_its_argv_and_the_baseline_its_identity():
    recipe = load_recipe(RECIPE)
    vs = parse_vary(["NUM_SPEC_TOKENS=2,4", "EAGER=0,1"])
    baseline, launches = launch_cells(recipe, {}, product(vs))
    head = {cell: dict(launch_knobs) for cell, launch_knobs in zip(launches, product(vs))}
    for launch, knobs in head.items():
        argv = launch.argvs[0]
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens"] == int(knobs["NUM_SPEC_TOKENS"])
        assert ("--enforce-eager" in argv) == (knobs["EAGER"] == "1")
    # n=4 with graphs is the recipe as it stands: the same boot, so it runs last and the relaunch is free
    assert launches[2].boot("sha256:x") == baseline.boot("sha256:x")
    assert len({launch.boot("sha256:x") for launch in launches}) == 4
    plan = plan_sweep(RECIPE, vs, baseline, launches)
    assert plan.cells[-1].index == 2 and plan.boots == 4 and not plan.final_boot


def test_a_cell_boot_is_the_run_records_id():
    """A cell equal to what serves now is found by the run record's own id (launch.apply.run_id)."""
    plan = plan_launch_from_recipe(load_recipe(RECIPE), cell_environ({}, [("EAGER", "1")]))
    assert CellLaunch.of(plan).boot("sha256:" + "3" * 64) == run_id(plan, "sha256:" + "3" * 64)


# ---------------------------------------------------------------- the state record


def two_cell_state():
    plan = plan_sweep(RECIPE, parse_vary(["NUM_SPEC_TOKENS=2,4"]), fake("base"), [fake("n2"), fake("n4")],
                      image_id="sha256:" + "4" * 64, bench=BENCH)
    return plan, new_state(plan, "ab12cd34", BENCH, NOW)


def test_state_marks_recovers_and_resumes(tmp_path):
    plan, state = two_cell_state()
    assert state["sweep"] == sweep_id(RECIPE, plan.varies, BENCH) and state["bench"].get("url") is None
    assert [c["status"] for c in state["cells"]] == ["pending", "pending"]
    s = mark(state, 0, "2026-12-05T01:01:00Z", status="booting")
    assert s["cells"][0]["started_at"] == "2026-12-05T01:01:00Z" and state["cells"][0]["status"] == "pending"
    s = mark(s, 0, "2026-12-05T01:20:00Z", status="done", report="/x/cell1.json")
    s = mark(s, 1, "2026-12-05T01:21:00Z", status="benching")
    assert finished(s, plan.cells[0].key)["index"] == 0 and finished(s, plan.cells[1].key) is None
    path = tmp_path / "sweeps" / f"{s['sweep']}.json"
    write_state(path, s)
    back = recover(read_state(path), NOW)  # the process died while cell 2 benched
    assert [c["status"] for c in back["cells"]] == ["done", "cut"]
    assert report_path(path, 1).name == f"{s['sweep']}-cell2.json"
    lines = progress_lines(back)
    assert lines[0].endswith("done: 1 (NUM_SPEC_TOKENS=2)") and lines[2] == "  cut: 2 (NUM_SPEC_TOKENS=4)"
    with pytest.raises(ValueError):
        mark(s, 0, NOW, status="finished")


def test_a_bad_state_record_is_one_line(tmp_path):
    path = tmp_path / "s.json"
    assert read_state(path) is None
    path.write_text('{"version": 1, "cells": [{"index": 0, "status": "weird"}]}')
    with pytest.raises(SparkstackError, match="not a sweep record of version 1"):
        read_state(path)


FATAL = {"key": "free-memory", "line": "ValueError: Free memory on device cuda:0 (104.46/121.69 GiB) on startup is "
         "less than desired GPU memory utilization", "at_s": 95.5, "diagnosis": "drop the page cache"}


def test_failure_of_a_timeline():
    timeline = [{"rank": 0, "fatal": None}, {"rank": 1, "fatal": FATAL}]
    assert failure_of(timeline) == {"line": FATAL["line"], "diagnosis": "drop the page cache", "at_s": 95.5,
                                    "rank": 1}
    assert failure_of([{"rank": 0, "fatal": None}]) is None


# ---------------------------------------------------------------- the table


def bench_cell(category, steps, al, tok, rounds, pos=(0.7, 0.45, 0.28, 0.2), flags=()):
    return {"concurrency": 1, "category": category, "steps_per_s": steps, "acceptance_length": al,
            "output_tok_s": tok, "per_position": list(pos), "flags": list(flags),
            "rounds": [{"steps_per_s": s, "acceptance_length": a, "output_tok_s": t} for s, a, t in rounds]}


def bench_doc(*cells):
    return {"suite_version": "1", "settings": BENCH, "salt": "ab12cd34", "cells": list(cells)}


def boot(health, tokens, graph_s=None, graph_gib=None):
    return {"health_s": health, "timeline": [
        {"rank": 0, "kv_cache_tokens": tokens, "graph_capture_s": graph_s, "graph_capture_gib": graph_gib},
        {"rank": 1, "kv_cache_tokens": None, "graph_capture_s": None, "graph_capture_gib": None}]}


def three_cells():
    plan = plan_sweep(RECIPE, parse_vary(["NUM_SPEC_TOKENS=2,4,7"]), fake("base"),
                      [fake("n2"), fake("n4"), fake("n7")], bench=BENCH)
    s = new_state(plan, "ab12cd34", BENCH, NOW)
    s = mark(s, 0, NOW, status="done", report="a", run_id="run0", boot=boot(640.75, 989_727, 41.0, 1.2))
    s = mark(s, 1, NOW, status="done", report="b", run_id="run1", boot=boot(700.0, 989_727))
    s = mark(s, 2, NOW, status="failed", failure={"line": FATAL["line"], "diagnosis": "drop the page cache"})
    reports = {
        0: bench_doc(bench_cell("code", 9.2, 2.6, 24.0, ((9.0, 2.5, 23.0), (9.4, 2.7, 25.0)))),
        1: bench_doc(bench_cell("code", 10.0, 2.62, 26.2, ((9.9, 2.6, 26.0), (10.1, 2.64, 26.4)))),
    }
    return s, reports


def test_the_table_bands_against_the_first_cell_and_keeps_the_failed_one():
    state, reports = three_cells()
    rep = sweep_report(state, reports)
    assert rep.first == 0 and [c.status for c in rep.cells] == ["done", "done", "failed"]
    first, second, failed = rep.cells
    assert first.rows[0].changes is None
    ch = second.rows[0].changes
    # steps/s 9.2 -> 10.0: +0.8, beyond both runs' spreads (0.4 and 0.2); +8.70 %
    assert ch["steps_per_s"].exceeds_spread is True and round(ch["steps_per_s"].change_pct, 2) == 8.70
    # acceptance 2.6 -> 2.62: +0.02, within the first run's spread (0.2)
    assert ch["acceptance_length"].exceeds_spread is False
    assert second.rows[0].spreads["steps_per_s"] == pytest.approx(0.2)
    assert first.boot.to_json() == {"ready_s": 640.75, "kv_tokens": 989_727, "graph_capture_s": 41.0,
                                    "graph_capture_gib": 1.2, "run_id": "run0"}
    lines = rep.lines()
    assert lines[0].startswith(f"sweep {state['sweep']} ({RECIPE}): bands against cell 1")
    row1 = next(line for line in lines if line.startswith("1 "))
    assert "NUM_SPEC_TOKENS=2" in row1 and "641 s" in row1 and "989,727" in row1 and "41 s/1.20 GiB" in row1
    row2 = next(line for line in lines if line.startswith("2 "))
    assert "10.00 (+8.7% *)" in row2 and "2.62 (+0.8% ~)" in row2 and "26.2 (+9.2% *)" in row2
    row3 = next(line for line in lines if line.startswith("3 "))
    assert row3.endswith(f"failed: {FATAL['line']} (drop the page cache)") and "NUM_SPEC_TOKENS=7" in row3
    doc = rep.to_json()
    assert doc["cells"][2]["failure"]["line"] == FATAL["line"] and doc["cells"][2]["rows"] == []
    assert doc["cells"][1]["rows"][0]["changes"]["steps_per_s"]["exceeds_spread"] is True


def test_cut_and_pending_cells_and_no_finished_cell():
    plan, state = two_cell_state()
    state = cut(state, 0, NOW)
    rep = sweep_report(state, {})
    assert rep.first is None and "bands against none finished" in rep.lines()[0]
    assert rep.lines()[2].endswith("cut (Ctrl-C)") and rep.lines()[3].endswith("not run")


def test_boot_figures_of_nothing():
    assert boot_figures(None) is None
    assert boot_figures({"health_s": None, "timeline": []}).kv_tokens is None


# ---------------------------------------------------------------- the picture


def test_the_picture_is_a_png_sweep_wrote(tmp_path):
    state, reports = three_cells()
    rep = sweep_report(state, reports)
    png = render_png(rep)
    assert png.startswith(PNG_SIGNATURE)
    path = tmp_path / "sweep.png"
    path.write_bytes(png)
    assert png_marker(path).command == "sparkstack sweep"


def test_one_numeric_knob_is_a_numeric_axis_two_knobs_are_ticks():
    state, reports = three_cells()
    xs, ticks, labels, title = x_positions(sweep_report(state, reports))
    assert (xs, ticks, labels, title) == ({0: 2.0, 1: 4.0, 2: 7.0}, [2.0, 4.0, 7.0], ["2", "4", "7"],
                                          "NUM_SPEC_TOKENS")
    plan = plan_sweep(RECIPE, parse_vary(["MOE_BACKEND=marlin,cutlass", "EAGER=0"]), fake("b"),
                      [fake("m"), fake("c")])
    rep = sweep_report(new_state(plan, "s", BENCH, NOW), {})
    xs, ticks, labels, title = x_positions(rep)
    assert labels == ["MOE_BACKEND=marlin\nEAGER=0", "MOE_BACKEND=cutlass\nEAGER=0"] and title == "cell"


@pytest.mark.parametrize("utils, refusal", [
    ("0.90,1.0", "would run, but cell(s) 2 would fail their preflight (failed rows)"),
    ("0.99,1.0", "would boot no cell: each would fail its preflight"),
])
def test_the_dry_runs_verdict_says_whether_any_cell_would_boot(run_cli, tmp_path, utils, refusal):
    """docs/commands/sweep.md: the verdict is `would boot no cell` only when every cell fails its preflight; when
    some pass, it names the cells that would fail (they become failed rows). Either way a failed check exits 1.
    The healthy host's MemAvailable is 114.44 GiB: 0.90 x 121.69 GiB fits, 0.99 and 1.0 do not."""
    standins.install(tmp_path / "bin")
    root, home = hostfix.write_host(tmp_path / "root"), hostfix.write_hub(tmp_path / "hf")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD_LOG": str(tmp_path / "calls.jsonl"),
           "HF_HOME": str(home), "VLLM_API_KEY": "k", "SPARKSTACK_STATE_DIR": str(tmp_path / "state")}
    proc = run_cli("sweep", "--vary", f"GPU_MEM_UTIL={utils}", "--host-root", root, "--dry-run", env=env, check=PLANNED)
    assert proc.returncode == 1
    last = proc.stdout.splitlines()[-1]
    assert f"`sparkstack sweep` {refusal} (first: cell " in last, last

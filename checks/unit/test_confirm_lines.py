"""The boot lines a recipe expects (the blog's), judged on recorded boot logs: each line seen, each one missing in
turn, a value other than the derived one; derivation from the drafter's config, --moe-backend and EAGER; the
timeline's and `launch status`'s marks; verify's verdict from the run record; the blog's drafter-group failures
as fatal lines with their diagnoses."""

import json
from pathlib import Path

import pytest

from sparkstack.launch.confirm import judge, plan_expectations
from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.report import status_lines
from sparkstack.launch.timeline import parse_rank
from sparkstack.recipe import load_recipe
from sparkstack.verify.run import record_results

MODEL_REV, DRAFT_REV = "a" * 40, "b" * 40
STAMP = "2026-11-29T10:00:{:02d}.000000000Z"
# The blog's lines as a GB10 head prints them: behind vLLM's prefix, in docker's timestamped form.
# The drafter's config below reads target layers 5/14/24/33/42 (the real drafter's), which vLLM logs + 1.
BLOG = {
    "modelopt-nvfp4": "(EngineCore_DP0 pid=250) INFO 11-29 10:00:01 [modelopt.py:412] Detected ModelOpt NVFP4 "
                      "checkpoint (quant_algo=NVFP4)",
    "nvfp4-moe-backend": "(Worker_TP0 pid=312) INFO 11-29 10:00:02 [nvfp4.py:242] Using 'MARLIN' NvFp4 MoE backend out "
                         "of potential backends: ['MARLIN', 'FLASHINFER_CUTLASS']",
    "eagle3-aux-layers": "(Worker_TP0 pid=312) INFO 11-29 10:00:03 [eagle3_utils.py:27] Using Eagle3 auxiliary layers "
                         "from config: (6, 15, 25, 34, 43)",
    # 0.32's GPU worker under a pin: it reserves the pin and skips profiling (gpu_worker.py), 10,247,694,336 B = 9.54
    "kv-cache-memory": "(Worker_TP0 pid=312) INFO 11-29 10:00:04 [gpu_worker.py:668] Initial free memory 110.21 GiB, "
                       "reserved 9.54 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped "
                       "memory profiling.",
    "kv-cache-size": "(EngineCore_DP0 pid=250) INFO 11-29 10:00:04 [kv_cache_utils.py:1290] GPU KV cache size: 989,727 "
                     "tokens",
    "breakable-cuda-graph": "(Worker_TP0 pid=312) INFO 11-29 10:00:05 [breakable_cudagraph.py:294] Breakable CUDA graph "
                            "enabled",
    "graph-capture": "(Worker_TP0 pid=312) INFO 11-29 10:00:06 [gpu_model_runner.py:5310] Graph capturing finished in "
                     "41 secs, took 1.52 GiB",
}


def log(lines: dict[str, str]) -> str:
    return "".join(f"{STAMP.format(i)} {text}\n" for i, text in enumerate(lines.values()))


@pytest.fixture
def hf_home(tmp_path):
    hub = tmp_path / "hf" / "hub"
    for name, rev in (("models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP", MODEL_REV),
                      ("models--incoai--GLM-5.3-Flash-DFlash2", DRAFT_REV)):
        (hub / name / "refs").mkdir(parents=True)
        (hub / name / "refs" / "main").write_text(rev)
        (hub / name / "snapshots" / rev).mkdir(parents=True)
    config = {"architectures": ["DFlash2DraftModel"], "dflash_config": {"target_layer_ids": [5, 14, 24, 33, 42]}}
    (hub / "models--incoai--GLM-5.3-Flash-DFlash2" / "snapshots" / DRAFT_REV / "config.json").write_text(json.dumps(config))
    return tmp_path / "hf"


def expected(hf_home: Path, recipe=None, **env):
    return plan_expectations(plan_launch_from_recipe(load_recipe(recipe), {"HF_HOME": str(hf_home), **env}))


def test_every_line_the_blog_confirms_is_seen_in_its_boot(hf_home):
    exp = expected(hf_home)
    assert [e.key for e in exp] == list(BLOG)
    assert {c.expected.key: c.status for c in judge(exp, log(BLOG))} == dict.fromkeys(BLOG, "seen")


@pytest.mark.parametrize("gone", list(BLOG))
def test_a_boot_without_one_line_has_exactly_that_one_missing(hf_home, gone):
    boot = log({k: v for k, v in BLOG.items() if k != gone})
    judged = {c.expected.key: c.status for c in judge(expected(hf_home), boot)}
    assert judged == {k: "missing" if k == gone else "seen" for k in BLOG}


def test_the_aux_layers_come_from_the_drafters_config(hf_home):
    aux = next(e for e in expected(hf_home) if e.key == "eagle3-aux-layers")
    assert aux.value == "(6, 15, 25, 34, 43)" and aux.text.endswith("(6, 15, 25, 34, 43)")
    # Another drafter reads other layers: the blog's line is then the wrong one.
    config = hf_home / "hub/models--incoai--GLM-5.3-Flash-DFlash2/snapshots" / DRAFT_REV / "config.json"
    config.write_text(json.dumps({"dflash_config": {"target_layer_ids": [1, 2]}}))
    aux = next(e for e in expected(hf_home) if e.key == "eagle3-aux-layers")
    assert aux.value == "(2, 3)"
    (c,) = [c for c in judge(expected(hf_home), log(BLOG)) if c.expected.key == "eagle3-aux-layers"]
    assert c.status == "differs" and "(6, 15, 25, 34, 43)" in c.line


def test_the_moe_backend_comes_from_the_argv(hf_home):
    moe = next(e for e in expected(hf_home, MOE_BACKEND="flashinfer_cutlass") if e.key == "nvfp4-moe-backend")
    assert moe.value == "FLASHINFER_CUTLASS"
    judged = {c.expected.key: c.status for c in judge(expected(hf_home, MOE_BACKEND="flashinfer_cutlass"), log(BLOG))}
    assert judged["nvfp4-moe-backend"] == "differs"


def test_graph_lines_are_expected_only_while_eager_is_off(hf_home):
    assert {"graph-capture", "breakable-cuda-graph"} <= {e.key for e in expected(hf_home)}
    eager = expected(hf_home, EAGER="1")
    assert {e.key for e in eager} == set(BLOG) - {"graph-capture", "breakable-cuda-graph"}
    # An eager boot prints no graph line, and lacks nothing it is expected to show.
    boot = log({k: v for k, v in BLOG.items() if k not in ("graph-capture", "breakable-cuda-graph")})
    assert {c.status for c in judge(eager, boot)} == {"seen"}
    # The MXFP8 recipe runs --enforce-eager in its own args: its graph lines are derived away too.
    assert [e.key for e in expected(hf_home, "glm53-flash-dflash2-mxfp8")] == ["eagle3-aux-layers", "kv-cache-size"]


# ---- the figures, judged by value: the blog's 989,727 tokens and 9.54 GiB at the shipped pin

def _with(key: str, old: str, new: str) -> str:
    assert old in BLOG[key]
    return log({**BLOG, key: BLOG[key].replace(old, new)})


def _judged(hf_home, text: str, **env) -> dict:
    return {c.expected.key: c for c in judge(expected(hf_home, **env), text)}


def test_the_pins_tokens_and_gib_are_the_blogs(hf_home):
    by = {e.key: e for e in expected(hf_home)}
    assert by["kv-cache-size"].value == "989,727" and by["kv-cache-size"].within == 2304  # --block-size 2304
    assert by["kv-cache-memory"].value == "9.54"  # 10,247,694,336 B / 2**30 = 9.5439
    judged = _judged(hf_home, log(BLOG))
    assert judged["kv-cache-size"].verdict == judged["kv-cache-memory"].verdict == "pass"


@pytest.mark.parametrize("tokens, status", [
    ("989,727", "seen"), ("992,031", "seen"), ("987,423", "seen"),  # one 2304-token block either way
    ("992,032", "differs"), ("987,422", "differs"),  # a token past one block
    ("481,488", "differs"),  # the blog's unpinned 0.89 boot: not this pin's pool
])
def test_kv_tokens_are_judged_within_one_block_of_the_plan(hf_home, tokens, status):
    c = _judged(hf_home, _with("kv-cache-size", "989,727", tokens))["kv-cache-size"]
    assert c.status == status and c.verdict == ("pass" if status == "seen" else "fail")


@pytest.mark.parametrize("gib, status", [
    ("9.54", "seen"), ("9.45", "seen"), ("9.63", "seen"),  # within 1% of 9.5439 GiB: 9.4485 to 9.6394
    ("9.44", "differs"), ("9.64", "differs"), ("4.6", "differs"),  # the blog's self-profiled ~4.6 GiB
])
def test_kv_gib_is_judged_within_one_percent_of_the_pin(hf_home, gib, status):
    c = _judged(hf_home, _with("kv-cache-memory", "reserved 9.54 GiB", f"reserved {gib} GiB"))["kv-cache-memory"]
    assert c.status == status


def test_an_older_builds_available_line_is_the_pool_too(hf_home):
    older = "(Worker_TP0 pid=312) INFO 11-29 10:00:04 [gpu_worker.py:276] Available KV cache memory: 9.54 GiB"
    assert _judged(hf_home, log({**BLOG, "kv-cache-memory": older}))["kv-cache-memory"].status == "seen"


def test_another_pin_moves_both_figures(hf_home):
    # 8 GiB: 8,589,934,592 B x 989,727 / 10,247,694,336 B = 829,619.8 tokens
    by = {e.key: e for e in expected(hf_home, KV_CACHE_MEMORY="8589934592")}
    assert by["kv-cache-size"].value == "829,619" and by["kv-cache-memory"].value == "8.00"
    assert _judged(hf_home, log(BLOG), KV_CACHE_MEMORY="8589934592")["kv-cache-size"].verdict == "fail"


def test_without_a_pin_any_figure_is_the_profilers(hf_home):
    by = {e.key: e for e in expected(hf_home, KV_CACHE_MEMORY="")}
    assert by["kv-cache-size"].value is None and by["kv-cache-memory"].value is None
    judged = _judged(hf_home, _with("kv-cache-size", "989,727", "481,488"), KV_CACHE_MEMORY="")
    assert judged["kv-cache-size"].verdict == "pass"


def test_a_figure_off_its_value_is_shown_with_what_was_expected_and_why(hf_home):
    text = _with("kv-cache-size", "989,727", "481,488")
    lines = status_lines([], _record(hf_home, text))
    (line,) = [x for x in lines if "differs" in x]
    assert line.startswith("  fail  differs: expected GPU KV cache size: 989,727 tokens (the KV plan: "
                           "10,247,694,336 B at 10,354.06 B per token, within one 2304-token block")
    assert "481,488 tokens" in line
    by = {r.check: r for r in record_results(_record(hf_home, text), "http://127.0.0.1:8888")}
    assert by["boot-lines"].status == "fail" and "the boot says" in by["boot-lines"].detail
    warned = {r.check: r for r in record_results(_record(hf_home, text, "warn"), "http://127.0.0.1:8888")}
    assert warned["boot-lines"].status == "warn"


def _record(hf_home, boot_text: str, missing: str = "fail", port: int = 8888) -> dict:
    exp = expected(hf_home)
    exp = tuple(type(e)(e.key, e.value, e.text, missing, e.derived, e.within) for e in exp)
    return {"id": "run1", "api_port": port, "model": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "served_name": "glm",
            "drafter": {"repo": "incoai/GLM-5.3-Flash-DFlash2", "licence": "CC BY-NC-ND 4.0"},
            "boot": {"port_open_s": 1, "health_s": 2, "ttft_s": 3, "timeline": [], "kv_pool": None,
                     "confirm": [c.to_json() for c in judge(exp, boot_text)]}}


def test_status_marks_each_expected_line_seen_or_missing(hf_home):
    record = _record(hf_home, log({k: v for k, v in BLOG.items() if k != "breakable-cuda-graph"}))
    lines = status_lines([], record)
    assert "  fail  missing: Breakable CUDA graph enabled" in lines
    seen = [line for line in lines if line.startswith("  pass  seen: ")]
    assert len(seen) == len(BLOG) - 1
    assert "  pass  seen: Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)" in seen


@pytest.mark.parametrize("missing", ["fail", "warn"])
def test_verify_fails_or_warns_as_the_recipe_says_on_a_missing_line(hf_home, missing):
    record = _record(hf_home, log({k: v for k, v in BLOG.items() if k != "graph-capture"}), missing)
    by = {r.check: r for r in record_results(record, "http://127.0.0.1:8888")}
    assert by["boot-lines"].status == missing and by["boot-lines"].required == (missing == "fail")
    assert "missing: Graph capturing finished" in by["boot-lines"].detail
    whole = {r.check: r.status for r in record_results(_record(hf_home, log(BLOG)), "http://127.0.0.1:8888")}
    assert whole["boot-lines"] == "pass"
    # A record of a pair on another port says nothing about this one.
    assert record_results(record, "http://127.0.0.1:9999") == ()


def test_verify_reports_the_drafters_licence_beside_the_model(hf_home):
    by = {r.check: r for r in record_results(_record(hf_home, log(BLOG)), "http://127.0.0.1:8888")}
    assert by["licence"].detail == ("model LibertAIDAI/GLM-5.3-Flash-NVFP4 (served as glm); drafter "
                                    "incoai/GLM-5.3-Flash-DFlash2: CC BY-NC-ND 4.0")


# ---- the blog's drafter-group failures: fatal, each with its diagnosis

TAIL_RING = """{s} (Worker_TP0 pid=312) ERROR 11-29 10:00:07 [multiproc_executor.py:801] Traceback (most recent call last):
{s} (Worker_TP0 pid=312) ERROR 11-29 10:00:07 [multiproc_executor.py:801]   File "/usr/local/lib/python3.12/dist-packages/vllm/models/glm5next/nvidia/ops/kpool_compress.py", line 612, in kpool_compress
{s} (Worker_TP0 pid=312) ERROR 11-29 10:00:07 [multiproc_executor.py:801]     assert tail_kv_cache.shape[2] == pool_size
{s} (Worker_TP0 pid=312) ERROR 11-29 10:00:07 [multiproc_executor.py:801] AssertionError
"""
# As torch (c10's checkInBoundsForStorage) words it: the format of `torch.empty(2).as_strided((8,), (1,))`'s error.
SET_STORAGE = ("{s} (Worker_TP1 pid=313) ERROR 11-29 10:00:07 [multiproc_executor.py:801] RuntimeError: setStorage: "
               "sizes [2048, 2304, 1, 576], strides [1327104, 576, 576, 1], storage offset 0, and itemsize 1 "
               "requiring a storage size of 2717908992 are out of bounds for storage of size 1358954496\n")


@pytest.mark.parametrize("text,key", [(TAIL_RING, "drafter-tail-ring"), (SET_STORAGE, "drafter-set-storage")])
def test_the_drafter_group_failures_are_fatal_with_a_diagnosis(text, key):
    tl = parse_rank(0, log(BLOG) + text.format(s=STAMP.format(7)), 0.0)
    assert tl.fatal is not None and tl.fatal.key == key
    assert "drafter-group" in tl.fatal.diagnosis and "glm5_drafter_group" in tl.fatal.diagnosis


def test_vllm_032s_wording_of_the_tail_ring_assert_is_fatal_too():
    line = TAIL_RING.replace("assert tail_kv_cache.shape[2] == pool_size",
                             "assert ring >= pool_size and ring % pool_size == 0, (ring, pool_size)")
    tl = parse_rank(0, line.format(s=STAMP.format(7)), 0.0)
    assert tl.fatal is not None and tl.fatal.key == "drafter-tail-ring"

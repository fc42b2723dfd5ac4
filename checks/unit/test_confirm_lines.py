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


def _record(hf_home, boot_text: str, missing: str = "fail", port: int = 8888) -> dict:
    exp = expected(hf_home)
    exp = tuple(type(e)(e.key, e.value, e.text, missing, e.derived) for e in exp)
    return {"id": "run1", "api_port": port, "model": "LibertAIDAI/GLM-5.3-Flash-NVFP4", "served_name": "glm",
            "drafter": {"repo": "incoai/GLM-5.3-Flash-DFlash2", "licence": "CC BY-NC-ND 4.0"},
            "boot": {"port_open_s": 1, "health_s": 2, "ttft_s": 3, "timeline": [], "kv_pool": None,
                     "confirm": [c.to_json() for c in judge(exp, boot_text)]}}


def test_status_marks_each_expected_line_seen_or_missing(hf_home):
    record = _record(hf_home, log({k: v for k, v in BLOG.items() if k != "breakable-cuda-graph"}))
    lines = status_lines([], record)
    assert "  missing  Breakable CUDA graph enabled (verify: fail)" in lines
    seen = [line for line in lines if line.startswith("  seen     ")]
    assert len(seen) == 5 and "  seen     Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)" in seen


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

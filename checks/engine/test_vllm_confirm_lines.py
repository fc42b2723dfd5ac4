"""The confirm lines (launch.bootlines.CONFIRM) and the drafter-group fatal lines against what vLLM 0.32 and its
torch print: each format string read from the installed tree with `ast`, filled with a value, then judged as launch
judges the head's log. The value read back must be the one put in; torch's setStorage error is made for real."""

from __future__ import annotations

import subprocess

import pytest
from vllm_sources import find_strings, installed_root
from vllm_venv import vllm_python

from sparkstack.launch.bootlines import CONFIRM
from sparkstack.launch.confirm import Expected, judge
from sparkstack.launch.timeline import parse_rank

STAMP = "2026-10-18T10:00:12.500000000Z"
LINES = {c.key: c for c in CONFIRM}


def head_log(text: str, file: str = "x.py") -> str:
    return f"{STAMP} (Worker_TP0 pid=312) INFO 10-18 10:00:12 [{file}:1] {text}\n"


def fill(template: str, *values: str) -> str:
    """A found string with its fields filled in order: `{}` (f-string) or `%s` (logger), as vLLM would print it."""
    for v in values:
        template = template.replace("{}", v, 1) if "{}" in template else template.replace("%s", v, 1)
    return template


# key -> (a phrase of vLLM's own string, the values it is printed with, the value the line must read back)
PRINTED = {
    "nvfp4-moe-backend": ("NvFp4 MoE backend out", ("MARLIN", "['MARLIN', 'FLASHINFER_CUTLASS']"), "MARLIN"),
    "eagle3-aux-layers": ("Using Eagle3 auxiliary layers from config", (str((6, 15, 25, 34, 43)),),
                          "(6, 15, 25, 34, 43)"),
    "breakable-cuda-graph": ("Breakable CUDA graph enabled", (), None),
    "graph-capture": ("Graph capturing finished", ("41", "1.52"), None),
}


@pytest.mark.parametrize("key", sorted(PRINTED))
def test_vllm_032_prints_what_the_confirm_table_recognises(key):
    needle, values, value = PRINTED[key]
    found = [f for f in find_strings(installed_root(), needle) if f.level != "raise"]  # nvfp4.py returns its line
    assert found, f"vllm 0.32: no log string holds {needle!r}"
    line = LINES[key]
    assert any(f.file == line.source.removeprefix("vllm/") for f in found), [f.file for f in found]
    for f in found:
        text = fill(f.template, *values)
        (judged,) = judge((Expected(key, value, line.shown, "fail"),), head_log(text, f.file))
        assert judged.status == "seen", f"{f.file}:{f.line}: {text!r}"


def test_kv_cache_size_is_read_from_vllms_own_line():
    found = [f for f in find_strings(installed_root(), "KV cache size:") if f.level != "raise"]
    assert found
    for f in found:
        (judged,) = judge((Expected("kv-cache-size", None, "", "fail"),), head_log(f.text()))
        assert judged.status == "seen", f.text()


@pytest.mark.parametrize("needle, values", [
    ("Available KV cache memory", ("9.54",)),  # a profiled pool
    ("as specified by kv_cache_memory_bytes", ("110.21", "9.54")),  # a pinned one: initial free, then reserved
])
def test_the_kv_pools_gib_is_read_from_vllms_own_lines_and_judged_within_one_percent(needle, values):
    found = [f for f in find_strings(installed_root(), needle) if f.level != "raise"]
    assert found and all(f.file == "v1/worker/gpu_worker.py" for f in found), [f.file for f in found]
    pin = Expected("kv-cache-memory", "9.54", "", "fail", within=0.0954)  # 1% of 10,247,694,336 B = 9.5439 GiB
    for f in found:
        (judged,) = judge((pin,), head_log(fill(f.template, *values), f.file))
        assert judged.status == "seen" and "9.54 GiB" in judged.line, f"{f.file}:{f.line}: {f.template!r}"
        (off,) = judge((pin,), head_log(fill(f.template, *values[:-1], "9.44"), f.file))
        assert off.status == "differs", f"{f.file}:{f.line}"


def test_the_modelopt_line_is_the_blogs_image_s_not_vllm_032s():
    """The blog's `Detected ModelOpt NVFP4 checkpoint` line comes from its older image: 0.32 has no such string.
    The recipe still expects it of the image it runs; this says where the format comes from."""
    assert find_strings(installed_root(), "Detected ModelOpt") == []
    assert LINES["modelopt-nvfp4"].source.startswith("the blog's image")


def test_vllm_032s_tail_ring_assertion_is_the_fatal_drafter_group_line():
    """0.32 asserts the ring (tail_kv_cache.shape[2]) against the pool size; a bare assert's traceback shows it."""
    root = installed_root()
    hits = []
    for path in sorted(root.glob("models/glm5next/*/ops/kpool_compress.py")):
        for n, src in enumerate(path.read_text().splitlines(), 1):
            if src.strip().startswith("assert ring >= pool_size"):
                hits.append((path, n, src))
    assert hits, "vllm 0.32 kpool_compress.py: no `assert ring >= pool_size` line"
    for path, n, src in hits:
        log = (f'{STAMP} (Worker_TP0 pid=312) ERROR 10-18 10:00:12 [multiproc_executor.py:801]   File "{path}", '
               f"line {n}, in kpool_compress\n"
               f"{STAMP} (Worker_TP0 pid=312) ERROR 10-18 10:00:12 [multiproc_executor.py:801] {src}\n"
               f"{STAMP} (Worker_TP0 pid=312) ERROR 10-18 10:00:12 [multiproc_executor.py:801] AssertionError: (256, 4)\n")
        tl = parse_rank(0, log, 0.0)
        assert tl.fatal is not None and tl.fatal.key == "drafter-tail-ring", src


def test_torchs_own_set_storage_error_is_the_fatal_drafter_group_line():
    proc = subprocess.run([vllm_python(), "-c", "import torch\ntry:\n    torch.empty(2).as_strided((8,), (1,))\n"
                           "except RuntimeError as e:\n    print(e)\n"], capture_output=True, text=True, timeout=600)
    said = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and said and said[-1].startswith("setStorage: "), proc.stdout + proc.stderr
    tl = parse_rank(0, f"{STAMP} (Worker_TP1 pid=313) ERROR 10-18 10:00:12 [x.py:1] RuntimeError: {said[-1]}\n", 0.0)
    assert tl.fatal is not None and tl.fatal.key == "drafter-set-storage"

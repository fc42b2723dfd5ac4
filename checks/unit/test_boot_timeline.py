"""The boot timeline parser: every line of the boot-line table behind vLLM's prefixes, real-looking logs of recent
and older builds, every line known to be fatal at boot, the warning that is fatal only when it keeps repeating,
the pool."""

import re
from datetime import UTC, datetime

import pytest

from sparkstack.launch.bootlines import BOOT_LINES, PHASES
from sparkstack.launch.plan import plan_launch_from_recipe
from sparkstack.launch.timeline import docker_time, kv_pool, last_lines, parse_rank, timeline_lines
from sparkstack.recipe import load_recipe

START = "2026-05-01T10:00:00.000000000Z"
T0 = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC).timestamp()


def stamp(seconds: float) -> str:
    """A docker --timestamps stamp `seconds` after START, with nanoseconds as docker prints them."""
    whole, frac = divmod(round(seconds * 1e9), 10**9)
    return f"2026-05-01T10:{whole // 60:02d}:{whole % 60:02d}.{frac:09d}Z"


# How vLLM's lines begin, from recent builds back to older ones, and tracebacks (process prefix only, or none).
PREFIXES = [
    "(Worker_TP0 pid=312) INFO 05-01 10:00:12 [gpu_worker.py:298] ",
    "(EngineCore_DP0 pid=250) ERROR 05-01 10:00:12 [core.py:708] ",
    "(APIServer pid=1) INFO:     ",
    "(VllmWorker rank=1 pid=5678) INFO 05-01 10:00:12 [gpu_model_runner.py:1234] ",
    "INFO 05-01 10:00:12 [gpu_model_runner.py:1234] ",
    "INFO 05-01 10:00:12 gpu_model_runner.py:1234] ",
    "WARNING 05-01 10:00:12 [shm_broadcast.py:466] ",
    "(EngineCore_DP0 pid=250) ",
    "",
    "\x1b[1;36m(Worker_TP1 pid=77)\x1b[0;0m INFO 05-01 10:00:12 [gpu_worker.py:298] ",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("line", BOOT_LINES, ids=lambda line: line.key)
def test_every_table_line_is_recognised_behind_every_prefix(line, prefix):
    tl = parse_rank(1, f"{stamp(12.5)} {prefix}{line.line()}\n", T0)
    if line.kind == "phase":
        assert tl.phases == ((line.phase, 12.5),) and tl.fatal is None and tl.warnings == ()
    elif line.kind == "fatal":
        assert tl.fatal.key == line.key and tl.fatal.at_s == 12.5 and tl.phases == ()
        assert tl.fatal.diagnosis == line.diagnosis and len(line.diagnosis) > 40  # says what to try
    else:
        assert [w.key for w in tl.warnings] == [line.key] and tl.fatal is None and tl.phases == ()


def test_the_table_covers_every_phase_and_its_lines_are_distinct():
    assert {line.phase for line in BOOT_LINES if line.kind == "phase"} == set(PHASES)
    assert len({line.key for line in BOOT_LINES}) == len(BOOT_LINES)
    for line in BOOT_LINES:  # each sample matches its own pattern and no other
        hits = [other.key for other in BOOT_LINES if re.search(other.pattern, line.line())]
        assert hits == [line.key], (line.key, hits)


# A head and a worker as they really log (hand-written after public logs; not from the table's samples).
HEAD = [
    (3.1, "(APIServer pid=1) INFO 05-01 10:00:03 [utils.py:326] non-default args: {'max_model_len': 524288}"),
    (301.52, "(Worker_TP0 pid=312) INFO 05-01 10:05:01 [default_loader.py:267] Loading weights took 288.75 seconds"),
    (302.25, ("(Worker_TP0 pid=312) INFO 05-01 10:05:02 [gpu_model_runner.py:2653] Model loading took 88.07 GiB "
              "memory and 299.40 seconds")),
    (530.0, "(Worker_TP0 pid=312) INFO 05-01 10:08:50 [gpu_worker.py:298] Available KV cache memory: 9.54 GiB"),
    (531.5, "(EngineCore_DP0 pid=250) INFO 05-01 10:08:51 [kv_cache_utils.py:1087] GPU KV cache size: 989,727 tokens"),
    (531.5, ("(EngineCore_DP0 pid=250) INFO 05-01 10:08:51 [kv_cache_utils.py:1091] Maximum concurrency for 524,288 "
             "tokens per request: 1.89x")),
    (610.25, ("(Worker_TP0 pid=312) INFO 05-01 10:10:10 [gpu_model_runner.py:3480] Graph capturing finished in 41 secs, "
              "took 1.20 GiB")),
    (612.0, ("(EngineCore_DP0 pid=250) INFO 05-01 10:10:12 [core.py:210] init engine (profile, create kv cache, warmup "
             "model) took 309.48 seconds")),
    (640.75, "(APIServer pid=1) INFO:     Application startup complete."),
]
OLDER_WORKER = [  # an older build: no process prefix, `Model loading took X GiB and Y seconds`, eager (no graphs)
    (290.0, "INFO 03-20 10:04:50 [gpu_model_runner.py:1329] Model loading took 88.07 GiB and 288.31 seconds"),
    (525.0, "INFO 03-20 10:08:45 [gpu_worker.py:227] Available KV cache memory: 5.12 GiB"),
]


def as_logs(lines):
    return "".join(f"{stamp(at)} {text}\n" for at, text in lines)


def test_a_real_looking_head_log_gives_each_phase_at_its_time():
    tl = parse_rank(0, as_logs(HEAD), T0)
    assert dict(tl.phases) == {"weights loaded": 301.52, "KV profiled": 530.0, "graphs captured": 610.25,
                               "engine ready": 612.0, "API ready": 640.75}
    assert [p for p, _ in tl.phases] == list(PHASES)
    assert (tl.kv_gib, tl.kv_tokens, tl.concurrency) == (9.54, 989727, 1.89)
    assert tl.fatal is None and tl.warnings == ()


def test_an_older_build_and_out_of_order_streams():
    # docker hands stdout and stderr over one after the other: the times, not the order, decide.
    logs = as_logs(OLDER_WORKER[1:]) + as_logs(OLDER_WORKER[:1])
    tl = parse_rank(1, logs, T0)
    assert dict(tl.phases) == {"weights loaded": 290.0, "KV profiled": 525.0}
    assert tl.kv_gib == 5.12 and tl.kv_tokens is None
    assert last_lines(logs, 2).splitlines() == [text for _, text in OLDER_WORKER]


def test_seconds_count_from_this_container_start():
    later_start = docker_time("2026-05-01T10:01:00.500000000Z")
    assert later_start == T0 + 60.5
    tl = parse_rank(1, as_logs(OLDER_WORKER), later_start)
    assert dict(tl.phases)["weights loaded"] == 290.0 - 60.5


# Every line known to be fatal at boot (from upstream reports), as a rank prints it; the key is the test author's,
# not read from the table.
FATAL = {
    "kv-page-size": "(EngineCore_DP0 pid=250) NotImplementedError: layers.3.self_attn.indexer.k_cache: page size is "
                    "not divisible by the maximum page size and cannot be padded",
    "nv-no-memory": "(Worker_TP0 pid=312) RuntimeError: CUDA driver error: NV_ERR_NO_MEMORY",
    "cuda-oom": "(Worker_TP0 pid=312) ERROR 05-01 10:06:00 [multiproc_executor.py:671] CUDA out of memory. Tried to "
                "allocate 2.00 GiB",
    "torch-oom": "(Worker_TP1 pid=88) torch.OutOfMemoryError: Tried to allocate 2.00 GiB",
    "no-cache-blocks": "(EngineCore_DP0 pid=250) ValueError: No available memory for the cache blocks. Try increasing "
                       "`gpu_memory_utilization` when initializing the engine.",
    "free-memory": "(EngineCore_DP0 pid=250) ValueError: Free memory on device cuda:0 (104.46/121.69 GiB) on startup "
                   "is less than desired GPU memory utilization (0.9, 109.52 GiB).",
    "nccl-internal": "(Worker_TP0 pid=312) torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356,"
                     " internal error - please report this issue to the NCCL developers, NCCL version 2.29.7",
    "shm-cancelled": "(Worker_TP1 pid=88) RuntimeError: cancelled",
    # The blog's drafter-group failures (issue 29): its image's assert, as a traceback shows its source line, and
    # torch's out-of-bounds view.
    "drafter-tail-ring": "(Worker_TP0 pid=312) ERROR 05-01 10:06:00 [multiproc_executor.py:801]     assert "
                         "tail_kv_cache.shape[2] == pool_size",
    "drafter-set-storage": "(Worker_TP1 pid=88) RuntimeError: setStorage: sizes [64, 2304, 576], strides [1327104, 576, "
                           "1], storage offset 0, and itemsize 2 requiring a storage size of 169869312 are out of "
                           "bounds for storage of size 84934656",
}


def test_every_fatal_line_in_the_table_is_tested_here():
    assert {line.key for line in BOOT_LINES if line.kind == "fatal"} == set(FATAL)


@pytest.mark.parametrize("key", sorted(FATAL))
def test_each_fatal_line_after_a_normal_start(key):
    tl = parse_rank(0, as_logs(HEAD[:3] + [(400.0, FATAL[key]), (401.0, FATAL["shm-cancelled"])]), T0)
    assert tl.fatal.key == key and tl.fatal.at_s == 400.0  # the first fatal line is the one reported
    assert dict(tl.phases) == {"weights loaded": 301.52}


@pytest.mark.parametrize("text", [
    "(Worker_TP0 pid=312) INFO 05-01 10:00:12 [gpu_worker.py:298] Free memory on device cuda:0 on startup: 118.2 GiB",
    "(Worker_TP0 pid=312) INFO 05-01 10:00:12 [custom_all_reduce.py:40] NCCL version 2.30.7",
    "(EngineCore_DP0 pid=250) RuntimeError: cancelled by the user, retrying",
    "(APIServer pid=1) INFO 05-01 10:00:12 [api_server.py:1] Maximum concurrency is not set",
    "(Worker_TP0 pid=312) INFO 05-01 10:00:12 [gpu_model_runner.py:3400] Capturing CUDA graphs (PIECEWISE): 50%",
])
def test_near_misses_are_neither_phases_nor_fatal(text):
    tl = parse_rank(0, f"{stamp(1)} {text}\n", T0)
    assert tl.phases == () and tl.fatal is None and tl.warnings == ()


SHM = "(EngineCore_DP0 pid=250) WARNING 05-01 10:00:12 [shm_broadcast.py:466] No available shared memory broadcast " \
      "block found in 60 seconds. This typically happens when some processes are hanging."


def test_the_shared_memory_warning_alone_is_reported_not_fatal():
    tl = parse_rank(0, as_logs(HEAD[:3] + [(400.0, SHM), (460.0, SHM)] + HEAD[3:]), T0)
    assert tl.fatal is None and [w.at_s for w in tl.warnings] == [400.0, 460.0]
    assert len(tl.phases) == len(PHASES)


def test_the_shared_memory_warning_repeating_for_a_whole_boot_is_fatal():
    every_minute = [(300.0 + 60 * i, SHM) for i in range(16)]  # 15 minutes without a break
    tl = parse_rank(0, as_logs(HEAD[:3] + every_minute), T0)
    assert tl.fatal.key == "shm-broadcast-wait" and tl.fatal.at_s == 300.0 + 60 * 15
    assert "900 s" in tl.fatal.diagnosis


def test_the_shared_memory_warning_with_breaks_is_not_fatal():
    bursts = [(300.0 + 60 * i, SHM) for i in range(4)] + [(900.0 + 60 * i, SHM) for i in range(4)] + \
             [(1500.0 + 60 * i, SHM) for i in range(4)]  # three 3-minute stalls, each recovered
    tl = parse_rank(0, as_logs(bursts), T0)
    assert tl.fatal is None and len(tl.warnings) == 12


def test_docker_time_keeps_the_microseconds():
    assert docker_time("2026-05-01T10:00:12.123456789Z") == pytest.approx(T0 + 12.123456, abs=1e-6)
    assert docker_time("2026-05-01T12:00:12+02:00") == T0 + 12


def test_the_pool_is_the_minimum_across_ranks_in_bytes_and_tokens(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    plan = plan_launch_from_recipe(load_recipe(None), {"HF_HOME": str(tmp_path)})
    head, worker = parse_rank(0, as_logs(HEAD), T0), parse_rank(1, as_logs(OLDER_WORKER), T0)
    pool = kv_pool(plan, [head, worker])
    want = round(5.12 * 2**30)  # the worker's 5.12 GiB
    assert (pool.kv_bytes, pool.smallest_rank, pool.ranks) == (want, 1, (0, 1))
    assert pool.tokens == want * 989727 // 10247694336  # the recipe's measured point: 10,247,694,336 B = 989,727 tokens
    lines = timeline_lines([head.to_json(), worker.to_json()], pool.to_json())
    assert "  rank 1: weights loaded 290.0 s, KV profiled 525.0 s; Available KV cache memory 5.12 GiB" in lines
    assert lines[-1].endswith(f"{want:,} B = {want * 989727 // 10247694336:,} tokens at 10,354.06 B/token")
    assert kv_pool(plan, [parse_rank(0, "", T0)]) is None


def test_a_container_with_two_workers_counts_its_smaller_kv_figure():
    logs = as_logs([(500.0, "(Worker_TP0 pid=312) INFO 05-01 10:08:20 [gpu_worker.py:298] Available KV cache memory: 9.54 GiB"),
                    (501.0, "(Worker_TP1 pid=313) INFO 05-01 10:08:21 [gpu_worker.py:298] Available KV cache memory: 8.75 GiB")])
    tl = parse_rank(0, logs, T0)
    assert tl.kv_gib == 8.75 and dict(tl.phases) == {"KV profiled": 500.0}


@pytest.mark.parametrize("figure", ["1.2.3", "..", "9" * 5000, "1e999", "-4.0"])
def test_a_mangled_figure_is_no_figure_and_no_crash(figure):
    logs = as_logs([(1.0, f"(Worker_TP0 pid=3) INFO 05-01 10:00:01 [gpu_worker.py:298] Available KV cache memory: {figure} GiB"),
                    (2.0, f"(EngineCore_DP0 pid=2) INFO 05-01 10:00:02 [kv_cache_utils.py:1087] GPU KV cache size: {figure} tokens"),
                    (3.0, "(EngineCore_DP0 pid=2) INFO 05-01 10:00:03 [kv_cache_utils.py:1087] GPU KV cache size: , tokens")])
    tl = parse_rank(0, logs, T0)
    assert (tl.kv_gib, tl.kv_tokens, tl.phases) == (None, None, ())

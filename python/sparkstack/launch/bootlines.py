"""The boot lines vLLM prints, as data: the phases of a boot, the lines that are fatal, the one warning. The
timeline parser, launch's boot wait and the lab's stand-in engine all read this one table.

Each pattern is searched in the text after vLLM's prefix (`(Worker_TP0 pid=...) INFO 05-01 10:00:00
[file.py:N] `). Named groups are the figures a line carries. `sample` is that text as vLLM prints it, with
str.format fields named like the groups; SAMPLE_FIGURES fills the ones a caller leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass

PHASES = ("weights loaded", "KV profiled", "graphs captured", "engine ready", "API ready")


@dataclass(frozen=True)
class BootLine:
    key: str
    kind: str  # phase | fatal | warning
    pattern: str
    sample: str
    phase: str | None = None  # kind "phase": which of PHASES the line marks
    diagnosis: str = ""  # fatal and warning: what it usually means; what to try
    repeats_every_s: float | None = None  # warning: how often vLLM repeats it while the condition lasts
    fatal_after_s: float | None = None  # warning: fatal once it has repeated without a break this long

    def line(self, **figures: str) -> str:
        return self.sample.format(**{**SAMPLE_FIGURES, **figures})


SAMPLE_FIGURES = {"seconds": "301.52", "gib": "88.07", "kv_gib": "9.54", "kv_tokens": "989,727",
                  "max_len": "524,288", "concurrency": "1.89"}

_OOM = ("the engine ran out of GPU memory: drop the page cache on every rank (launch --drop-caches), stop other "
        "GPU users, then lower GPU_MEM_UTIL, the KV pin (KV_CACHE_MEMORY) or MAX_NUM_BATCHED_TOKENS")

BOOT_LINES = (
    BootLine("loading-weights", "phase", r"^Loading weights took [\d.]+ seconds", "Loading weights took {seconds} seconds",
             phase="weights loaded"),
    BootLine("model-loading", "phase", r"^Model loading took [\d.]+ GiB memory and [\d.]+ seconds",
             "Model loading took {gib} GiB memory and {seconds} seconds", phase="weights loaded"),
    BootLine("model-loading-older", "phase", r"^Model loading took [\d.]+ GiB and [\d.]+ seconds",
             "Model loading took {gib} GiB and {seconds} seconds", phase="weights loaded"),
    BootLine("kv-memory", "phase", r"^Available KV cache memory: (?P<kv_gib>\d{1,6}(?:\.\d{1,6})?) GiB",
             "Available KV cache memory: {kv_gib} GiB", phase="KV profiled"),
    # A pinned pool (--kv-cache-memory-bytes): the GPU worker skips profiling and says what it reserved instead.
    BootLine("kv-memory-pinned", "phase",
             r"^Initial free memory [\d.]+ ?GiB, reserved (?P<kv_gib>\d{1,6}(?:\.\d{1,6})?) GiB memory for KV Cache "
             r"as specified by kv_cache_memory_bytes",
             "Initial free memory 110.21 GiB, reserved {kv_gib} GiB memory for KV Cache as specified by "
             "kv_cache_memory_bytes config and skipped memory profiling.", phase="KV profiled"),
    # CPU builds: the KV space VLLM_CPU_KVCACHE_SPACE set (or what the worker chose), where GPU builds profile it.
    BootLine("kv-memory-cpu", "phase",
             r"^(?:Explicitly|Auto) set \((?P<kv_gib>\d{1,6}(?:\.\d{1,6})?)/[\d.]+\) GiB for KV cache on node \d+",
             "Explicitly set ({kv_gib}/14.46) GiB for KV cache on node 0.", phase="KV profiled"),
    # The device comes first: "GPU", "CPU", "XPU", "GPU + host" (0.32 names it; older builds always said GPU).
    # 0.32 prints the size and the concurrency as one line, older builds as two.
    BootLine("kv-tokens", "phase",
             r"^(?:\w+(?: \+ \w+)* )?KV cache size: (?P<kv_tokens>\d{1,3}(?:,?\d{3}){0,5}) tokens",
             "GPU KV cache size: {kv_tokens} tokens", phase="KV profiled"),
    BootLine("max-concurrency", "phase",
             r"(?:^|, )Maximum concurrency for [\d,]+ tokens per request: (?P<concurrency>\d{1,9}(?:\.\d{1,6})?)x",
             "Maximum concurrency for {max_len} tokens per request: {concurrency}x", phase="KV profiled"),
    # gpu_model_runner.py's `Graph capturing finished in %.0f secs, took %.2f GiB`: the capture's time and memory.
    BootLine("graphs-captured", "phase",
             r"^Graph capturing finished\b(?: in (?P<graph_s>\d{1,9}(?:\.\d{1,6})?) secs?, "
             r"took (?P<graph_gib>-?\d{1,6}(?:\.\d{1,6})?) GiB)?",
             "Graph capturing finished in {seconds} secs, took {gib} GiB", phase="graphs captured"),
    # " s" from 0.32 on (with "(compilation: ...)" after it when compiling), " seconds" before.
    BootLine("engine-ready", "phase",
             r"^init engine \(profile, create kv cache, warmup model\) took [\d.]+ s(?:econds)?\b",
             "init engine (profile, create kv cache, warmup model) took {seconds} seconds", phase="engine ready"),
    BootLine("api-ready", "phase", r"^Application startup complete\.", "Application startup complete.",
             phase="API ready"),
    # 0.13 words it "The page size of the layer is not divisible by the maximum page size. Cannot unify ...".
    BootLine("kv-page-size", "fatal", r"page size (?:of the layer )?is not divisible by the maximum page size",
             "NotImplementedError: layers.3.self_attn.indexer.k_cache: page size is not divisible by the maximum "
             "page size and cannot be padded",
             diagnosis="KV page sizes cannot be unified (the MXFP8 drafter on GB10): use a drafter whose per-token "
                       "page divides the MLA page, or the drafter-group patch (`sparkstack plan kv` shows the check)"),
    BootLine("nv-no-memory", "fatal", r"NV_ERR_NO_MEMORY", "NV_ERR_NO_MEMORY",
             diagnosis="the driver could not allocate unified memory (page cache or another process holds it): "
                       "drop caches on every rank (launch --drop-caches) and stop other GPU users"),
    BootLine("cuda-oom", "fatal", r"CUDA out of memory", "CUDA out of memory", diagnosis=_OOM),
    BootLine("torch-oom", "fatal", r"torch\.OutOfMemoryError", "torch.OutOfMemoryError", diagnosis=_OOM),
    BootLine("no-cache-blocks", "fatal", r"No available memory for the cache blocks",
             "No available memory for the cache blocks",
             diagnosis="weights and activations left nothing for the KV cache: raise GPU_MEM_UTIL or set a KV pin "
                       "(KV_CACHE_MEMORY), after dropping caches"),
    BootLine("free-memory", "fatal",
             # 0.32 names the device (cuda:0), 0.10-0.13 do not; the CPU build says "Available memory on node 0".
             r"(?:Free|Available) memory on (?:device|node)(?: \S+)? \([^)]*\) on startup is less than desired "
             r"(?:GPU|CPU) memory utilization",
             "ValueError: Free memory on device cuda:0 (104.46/121.69 GiB) on startup is less than desired GPU "
             "memory utilization",
             diagnosis="free memory at start is below gpu-memory-utilization x total: drop the page cache on every "
                       "rank (launch --drop-caches), stop other GPU users, or lower GPU_MEM_UTIL"),
    BootLine("nccl-internal", "fatal", r"NCCL\b.*\binternal error", "NCCL error: internal error (NCCL 2.29.7)",
             diagnosis="NCCL failed on the fabric; NCCL 2.29.7 (pulled in by the instanttensor wheel) does this: "
                       "keep nvidia-nccl-cu13==2.30.7 in the image, and check CX_NIC/CX_HCA on both ranks"),
    BootLine("shm-cancelled", "fatal", r"^RuntimeError: cancelled$", "RuntimeError: cancelled",
             diagnosis="the shared-memory broadcast was cancelled (shm_broadcast.py) because a peer process died: "
                       "find the first error in the other rank's log, then restart both ranks"),
    # The blog's drafter-group failures. Its image asserted `tail_kv_cache.shape[2] == pool_size`; 0.32's
    # models/glm5next/*/ops/kpool_compress.py asserts `ring >= pool_size and ring % pool_size == 0` on the same ring
    # (ring = tail_kv_cache.shape[2]). A bare assert: the traceback's source line is what names it.
    BootLine("drafter-tail-ring", "fatal",
             r"assert (?:tail_kv_cache\.shape\[2\] == pool_size|ring >= pool_size and ring % pool_size == 0)\b",
             "assert tail_kv_cache.shape[2] == pool_size",
             diagnosis="the drafter's KV landed in the GLM indexer's group, whose tail-cache ring must match the "
                       "indexer's pool size (the blog's drafter-group failure): build the image with the "
                       "glm5_drafter_group patch (`sparkstack patch check` shows it applied) and keep the recipe's "
                       "--block-size; `sparkstack plan kv` shows whether the drafter rides the MLA page"),
    # torch's checkInBoundsForStorage (c10), when a KV view is laid over a smaller allocation.
    BootLine("drafter-set-storage", "fatal",
             r"setStorage: sizes \[[^\]]*\], strides \[[^\]]*\],.*? out of bounds for storage of size \d+",
             "RuntimeError: setStorage: sizes [1024, 2304, 1, 576], strides [1327104, 576, 576, 1], storage offset 0, "
             "and itemsize 1 requiring a storage size of 1358954496 are out of bounds for storage of size 1358954495",
             diagnosis="a KV cache view is larger than the storage allocated for it: the drafter's KV tensors were "
                       "sized for another group's page (the blog's drafter-group failure): check that the image has "
                       "the glm5_drafter_group patch (`sparkstack patch check`) and that --block-size and "
                       "--kv-cache-dtype are the ones the recipe's page figures are for (`sparkstack plan kv`)"),
    # 0.10-0.11 log it at debug level as "in 60 second."; 0.13 on as a warning, "in 60 seconds. ...".
    BootLine("shm-broadcast-wait", "warning", r"No available shared memory broadcast block found in \d+ seconds?\b",
             "No available shared memory broadcast block found in 60 seconds",
             diagnosis="a process waited 60 s for the others (long loads and compiles do this, and it can recover); "
                       "if it keeps repeating, a rank hangs: read the other rank's log",
             repeats_every_s=60.0, fatal_after_s=600.0),
)

@dataclass(frozen=True)
class ConfirmLine:
    """A line a recipe may expect its boot to show (the blog confirms these by eye). `pattern` is searched in the
    message; its group `value`, where it has one, is the part the recipe decides (derived in launch/confirm.py).
    `sample` is the line as it is printed, `{value}` where the value goes; `source` says whose format string it is."""

    key: str
    pattern: str
    sample: str
    source: str
    shown: str  # the line as expected while its value is not decided
    graphs_only: bool = False  # printed only when CUDA graphs are on: not expected under --enforce-eager


# Searched anywhere in the message, not from its start: a line printed behind a prefix the timeline does not know
# (the lab's stand-in, `[standin]`) is still that line.
CONFIRM = (
    # Not in vLLM 0.32's sources: the blog's image (an older fork) prints it; 0.32 has no such log line.
    ConfirmLine("modelopt-nvfp4", r"Detected ModelOpt NVFP4 checkpoint\b(?: \(quant_algo=(?P<value>\w+)\))?",
                "Detected ModelOpt NVFP4 checkpoint (quant_algo={value})", "the blog's image (its boot log)",
                "Detected ModelOpt NVFP4 checkpoint"),
    ConfirmLine("nvfp4-moe-backend", r"Using '(?P<value>\w+)' NvFp4 MoE backend\b",
                "Using '{value}' NvFp4 MoE backend out of potential backends: ['MARLIN']",
                "vllm/model_executor/layers/fused_moe/oracle/nvfp4.py", "Using '...' NvFp4 MoE backend"),
    ConfirmLine("eagle3-aux-layers", r"Using Eagle3 auxiliary layers from config: (?P<value>\([\d, ]*\))",
                "Using Eagle3 auxiliary layers from config: {value}",
                "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py", "Using Eagle3 auxiliary layers from config: ..."),
    # The pool's GiB (format_gib: two decimals), as the worker says it reserved a pin or profiled the pool.
    ConfirmLine("kv-cache-memory",
                r"(?:Available KV cache memory: |GiB, reserved )(?P<value>\d{1,6}(?:\.\d{1,6})?) GiB",
                "Available KV cache memory: {value} GiB", "vllm/v1/worker/gpu_worker.py",
                "Available KV cache memory: ... GiB"),
    ConfirmLine("kv-cache-size", r"(?:\w+(?: \+ \w+)* )?KV cache size: (?P<value>\d{1,3}(?:,?\d{3}){0,5}) tokens",
                "GPU KV cache size: {value} tokens", "vllm/v1/core/kv_cache_utils.py", "KV cache size: ... tokens"),
    ConfirmLine("breakable-cuda-graph", r"Breakable CUDA graph enabled\b", "Breakable CUDA graph enabled",
                "vllm/compilation/breakable_cudagraph.py", "Breakable CUDA graph enabled", graphs_only=True),
    ConfirmLine("graph-capture", r"Graph capturing finished\b", "Graph capturing finished in {value} secs, took 1.52 GiB",
                "vllm/v1/worker/gpu_model_runner.py", "Graph capturing finished", graphs_only=True),
)


def _confirm_keys_agree() -> None:
    from sparkstack.recipe import CONFIRM_KEYS  # a recipe names these keys; the table gives their patterns

    assert tuple(c.key for c in CONFIRM) == CONFIRM_KEYS, "launch.bootlines.CONFIRM and recipe.CONFIRM_KEYS differ"


_confirm_keys_agree()

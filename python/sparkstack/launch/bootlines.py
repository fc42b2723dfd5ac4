"""The boot lines vLLM prints (FACTS.md §7), as data: the phases of a boot, the lines that are fatal, the one
warning. The timeline parser, launch's boot wait and the lab's stand-in engine all read this one table.

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
    BootLine("graphs-captured", "phase", r"^Graph capturing finished\b",
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
    # 0.10-0.11 log it at debug level as "in 60 second."; 0.13 on as a warning, "in 60 seconds. ...".
    BootLine("shm-broadcast-wait", "warning", r"No available shared memory broadcast block found in \d+ seconds?\b",
             "No available shared memory broadcast block found in 60 seconds",
             diagnosis="a process waited 60 s for the others (long loads and compiles do this, and it can recover); "
                       "if it keeps repeating, a rank hangs: read the other rank's log",
             repeats_every_s=60.0, fatal_after_s=600.0),
)

# Lines FACTS.md §2 lists to confirm the image is the one we built; seen on the head, reported, never fatal.
CONFIRM_LINES = (
    "Detected ModelOpt NVFP4 checkpoint (quant_algo=NVFP4)",
    "Using 'MARLIN' NvFp4 MoE backend",
    "Using Eagle3 auxiliary layers from config: (6, 15, 25, 34, 43)",
    "GPU KV cache size:",
    "Graph capturing finished",
)

"""The KV inputs of a launch plan, read from the head's engine argv: the one derivation `plan kv` and preflight share."""

from __future__ import annotations

from dataclasses import dataclass

from sparkstack.errors import SparkstackError
from sparkstack.launch.plan import LaunchPlan
from sparkstack.recipe.kv import KvPlan, plan_kv

KV_FLAGS = ("--kv-cache-memory", "--kv-cache-memory-bytes")  # one flag, two spellings
DEFAULT_BLOCK_SIZE = 16  # vLLM's default when the argv sets none


@dataclass(frozen=True)
class KvInputs:
    kv_bytes: int | None  # the pin, when the argv sets one
    block_size: int
    max_model_len: int
    kv_dtype: str | None = None  # --kv-cache-dtype: which page figures apply


def _flag_int(args: list[str], flag: str) -> int | None:
    if flag not in args:
        return None
    i = args.index(flag)
    value = args[i + 1] if i + 1 < len(args) else ""
    if not value.isdigit():
        raise SparkstackError(f"{flag} {value!r}: expected a whole number")
    return int(value)


def argv_kv_bytes(args: list[str] | tuple[str, ...]) -> int | None:
    """The KV pin an argv sets (either spelling of the flag), or None: a launch plan's or a run record's argv. A pin
    of 0 is None: vLLM's GPU worker reads a falsy kv_cache_memory_bytes as no pin, and profiles the pool."""
    args = list(args)
    kv_bytes = None
    for flag in KV_FLAGS:
        kv_bytes = _flag_int(args, flag) if flag in args else kv_bytes
    return kv_bytes or None


def kv_inputs(plan: LaunchPlan) -> KvInputs:
    args = list(plan.ranks[0].docker_run)
    kv_bytes = argv_kv_bytes(args)
    block = _flag_int(args, "--block-size") or DEFAULT_BLOCK_SIZE
    max_len = _flag_int(args, "--max-model-len") or int(plan.knobs["MAX_MODEL_LEN"])
    i = args.index("--kv-cache-dtype") if "--kv-cache-dtype" in args else -1
    dtype = args[i + 1] if 0 <= i < len(args) - 1 else None
    return KvInputs(kv_bytes, block, max_len, dtype)


def plan_launch_kv(plan: LaunchPlan, kv_bytes: int | None = None) -> KvPlan:
    """The KV plan for a launch plan; `kv_bytes` overrides the argv's pin (`plan kv --kv-bytes`)."""
    inputs = kv_inputs(plan)
    return plan_kv(plan.recipe.kv, inputs.kv_bytes if kv_bytes is None else kv_bytes, inputs.max_model_len,
                   inputs.block_size, inputs.kv_dtype)


def pool_too_small(plan: LaunchPlan, environ) -> str | None:
    """The one line refusing a KV pin that holds less than one max-model-len sequence (vLLM refuses such a pool at
    start, 15 minutes into a boot); None when it holds one, or when the pool is the profiler's to size."""
    kv = plan_launch_kv(plan)
    if kv.tokens is None or kv.coverage is None or kv.tokens >= kv.max_model_len:
        return None
    needed = -(-kv.max_model_len * kv.per_token_bytes // 1)
    pin = f"the KV pin ({' or '.join(KV_FLAGS)} in {plan.recipe.name}'s args)"
    if environ.get("MAX_MODEL_LEN") and not environ.get("KV_CACHE_MEMORY"):  # what the user just changed goes first
        return (f"MAX_MODEL_LEN={environ['MAX_MODEL_LEN']}: one sequence of {kv.max_model_len:,} tokens needs at least "
                f"{int(needed):,} B of KV cache at {kv.per_token_bytes:,.2f} B per token, but {pin} is a pool of "
                f"{kv.kv_bytes:,} B, {kv.tokens:,} tokens: vLLM would refuse to start; use MAX_MODEL_LEN of at most "
                f"{kv.tokens:,}, or raise the pin (KV_CACHE_MEMORY), or leave the pool to the profiler (KV_CACHE_MEMORY=)")
    given = f"KV_CACHE_MEMORY={environ['KV_CACHE_MEMORY']}" if environ.get("KV_CACHE_MEMORY") else \
        f"the KV pin ({' or '.join(KV_FLAGS)} in {plan.recipe.name}'s args, or KV_CACHE_MEMORY)"
    return (f"{given}: a pool of {kv.kv_bytes:,} B holds {kv.tokens:,} tokens, less than one max-model-len sequence "
            f"({kv.max_model_len:,} tokens needs at least {int(needed):,} B at {kv.per_token_bytes:,.2f} B per token): "
            "vLLM would refuse to start; raise the pin, lower MAX_MODEL_LEN, or leave the pool to the profiler "
            "(KV_CACHE_MEMORY=)")

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
    """The KV pin an argv sets (either spelling of the flag), or None: a launch plan's or a run record's argv."""
    args = list(args)
    kv_bytes = None
    for flag in KV_FLAGS:
        kv_bytes = _flag_int(args, flag) if flag in args else kv_bytes
    return kv_bytes


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

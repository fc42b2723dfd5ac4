"""The knob tables: the seed launcher's knobs with their defaults and kinds, the engine flags whose values are
checked, the knobs a plain recipe may set in its [env], and the [[nodes]] keys."""

from __future__ import annotations

from sparkstack.recipe.values import (
    Kind, byte_count, cache_name, container_name, count, eager, fraction, hca, hf_home, host, image_ref, ip_address,
    ipv4, nic, node_rank, not_a_flag, or_empty, port, spec_json, ssh_target, text, token, word,
)

# The seed launcher's knobs and their tuned defaults (the knob table in docs/commands/launch.md). An empty
# environment reproduces the published numbers.
KNOB_DEFAULTS: dict[str, str] = {
    "IMAGE": "glm53-dflash2-tony:v1",
    "NAME": "glm53-tony-rank{rank}",
    "SERVED_NAME": "LibertAIDAI/GLM-5.3-Flash-NVFP4",
    "MODEL_CACHE_NAME": "models--LibertAIDAI--GLM-5.3-Flash-NVFP4-no-MTP",
    "DRAFT_CACHE_NAME": "models--incoai--GLM-5.3-Flash-DFlash2",
    "HF_HOME": "~/.cache/huggingface",
    "LOAD_FORMAT": "",
    "EAGER": "0",
    "NUM_SPEC_TOKENS": "4",
    "GPU_MEM_UTIL": "0.90",
    "KV_CACHE_MEMORY": "10247694336",
    "OMP_NUM_THREADS": "8",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "MAX_NUM_BATCHED_TOKENS": "8192",
    "API_PORT": "8888",
    "MAX_MODEL_LEN": "524288",
    "MAX_NUM_SEQS": "6",
    "MOE_BACKEND": "marlin",
    "WORKER_SSH": "user@worker-node",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29521",
    "CX_NIC": "enp1s0f1np1",
    "CX_HCA": "rocep1s0f1",
}

# Every knob's kind. An empty value is refused unless it means something (LOAD_FORMAT off, EAGER off,
# KV_CACHE_MEMORY set but empty drops the pin, as in the seed launcher).
KNOB_KINDS: dict[str, Kind] = {
    "IMAGE": image_ref, "NAME": container_name, "SERVED_NAME": text, "MODEL_CACHE_NAME": cache_name,
    "DRAFT_CACHE_NAME": cache_name, "HF_HOME": hf_home, "LOAD_FORMAT": or_empty(word), "EAGER": eager,
    "NUM_SPEC_TOKENS": count, "GPU_MEM_UTIL": fraction, "KV_CACHE_MEMORY": or_empty(byte_count),
    "OMP_NUM_THREADS": count, "VLLM_CPU_OMP_THREADS_BIND": token, "MAX_NUM_BATCHED_TOKENS": count,
    "API_PORT": port, "MAX_MODEL_LEN": count, "MAX_NUM_SEQS": count, "MOE_BACKEND": word,
    "WORKER_SSH": ssh_target, "MASTER_ADDR": ip_address, "MASTER_PORT": port, "CX_NIC": nic, "CX_HCA": hca,
}
assert KNOB_KINDS.keys() == KNOB_DEFAULTS.keys()
CACHE_NAME_KNOBS = ("DRAFT_CACHE_NAME", "MODEL_CACHE_NAME")
# The knobs that are container environment variables, which a plain recipe may also set in its [env]; in the
# order the seed launcher passes them to `docker run -e`.
ENV_KNOBS = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")

# Engine flags that take a value, with the kind of value where sparkstack reads, sets or derives it.
VALUE_FLAGS: dict[str, Kind] = {
    "--served-model-name": text, "--host": host, "--port": port, "--tensor-parallel-size": count,
    "--distributed-executor-backend": word, "--nnodes": count, "--node-rank": node_rank, "--master-addr": host,
    "--master-port": port, "--load-format": word, "--max-model-len": count, "--max-num-seqs": count,
    "--max-num-batched-tokens": count, "--moe-backend": word, "--gpu-memory-utilization": fraction,
    "--kv-cache-memory-bytes": byte_count, "--kv-cache-dtype": word,
    "--block-size": count, "--speculative-config": spec_json, "--tool-call-parser": not_a_flag,
    "--reasoning-parser": not_a_flag,
}

# [[nodes]] keys filled per rank, the kind of the filled value, and the placeholders they may use.
NODE_KINDS: dict[str, Kind] = {"ssh": ssh_target, "fabric_ip": ipv4, "nic": nic, "hca": hca, "docker_host": token}
PLACEHOLDERS = frozenset({"rank", *KNOB_DEFAULTS})
RECIPE_ONLY_ENV = {"VLLM_HOST_IP": "it is derived per rank from fabric_ip",
                   "VLLM_API_KEY": "a recipe value would appear in argv; set it in the environment"}

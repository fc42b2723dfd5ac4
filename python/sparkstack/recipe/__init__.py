"""Recipes: the existing TOML recipe shape, plus knobs, nodes, status, drafter and KV geometry.

Loading validates everything and turns the recipe into frozen data; nothing here
touches the host.
"""

from __future__ import annotations

import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sparkstack import shipped
from sparkstack.errors import SparkstackError

DEFAULT_RECIPE = "glm53-flash-dflash2-nvfp4"

# The old launcher's knobs and their defaults (FACTS.md §3). An empty environment reproduces them.
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

_TOP_KEYS = {
    # the existing shape
    "engine": str, "name": str, "docker_image": str, "docker_image_dir": str, "model": str,
    "required_nodes": int, "tensor_parallel_size": int, "pipeline_parallel_size": int,
    "distributed_backend": str, "shm_size": str, "args": list, "env": dict,
    # sparkstack's extensions
    "status": str, "blocked_reason": str, "knobs": dict, "nodes": list, "drafter": dict, "kv": dict,
}
_NODE_KEYS = {"host": str, "ssh": str, "fabric_ip": str, "nic": str, "hca": str, "docker_host": str}
_DRAFTER_KEYS = {"cache_name_knob": str, "method": str}
_KV_KEYS = {"measured_bytes": int, "measured_tokens": int, "mla_page_bytes_per_token": int,
            "indexer_page_bytes_per_token": int, "drafter_page_bytes_per_token": int,
            "drafter_page_bytes_per_token_fp8": int, "drafter_group_patch": bool}


@dataclass(frozen=True)
class NodeSpec:
    host: str
    ssh: str | None  # None: this machine
    fabric_ip: str | None
    nic: str | None
    hca: str | None
    docker_host: str | None


@dataclass(frozen=True)
class KvGeometry:
    measured_bytes: int | None = None
    measured_tokens: int | None = None
    mla_page_bytes_per_token: int | None = None
    indexer_page_bytes_per_token: int | None = None
    drafter_page_bytes_per_token: int | None = None
    drafter_page_bytes_per_token_fp8: int | None = None
    drafter_group_patch: bool = False


@dataclass(frozen=True)
class Recipe:
    path: Path
    name: str
    engine: str
    docker_image: str
    docker_image_dir: str | None
    model: str
    required_nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    distributed_backend: str
    shm_size: str
    args: tuple[str, ...]  # shell quoting already removed
    env: tuple[tuple[str, str], ...]
    status: str
    blocked_reason: str
    knobs: tuple[tuple[str, str], ...]  # declared knob defaults; empty in the plain shape
    nodes: tuple[NodeSpec, ...]  # may be empty: then derived from knobs
    drafter_cache_knob: str | None
    drafter_method: str | None
    kv: KvGeometry

    @property
    def blocked(self) -> bool:
        return self.status == "blocked"


def _check(where: str, table: dict, schema: dict) -> None:
    for key, value in table.items():
        if key not in schema:
            raise SparkstackError(f"{where}: unknown key {key!r}")
        want = schema[key]
        ok = isinstance(value, want) and not (want is int and isinstance(value, bool))
        if not ok:
            raise SparkstackError(f"{where}: {key} must be {want.__name__}, got {type(value).__name__} {value!r}")


def unquote_arg(where: str, arg: object) -> str:
    """An arg written for a shell (wrapped in quotes) becomes the one word the shell would have passed.

    Anything else stays literal: `$`, `;`, `|` and friends are never interpreted.
    """
    if not isinstance(arg, str):
        raise SparkstackError(f"{where}: args must be strings, got {arg!r}")
    if len(arg) >= 2 and arg[0] in "'\"" and arg[-1] == arg[0]:
        try:
            words = shlex.split(arg)
        except ValueError as exc:
            raise SparkstackError(f"{where}: arg {arg!r} is not one shell word ({exc})") from None
        if len(words) != 1:
            raise SparkstackError(f"{where}: arg {arg!r} is several shell words; give each as its own element")
        return words[0]
    return arg


def find_recipe(name_or_path: str | None) -> Path:
    value = name_or_path or DEFAULT_RECIPE
    p = Path(value)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise SparkstackError(f"{p}: no such recipe file")
        return p
    if p.is_dir() and (p / "recipe.toml").is_file():
        return p / "recipe.toml"
    for base in shipped.recipe_dirs():
        candidate = base / value / "recipe.toml"
        if candidate.is_file():
            return candidate
    raise SparkstackError(f"no recipe {value!r} (looked in {', '.join(str(b) for b in shipped.recipe_dirs()) or 'nowhere: no checkout and no shipped recipes'})")


def load_recipe(name_or_path: str | None = None) -> Recipe:
    path = find_recipe(name_or_path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SparkstackError(f"{path}: not valid TOML ({exc})") from None
    w = str(path)
    _check(w, doc, _TOP_KEYS)
    for key in ("name", "model", "docker_image"):
        if key not in doc:
            raise SparkstackError(f"{w}: missing key {key!r}")
    if doc.get("engine", "vllm") != "vllm":
        raise SparkstackError(f"{w}: engine {doc['engine']!r} is not supported (only vllm)")
    status = doc.get("status", "ok")
    if status not in ("ok", "blocked"):
        raise SparkstackError(f"{w}: status must be \"ok\" or \"blocked\", got {status!r}")
    if status == "blocked" and not doc.get("blocked_reason"):
        raise SparkstackError(f"{w}: a blocked recipe needs blocked_reason")
    args = tuple(unquote_arg(w, a) for a in doc.get("args", []))
    env = doc.get("env", {})
    knobs = doc.get("knobs", {})
    for table, label in ((env, "env"), (knobs, "knobs")):
        for k, v in table.items():
            if not isinstance(v, str):
                raise SparkstackError(f"{w} [{label}]: {k} must be a string, got {v!r}")
    unknown_knobs = set(knobs) - set(KNOB_DEFAULTS)
    if unknown_knobs:
        raise SparkstackError(f"{w} [knobs]: unknown knob {sorted(unknown_knobs)[0]!r}")
    nodes = []
    for i, n in enumerate(doc.get("nodes", [])):
        where = f"{w} [[nodes]] #{i + 1}"
        if not isinstance(n, dict):
            raise SparkstackError(f"{where}: must be a table")
        _check(where, n, _NODE_KEYS)
        if "host" not in n:
            raise SparkstackError(f"{where}: missing key 'host'")
        nodes.append(NodeSpec(n["host"], n.get("ssh"), n.get("fabric_ip"), n.get("nic"), n.get("hca"), n.get("docker_host")))
    required = doc.get("required_nodes", 2)
    if nodes and len(nodes) != required:
        raise SparkstackError(f"{w}: required_nodes is {required} but {len(nodes)} [[nodes]] are listed")
    if not nodes and required > 2:
        raise SparkstackError(f"{w}: {required} nodes need a [[nodes]] list (one per rank)")
    drafter = doc.get("drafter", {})
    _check(f"{w} [drafter]", drafter, _DRAFTER_KEYS)
    kv = doc.get("kv", {})
    _check(f"{w} [kv]", kv, _KV_KEYS)
    return Recipe(
        path=path, name=doc["name"], engine="vllm", docker_image=doc["docker_image"],
        docker_image_dir=doc.get("docker_image_dir"), model=doc["model"], required_nodes=required,
        tensor_parallel_size=doc.get("tensor_parallel_size", required), pipeline_parallel_size=doc.get("pipeline_parallel_size", 1),
        distributed_backend=doc.get("distributed_backend", "mp"), shm_size=doc.get("shm_size", "16g"), args=args,
        env=tuple(env.items()), status=status, blocked_reason=doc.get("blocked_reason", ""), knobs=tuple(knobs.items()),
        nodes=tuple(nodes), drafter_cache_knob=drafter.get("cache_name_knob"), drafter_method=drafter.get("method"),
        kv=KvGeometry(**kv),
    )

"""Recipes: the existing TOML recipe shape, plus knobs, nodes, status, drafter and KV geometry.

Loading validates everything and turns the recipe into frozen data; nothing here
touches the host.
"""

from __future__ import annotations

import codecs
import ipaddress
import json
import math
import re
import shlex
import string
import tomllib
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkstack import fsio, shipped
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import COMMIT

DEFAULT_RECIPE = "glm53-flash-dflash2-nvfp4"
DEFAULT_CLOCK_CAP = "0,2000"  # every published number was measured at this cap (FACTS.md §3)
DEFAULT_GPU_MEMORY_GIB = 121.69  # GB10: what vLLM's free-memory check measures against (FACTS.md §7)
_CLOCK_CAP = re.compile(r"([0-9]{1,5}),([0-9]{1,5})")
CLOCK_CAP_MAX_MHZ = 5000  # above any GPU's graphics clock (GB10's boost is about 3 GHz)

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

# ---------------------------------------------------------------- values, checked where they enter
# A kind is a function value -> problem (None when fine). Problems read after the value:
# "API_PORT='0' is not a port number (1-65535)". Patterns use [0-9], never \d, which also
# matches other scripts' digits.

Kind = Callable[[str], "str | None"]

INT_MAX = 2**63 - 1
# Characters no knob or recipe value may hold: controls, invisible marks, lone surrogates, private-use and
# unassigned code points, line breaks. Every category str.isprintable() refuses except the spaces (Zs), so a
# value that passes here is also one remote.Runner accepts as an ssh target (it refuses what is not printable).
_BAD_CATEGORIES = {"Cc": "control character", "Cf": "invisible format character", "Cs": "lone surrogate",
                   "Co": "private-use character", "Cn": "unassigned code point", "Zl": "line separator",
                   "Zp": "paragraph separator"}
_DIGITS = re.compile(r"[0-9]{1,19}")  # no sign, no exponent, no spaces, no '_'; 19 digits bound int()
_DECIMAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?|\.[0-9]{1,20}")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}")  # the characters of a docker image reference
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{1,127}")  # docker's rule for container names
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_CACHE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # one path component under the hub
_REPO = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_NIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,14}")  # IFNAMSIZ: 15 characters, no '/', ':' or space
_HCA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
_SIZE = re.compile(r"[0-9]{1,15}(\.[0-9]{1,6})?[kKmMgGtTpP]?[iI]?[bB]?")  # docker's --shm-size units
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def show(value: str, limit: int = 60) -> str:
    """A value as it may appear inside a one-line message: quoted, escaped, cut short."""
    return repr(value[:limit]) + ("..." if len(value) > limit else "")


def brief(value: object, limit: int = 60) -> str:
    """repr() of any value, cut short for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def show_path(path: Path | str) -> str:
    text = str(path)
    return text if text.isprintable() else repr(text)


def _line(value: str) -> str | None:
    bad = next((c for c in value if unicodedata.category(c) in _BAD_CATEGORIES), None)
    return None if bad is None else f"holds the {_BAD_CATEGORIES[unicodedata.category(bad)]} {bad!r}"


def _text(value: str, limit: int = 1024) -> str | None:
    if value == "":
        return "must not be empty"
    if value.startswith("-"):
        return "must not start with '-' (it would be read as an option)"
    if len(value) > limit:
        return f"is longer than {limit} characters"
    return _line(value)


def _token(value: str) -> str | None:
    return _text(value) or ("must not hold whitespace" if any(c.isspace() for c in value) else None)


def _matching(pattern: re.Pattern, what: str) -> Kind:
    return lambda value: _token(value) or (None if pattern.fullmatch(value) else f"is not {what}")


def _whole(lo: int, hi: int, what: str) -> Kind:
    def check(value: str) -> str | None:
        return None if _DIGITS.fullmatch(value) and lo <= int(value) <= hi else f"is not {what}"
    return check


def _or_empty(kind: Kind) -> Kind:
    return lambda value: None if value == "" else kind(value)


_count = _whole(1, INT_MAX, "a whole number >= 1 (digits 0-9 only)")
_bytes = _whole(0, INT_MAX, "a whole number of bytes (digits 0-9 only)")
_index = _whole(0, 1023, "a whole number from 0 to 1023")
_port = _whole(1, 65535, "a port number (1-65535)")
_word = _matching(_WORD, "a plain name (letters, digits, '_', '.', '-')")
_image = _matching(_REF, "an image reference")
_cache = _matching(_CACHE, "a cache entry name (one path component, e.g. models--ORG--NAME)")
_nic = _matching(_NIC, "a network interface name (at most 15 characters, no '/' or ':')")
_hca = _matching(_HCA, "an RDMA device name (no '/' or ':')")
_shm = _matching(_SIZE, "a size such as 16g or 32gb")
_repo = _matching(_REPO, "an HF repo id (ORG/NAME)")

UNPINNED = "unpinned"


def _commit_or_unpinned(value: str) -> str | None:
    # A revision is a full commit hash (what the hub names a snapshot by), or honestly "unpinned": never a branch.
    ok = value == UNPINNED or COMMIT.fullmatch(value)
    return None if ok else f'is neither "{UNPINNED}" nor a commit hash (40 lowercase hex digits)'


def _fraction(value: str) -> str | None:
    ok = _DECIMAL.fullmatch(value) and 0 < float(value) <= 1
    return None if ok else "is not a fraction in (0, 1] (e.g. 0.90)"


def _eager(value: str) -> str | None:
    return None if value in ("", "0", "1") else "is not valid: expected 0 or 1 (or empty)"


def _container_name(value: str) -> str | None:
    # {rank} is the one placeholder NAME knows; the rest must satisfy docker's own rule.
    if _CONTAINER.fullmatch(value.replace("{rank}", "0")):
        return None
    return "is not a container name (letters, digits, '_', '.', '-'; {rank} for the rank)"


def _host(value: str) -> str | None:
    problem = _token(value)
    if problem:
        return problem
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        return None if _HOSTNAME.fullmatch(value) else "is not an IP address or host name"


def _ipv4(value: str) -> str | None:
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        return "is not an IPv4 address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "is not a unicast IPv4 address"
    return None


def _hf_home(value: str) -> str | None:
    problem = _text(value, limit=4095)
    if problem:
        return problem
    if ":" in value:  # docker -v splits on ':': "/a:/etc" would mount /a at /etc
        return "must not hold ':' (docker -v would split the path there)"
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        return "must be an absolute path or start with ~/"
    return None


def _spec_json(value: str) -> str | None:
    try:
        spec = json.loads(value)
    except (ValueError, RecursionError) as exc:
        return f"is not JSON ({str(exc)[:80]})"
    return None if isinstance(spec, dict) else "is not a JSON object"


def _no_nul(value: str) -> str | None:
    return "holds a NUL byte" if "\0" in value else None


def _not_a_flag(value: str) -> str | None:
    return "must not start with '-' (it would be read as an option)" if value.startswith("-") else None


# Every knob's kind. An empty value is refused unless it means something (LOAD_FORMAT off, EAGER off,
# KV_CACHE_MEMORY set but empty drops the pin: FACTS.md §3).
KNOB_KINDS: dict[str, Kind] = {
    "IMAGE": _image, "NAME": _container_name, "SERVED_NAME": _text, "MODEL_CACHE_NAME": _cache,
    "DRAFT_CACHE_NAME": _cache, "HF_HOME": _hf_home, "LOAD_FORMAT": _or_empty(_word), "EAGER": _eager,
    "NUM_SPEC_TOKENS": _count, "GPU_MEM_UTIL": _fraction, "KV_CACHE_MEMORY": _or_empty(_bytes),
    "OMP_NUM_THREADS": _count, "VLLM_CPU_OMP_THREADS_BIND": _token, "MAX_NUM_BATCHED_TOKENS": _count,
    "API_PORT": _port, "MAX_MODEL_LEN": _count, "MAX_NUM_SEQS": _count, "MOE_BACKEND": _word,
    "WORKER_SSH": _token, "MASTER_ADDR": _host, "MASTER_PORT": _port, "CX_NIC": _nic, "CX_HCA": _hca,
}
assert KNOB_KINDS.keys() == KNOB_DEFAULTS.keys()
CACHE_NAME_KNOBS = ("DRAFT_CACHE_NAME", "MODEL_CACHE_NAME")
ENV_KNOBS = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")  # knobs a plain recipe sets in its [env]

# Engine flags that take a value, with the kind of value where sparkstack reads, sets or derives it.
VALUE_FLAGS: dict[str, Kind] = {
    "--served-model-name": _text, "--host": _host, "--port": _port, "--tensor-parallel-size": _count,
    "--distributed-executor-backend": _word, "--nnodes": _count, "--node-rank": _index, "--master-addr": _host,
    "--master-port": _port, "--load-format": _word, "--max-model-len": _count, "--max-num-seqs": _count,
    "--max-num-batched-tokens": _count, "--moe-backend": _word, "--gpu-memory-utilization": _fraction,
    "--kv-cache-memory": _bytes, "--kv-cache-memory-bytes": _bytes, "--kv-cache-dtype": _word,
    "--block-size": _count, "--speculative-config": _spec_json, "--tool-call-parser": _not_a_flag,
    "--reasoning-parser": _not_a_flag,
}
_SAME_FLAG = {"--kv-cache-memory-bytes": "--kv-cache-memory"}  # vLLM's abbreviation: one flag, two spellings

# [[nodes]] keys filled per rank, the kind of the filled value, and the placeholders they may use.
NODE_KINDS: dict[str, Kind] = {"ssh": _token, "fabric_ip": _ipv4, "nic": _nic, "hca": _hca, "docker_host": _token}
PLACEHOLDERS = frozenset({"rank", *KNOB_DEFAULTS})
RECIPE_ONLY_ENV = {"VLLM_HOST_IP": "it is derived per rank from fabric_ip",
                   "VLLM_API_KEY": "a recipe value would appear in argv; set it in the environment"}
MAX_NODES = 1024


def check_value(where: str, value: str, kind: Kind) -> None:
    """Raise the one line naming where the value came from, the value and what is wrong with it."""
    problem = kind(value)
    if problem:
        raise SparkstackError(f"{where}{show(value)} {problem}")


def placeholders(where: str, template: str) -> frozenset[str]:
    """The knob names (and `rank`) a node template uses; anything else is refused now, not at fill time."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SparkstackError(f"{where}{show(template)} is not a template ({exc}; "
                              "write {{ for a literal brace)") from None
    names = set()
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in PLACEHOLDERS or spec or conversion:
            whole = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise SparkstackError(f"{where}{show(template)} uses the placeholder {show(whole)}: "
                                  "only {rank} and knob names (e.g. {WORKER_SSH}) are allowed")
        names.add(field)
    return frozenset(names)


_TOP_KEYS = {
    # the existing shape
    "engine": str, "name": str, "docker_image": str, "docker_image_dir": str, "model": str,
    "required_nodes": int, "tensor_parallel_size": int, "pipeline_parallel_size": int,
    "distributed_backend": str, "shm_size": str, "args": list, "env": dict,
    # sparkstack's extensions
    "status": str, "blocked_reason": str, "knobs": dict, "nodes": list, "drafter": dict, "kv": dict,
    "clock_cap": str, "gpu_memory_gib": float,  # the hosts: tune's GPU clock cap, preflight's free-memory rule
    "model_revision": str,
    "serves_mtp": bool, "serves_mtp_reason": str,  # the served checkpoint keeps its MTP layers on purpose, and why
    "boot": dict,  # the lines its boot must show (launch/confirm.py)
}
_NODE_KEYS = {"host": str, "ssh": str, "fabric_ip": str, "nic": str, "hca": str, "docker_host": str}
_DRAFTER_KEYS = {"cache_name_knob": str, "method": str, "repo": str, "revision": str, "licence": str}
_BOOT_KEYS = {"expect": list, "missing": str}
BOOT_MISSING = ("fail", "warn")
# The boot lines a recipe may expect, by key; launch/bootlines.py's CONFIRM holds their patterns (an assert there
# keeps the two equal). FACTS.md §2's list, plus the KV size and graph lines of §7.
CONFIRM_KEYS = ("modelopt-nvfp4", "nvfp4-moe-backend", "eagle3-aux-layers", "kv-cache-size", "breakable-cuda-graph",
                "graph-capture")  # what verify makes of an expected boot line the running pair's boot lacks
_KV_KEYS = {"measured_bytes": int, "measured_tokens": int, "mla_page_bytes_per_token": int,
            "indexer_page_bytes_per_token": int, "drafter_page_bytes_per_token": int,
            "drafter_page_bytes_per_token_fp8": int, "drafter_group_patch": bool, "pages": dict, "boot": dict}
# [kv.boot]: what a boot measured of the KV pool (`plan kv --from-boot --write`, launch/calibrate.py).
_KV_BOOT_KEYS = {"tokens": int, "pool_bytes": int, "pool": str, "source": str, "date": str, "vllm_version": str,
                 "image_id": str}
KV_BOOT_POOLS = ("pin", "profiled")  # the bytes are the argv's pin (exact), or the profiled GiB figure (to 0.01 GiB)
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_PAGE_KEYS = {"mla_page_bytes_per_token": int, "indexer_page_bytes_per_token": int}


@dataclass(frozen=True)
class NodeSpec:
    host: str
    ssh: str | None  # None: this machine
    fabric_ip: str | None
    nic: str | None
    hca: str | None
    docker_host: str | None


@dataclass(frozen=True)
class KvBoot:
    """[kv.boot]: the KV pool one boot measured, and where that came from (`plan kv --from-boot --write`)."""

    tokens: int  # `<device> KV cache size: N tokens`
    pool_bytes: int
    pool: str  # KV_BOOT_POOLS: "pin" (exact) or "profiled"
    source: str  # "run <id>" or a log file
    date: str  # YYYY-MM-DD, the day it was written
    vllm_version: str | None = None
    image_id: str | None = None

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "pool_bytes": self.pool_bytes, "pool": self.pool, "source": self.source,
                "date": self.date, "vllm_version": self.vllm_version, "image_id": self.image_id}

    def toml(self) -> dict:
        """The [kv.boot] table as written: the optional keys only when known."""
        return {k: v for k, v in self.to_json().items() if v is not None}


@dataclass(frozen=True)
class KvGeometry:
    measured_bytes: int | None = None
    measured_tokens: int | None = None
    mla_page_bytes_per_token: int | None = None
    indexer_page_bytes_per_token: int | None = None
    drafter_page_bytes_per_token: int | None = None
    drafter_page_bytes_per_token_fp8: int | None = None
    drafter_group_patch: bool = False
    # Page figures per --kv-cache-dtype ([kv.pages.<dtype>]): (dtype, mla, indexer). When given, the argv's KV dtype
    # picks its own figures, and a dtype without any has none: fp8_ds_mla's pages are not fp8_e4m3's.
    pages: tuple[tuple[str, int | None, int | None], ...] = ()
    boot: KvBoot | None = None  # [kv.boot]: the last calibrated boot's measurement


@dataclass(frozen=True)
class BootExpect:
    """The lines the recipe's boot must show (keys of launch.confirm's table), and what verify makes of one missing."""

    expect: tuple[str, ...] = ()
    missing: str = "fail"


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
    clock_cap: str = DEFAULT_CLOCK_CAP  # nvidia-smi -lgc MIN,MAX (MHz)
    gpu_memory_gib: float = DEFAULT_GPU_MEMORY_GIB  # what CUDA sees of the unified memory
    model_revision: str = UNPINNED  # a 40-hex commit, or UNPINNED
    drafter_repo: str | None = None
    drafter_revision: str = UNPINNED
    drafter_licence: str | None = None  # shown before a download and beside the model: the drafter may not be free
    serves_mtp_reason: str | None = None  # set: the served checkpoint keeps its MTP layers on purpose (mtp-strip passes)
    boot: BootExpect = BootExpect()

    @property
    def blocked(self) -> bool:
        return self.status == "blocked"

    @property
    def model_pin(self) -> str | None:
        """The commit model_revision pins, or None while it says unpinned."""
        return None if self.model_revision == UNPINNED else self.model_revision

    @property
    def drafter_pin(self) -> str | None:
        return None if self.drafter_revision == UNPINNED else self.drafter_revision


_TOML_TYPES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array",
               dict: "a table"}


def _toml_type(value: object) -> str:
    return next((name for t, name in _TOML_TYPES.items() if type(value) is t), type(value).__name__)


def _check(where: str, table: dict, schema: dict) -> None:
    for key, value in table.items():
        if key not in schema:
            raise SparkstackError(f"{where}: unknown key {show(key)}")
        want = schema[key]
        ok = isinstance(value, (int, float) if want is float else want) and not (
            want in (int, float) and isinstance(value, bool))
        if not ok:
            raise SparkstackError(f"{where}: {key} must be {_TOML_TYPES[want]}, got {_toml_type(value)} {brief(value)}")


def unquote_arg(where: str, arg: object) -> str:
    """An arg written for a shell (wrapped in quotes) becomes the one word the shell would have passed.

    Anything else stays literal: `$`, `;`, `|` and friends are never interpreted.
    """
    if not isinstance(arg, str):
        raise SparkstackError(f"{where}: args must be strings, got {brief(arg)}")
    if "\0" in arg:  # no argv element can carry a NUL byte
        raise SparkstackError(f"{where}: arg {show(arg)} holds a NUL byte")
    if len(arg) >= 2 and arg[0] in "'\"" and arg[-1] == arg[0]:
        try:
            words = shlex.split(arg)
        except ValueError as exc:
            raise SparkstackError(f"{where}: arg {show(arg)} is not one shell word ({exc})") from None
        if len(words) != 1:
            raise SparkstackError(f"{where}: arg {show(arg)} is several shell words; give each as its own element")
        return words[0]
    return arg


def check_args(where: str, raw: list) -> tuple[str, ...]:
    """Unquote the args; every known value flag appears once, with a value of its kind.

    `--flag=value` of a known flag is split in two, so a knob finds and replaces it.
    """
    args: list[str] = []
    for a in raw:
        a = unquote_arg(where, a)
        flag, eq, value = a.partition("=")
        args += [flag, value] if eq and flag in VALUE_FLAGS else [a]
    seen: set[str] = set()
    i = 0
    while i < len(args):
        flag = args[i]
        if flag not in VALUE_FLAGS:
            i += 1
            continue
        same = _SAME_FLAG.get(flag, flag)
        if same in seen:
            raise SparkstackError(f"{where}: {flag} appears twice in args")
        seen.add(same)
        if i + 1 == len(args):
            raise SparkstackError(f"{where}: {flag} is the last arg and has no value")
        if args[i + 1].startswith("-"):
            raise SparkstackError(f"{where}: {flag} needs a value, got the option {show(args[i + 1])}")
        check_value(f"{where}: {flag} ", args[i + 1], VALUE_FLAGS[flag])
        i += 2
    return tuple(args)


def find_recipe(name_or_path: str | None) -> Path:
    value = name_or_path or DEFAULT_RECIPE
    p = Path(value)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise SparkstackError(f"{show_path(p)}: no such recipe file")
        return p
    if p.is_dir() and (p / "recipe.toml").is_file():
        return p / "recipe.toml"
    for base in shipped.recipe_dirs():
        candidate = base / value / "recipe.toml"
        if candidate.is_file():
            return candidate
    looked = ", ".join(show_path(b) for b in shipped.recipe_dirs()) or "nowhere: no checkout and no shipped recipes"
    raise SparkstackError(f"no recipe {show(value)} (looked in {looked})")


def _read_toml(path: Path, w: str) -> dict:
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a BOM from a Windows editor is still UTF-8
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start]
        raise SparkstackError(f"{w}: not UTF-8 text (byte 0x{bad:02x} at offset {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SparkstackError(f"{w}: not valid TOML ({exc})") from None
    except RecursionError:
        raise SparkstackError(f"{w}: not valid TOML (nested too deeply)") from None


def _check_node(where: str, n: object, many: bool) -> NodeSpec:
    if not isinstance(n, dict):
        raise SparkstackError(f"{where}: must be a table, got {_toml_type(n)}")
    _check(where, n, _NODE_KEYS)
    if "host" not in n:
        raise SparkstackError(f"{where}: missing key 'host'")
    check_value(f"{where}: host=", n["host"], _text)
    where = f"{where} ({n['host']})"
    if many and "fabric_ip" not in n:
        raise SparkstackError(f"{where}: missing fabric_ip: with more than one node "
                              "every rank needs its own fabric address")
    for key, kind in NODE_KINDS.items():
        if key in n and not placeholders(f"{where}: {key}=", n[key]):
            check_value(f"{where}: {key}=", n[key].format(), kind)  # a literal: check it now, not per rank
    return NodeSpec(n["host"], n.get("ssh"), n.get("fabric_ip"), n.get("nic"), n.get("hca"), n.get("docker_host"))


def load_recipe(name_or_path: str | None = None) -> Recipe:
    path = find_recipe(name_or_path)
    w = show_path(path)
    doc = _read_toml(path, w)
    _check(w, doc, _TOP_KEYS)
    for key in ("name", "model", "docker_image"):
        if key not in doc:
            raise SparkstackError(f"{w}: missing key {key!r}")
    if doc.get("engine", "vllm") != "vllm":
        raise SparkstackError(f"{w}: engine {show(doc['engine'])} is not supported (only vllm)")
    status = doc.get("status", "ok")
    if status not in ("ok", "blocked"):
        raise SparkstackError(f"{w}: status must be \"ok\" or \"blocked\", got {show(status)}")
    if status == "blocked" and not doc.get("blocked_reason"):
        raise SparkstackError(f"{w}: a blocked recipe needs blocked_reason")
    for key, kind in (("name", _text), ("docker_image", _image), ("model", _repo), ("distributed_backend", _word),
                      ("shm_size", _shm), ("blocked_reason", _line), ("docker_image_dir", _line)):
        if key in doc:
            check_value(f"{w}: {key}=", doc[key], kind)
    for key in ("required_nodes", "tensor_parallel_size", "pipeline_parallel_size"):
        if key in doc and not 1 <= doc[key] <= MAX_NODES:
            raise SparkstackError(f"{w}: {key}={doc[key]} is not from 1 to {MAX_NODES}")
    args = check_args(f"{w} args", doc.get("args", []))
    env = doc.get("env", {})
    knobs = doc.get("knobs", {})
    for table, label in ((env, "env"), (knobs, "knobs")):
        for k, v in table.items():
            if not isinstance(v, str):
                raise SparkstackError(f"{w} [{label}]: {k} must be a string, got {_toml_type(v)} {brief(v)}")
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(k):
            raise SparkstackError(f"{w} [env]: {show(k)} is not an environment variable name")
        if k in RECIPE_ONLY_ENV:
            raise SparkstackError(f"{w} [env]: {k} cannot be set in a recipe: {RECIPE_ONLY_ENV[k]}")
        check_value(f"{w} [env]: {k}=", v, KNOB_KINDS[k] if k in ENV_KNOBS else _no_nul)
    unknown_knobs = set(knobs) - set(KNOB_DEFAULTS)
    if unknown_knobs:
        raise SparkstackError(f"{w} [knobs]: unknown knob {show(sorted(unknown_knobs)[0])}")
    for k, v in knobs.items():
        check_value(f"{w} [knobs]: {k}=", v, KNOB_KINDS[k])
    raw_nodes = doc.get("nodes", [])
    nodes = [_check_node(f"{w} [[nodes]] #{i + 1}", n, len(raw_nodes) > 1) for i, n in enumerate(raw_nodes)]
    required = doc.get("required_nodes", 2)
    if nodes and len(nodes) != required:
        raise SparkstackError(f"{w}: required_nodes is {required} but {len(nodes)} [[nodes]] are listed")
    if not nodes and required > 2:
        raise SparkstackError(f"{w}: {required} nodes need a [[nodes]] list (one per rank)")
    drafter = doc.get("drafter", {})
    _check(f"{w} [drafter]", drafter, _DRAFTER_KEYS)
    if "cache_name_knob" in drafter and drafter["cache_name_knob"] not in CACHE_NAME_KNOBS:
        raise SparkstackError(f"{w} [drafter]: cache_name_knob={show(drafter['cache_name_knob'])} is not a cache-name "
                              f"knob ({' or '.join(CACHE_NAME_KNOBS)})")
    if "method" in drafter:
        check_value(f"{w} [drafter]: method=", drafter["method"], _word)
    clock_cap = doc.get("clock_cap", DEFAULT_CLOCK_CAP)
    cap = _CLOCK_CAP.fullmatch(clock_cap)
    if not cap or int(cap[1]) > int(cap[2]) or not 0 < int(cap[2]) <= CLOCK_CAP_MAX_MHZ:
        raise SparkstackError(f"{w}: clock_cap={show(clock_cap)} is not MIN,MAX in MHz with MIN <= MAX <= "
                              f"{CLOCK_CAP_MAX_MHZ} (e.g. {DEFAULT_CLOCK_CAP!r}, for nvidia-smi -lgc)")
    clock_cap = f"{int(cap[1])},{int(cap[2])}"  # one spelling for nvidia-smi, tune's stamp and preflight
    gpu_gib = doc.get("gpu_memory_gib", DEFAULT_GPU_MEMORY_GIB)
    if not (math.isfinite(gpu_gib) and 0 < gpu_gib <= 65536):
        raise SparkstackError(f"{w}: gpu_memory_gib={gpu_gib!r} is not a number of GiB in (0, 65536]")
    if "repo" in drafter:
        check_value(f"{w} [drafter]: repo=", drafter["repo"], _repo)
    if "revision" in drafter and "repo" not in drafter:
        raise SparkstackError(f"{w} [drafter]: revision needs repo (the HF repo it is a revision of)")
    for where, table, key in ((f"{w}: ", doc, "model_revision"), (f"{w} [drafter]: ", drafter, "revision")):
        if key in table:
            check_value(f"{where}{key}=", table[key], _commit_or_unpinned)
    _check(f"{w} [kv]", doc.get("kv", {}), _KV_KEYS)
    kv = dict(doc.get("kv", {}))
    for key, value in kv.items():
        if type(value) is int and value < 1:  # page sizes are divisors and token counts divide: 0 is never meant
            raise SparkstackError(f"{w} [kv]: {key}={value} must be at least 1")
    kv["pages"] = _pages(f"{w} [kv.pages]", kv.get("pages", {}))
    kv["boot"] = _kv_boot(f"{w} [kv.boot]", kv["boot"]) if "boot" in kv else None
    if "licence" in drafter:
        check_value(f"{w} [drafter]: licence=", drafter["licence"], _text)
    serves_mtp_reason = _serves_mtp(w, doc)
    boot = _boot(f"{w} [boot]", doc.get("boot", {}))
    return Recipe(
        path=path, name=doc["name"], engine="vllm", docker_image=doc["docker_image"],
        docker_image_dir=doc.get("docker_image_dir"), model=doc["model"], required_nodes=required,
        tensor_parallel_size=doc.get("tensor_parallel_size", required), pipeline_parallel_size=doc.get("pipeline_parallel_size", 1),
        distributed_backend=doc.get("distributed_backend", "mp"), shm_size=doc.get("shm_size", "16g"), args=args,
        env=tuple(env.items()), status=status, blocked_reason=doc.get("blocked_reason", ""), knobs=tuple(knobs.items()),
        nodes=tuple(nodes), drafter_cache_knob=drafter.get("cache_name_knob"), drafter_method=drafter.get("method"),
        kv=KvGeometry(**kv), clock_cap=clock_cap, gpu_memory_gib=float(gpu_gib), model_revision=doc.get("model_revision", UNPINNED), drafter_repo=drafter.get("repo"),
        drafter_revision=drafter.get("revision", UNPINNED), drafter_licence=drafter.get("licence"),
        serves_mtp_reason=serves_mtp_reason, boot=boot,
    )


def _pages(where: str, pages: dict) -> tuple[tuple[str, int | None, int | None], ...]:
    out = []
    for dtype, table in pages.items():
        check_value(f"{where}: ", dtype, _word)
        if not isinstance(table, dict):
            raise SparkstackError(f"{where}.{dtype}: must be a table, got {_toml_type(table)}")
        _check(f"{where}.{dtype}", table, _PAGE_KEYS)
        for key, value in table.items():
            if value < 1:
                raise SparkstackError(f"{where}.{dtype}: {key}={value} must be at least 1")
        out.append((dtype, table.get("mla_page_bytes_per_token"), table.get("indexer_page_bytes_per_token")))
    return tuple(out)


def _kv_boot(where: str, table: dict) -> KvBoot:
    _check(where, table, _KV_BOOT_KEYS)
    for key in ("tokens", "pool_bytes", "pool", "source", "date"):
        if key not in table:
            raise SparkstackError(f"{where}: missing key {key!r}")
    for key in ("tokens", "pool_bytes"):
        if not 1 <= table[key] <= INT_MAX:
            raise SparkstackError(f"{where}: {key}={table[key]} must be a whole number of at least 1")
    if table["pool"] not in KV_BOOT_POOLS:
        raise SparkstackError(f"{where}: pool must be \"pin\" or \"profiled\", got {brief(table['pool'])}")
    if not _ISO_DATE.fullmatch(table["date"]):
        raise SparkstackError(f"{where}: date={show(table['date'])} is not a date (YYYY-MM-DD)")
    for key in ("source", "vllm_version", "image_id"):
        if key in table:
            check_value(f"{where}: {key}=", table[key], _text)
    return KvBoot(**table)


def _serves_mtp(w: str, doc: dict) -> str | None:
    """A recipe that serves its checkpoint's MTP layers on purpose says so, and why (preflight names the reason)."""
    on, reason = doc.get("serves_mtp", False), doc.get("serves_mtp_reason")
    if on and not reason:
        raise SparkstackError(f"{w}: serves_mtp = true needs serves_mtp_reason (why the MTP layers are served)")
    if reason is not None and not on:
        raise SparkstackError(f"{w}: serves_mtp_reason is set but serves_mtp is not true")
    if reason is not None:
        check_value(f"{w}: serves_mtp_reason=", reason, _text)
    return reason if on else None


def _boot(where: str, boot: dict) -> BootExpect:
    _check(where, boot, _BOOT_KEYS)
    expect = boot.get("expect", [])
    for key in expect:
        if key not in CONFIRM_KEYS:
            raise SparkstackError(f"{where}: expect names {brief(key)}, not a boot line sparkstack knows "
                                  f"({', '.join(CONFIRM_KEYS)})")
    if len(set(expect)) != len(expect):
        raise SparkstackError(f"{where}: expect names a line twice")
    missing = boot.get("missing", "fail")
    if missing not in BOOT_MISSING:
        raise SparkstackError(f"{where}: missing must be \"fail\" or \"warn\", got {brief(missing)}")
    return BootExpect(tuple(expect), missing)


def refuse_installed_recipe(recipe: Recipe) -> None:
    """A recipe installed with sparkstack (package data, site-packages, the Nix store) is never edited in place."""
    root = shipped.installed_copy_root(recipe.path)
    if root is not None:
        raise SparkstackError(f"{show_path(recipe.path)}: is a shipped recipe installed under {show_path(root)}, not "
                              f"writable; copy it and pin the copy: cp {shlex.quote(str(recipe.path))} my-recipe.toml "
                              "&& sparkstack fetch --resolve --recipe ./my-recipe.toml")


def write_revisions(recipe: Recipe, model_revision: str | None, drafter_revision: str | None) -> None:
    """Pin revisions in the recipe's file through tomlkit (comments and layout stay), replaced atomically.

    None leaves a field alone. An installed recipe is refused, with the copy command to run."""
    import tomlkit

    path, w = recipe.path, show_path(recipe.path)
    refuse_installed_recipe(recipe)
    if path.is_symlink():  # replacing it would put a regular file where the link was, the target unchanged
        raise SparkstackError(f"{w}: is a symlink; pin the file it names instead: sparkstack fetch --resolve "
                              f"--recipe {shlex.quote(str(path.resolve()))}")
    raw = path.read_bytes()
    bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
    original = raw.decode("utf-8-sig")
    doc, expect = tomlkit.parse(original), tomllib.loads(original)
    for table, plain, key, was, new in ((doc, expect, "model_revision", recipe.model_revision, model_revision),
                                        (doc.get("drafter"), expect.get("drafter"), "revision", recipe.drafter_revision,
                                         drafter_revision)):
        if new is None:
            continue
        check_value(f"{w}: {key}=", new, _commit_or_unpinned)
        if plain.get(key, UNPINNED) != was:
            raise SparkstackError(f"{w}: {key} changed since it was read; run again")
        table[key] = plain[key] = new
    text = tomlkit.dumps(doc)
    if tomllib.loads(text) != expect:  # the edit landed on exactly those keys, and nothing else moved
        raise SparkstackError(f"{w}: pinning would change more than the revision fields; nothing written")
    fsio.write_atomic(path, bom + text.encode("utf-8"))


def write_kv_boot(recipe: Recipe, entry: KvBoot) -> bool:
    """Record a boot's KV measurement in the recipe's file as [kv.boot], through tomlkit (comments and layout stay),
    replaced atomically; an installed recipe is refused, as write_revisions refuses it.

    A pinned boot's pool is exact, so it also becomes the planner's calibration point ([kv] measured_bytes and
    measured_tokens: the per-token cost `plan kv` divides by); returns whether it did. A profiled pool (its bytes
    good to 0.01 GiB) is recorded beside the cost and leaves it alone."""
    import tomlkit

    path, w = recipe.path, show_path(recipe.path)
    refuse_installed_recipe(recipe)
    if path.is_symlink():
        raise SparkstackError(f"{w}: is a symlink; write the file it names instead: --recipe "
                              f"{shlex.quote(str(path.resolve()))}")
    table = entry.toml()
    _kv_boot(f"{w} [kv.boot]", table)  # what is written is what the loader accepts
    raw = path.read_bytes()
    bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
    original = raw.decode("utf-8-sig")
    doc, expect = tomlkit.parse(original), tomllib.loads(original)
    plain_kv = expect.setdefault("kv", {})
    if not isinstance(plain_kv, dict):
        raise SparkstackError(f"{w}: kv is not a table; nothing written")
    was = recipe.kv
    if (plain_kv.get("measured_bytes"), plain_kv.get("measured_tokens")) != (was.measured_bytes, was.measured_tokens):
        raise SparkstackError(f"{w}: [kv] changed since it was read; run again")
    if "kv" not in doc:
        doc.add("kv", tomlkit.table())
    kv = doc["kv"]
    boot = tomlkit.table()
    boot.comment("written by `sparkstack plan kv --from-boot --write`: what that boot measured")
    for key, value in table.items():
        boot.add(key, value)
    kv["boot"] = boot
    plain_kv["boot"] = dict(table)
    cost = entry.pool == "pin"
    if cost:
        kv["measured_bytes"] = plain_kv["measured_bytes"] = entry.pool_bytes
        kv["measured_tokens"] = plain_kv["measured_tokens"] = entry.tokens
    text = tomlkit.dumps(doc)
    if tomllib.loads(text) != expect:  # the edit landed on exactly those keys, and nothing else moved
        raise SparkstackError(f"{w}: recording the boot would change more than [kv]'s measured figures; nothing "
                              "written")
    fsio.write_atomic(path, bom + text.encode("utf-8"))
    return cost

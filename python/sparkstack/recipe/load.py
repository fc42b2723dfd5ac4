"""Loading a recipe: the existing TOML recipe shape, plus knobs, nodes, status, drafter, KV geometry and boot lines.

Loading validates everything and turns the recipe into frozen data; nothing here touches the host.
"""

from __future__ import annotations

import math
import re
import shlex
import string
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sparkstack import shipped
from sparkstack.errors import SparkstackError
from sparkstack.recipe.engine_flags import serve_flags
from sparkstack.recipe.knobs import (
    CACHE_NAME_KNOBS, ENV_KNOBS, KNOB_DEFAULTS, KNOB_KINDS, NODE_KINDS, PLACEHOLDERS, RECIPE_ONLY_ENV,
    VALUE_FLAGS,
)
from sparkstack.recipe.values import (
    INT_MAX, UNPINNED, check_value, commit_or_unpinned, image_ref, no_nul, one_line, repo_id, shm_size, text, word,
)
from sparkstack.text import printable, quoted


DEFAULT_RECIPE = "glm53-flash-dflash2-nvfp4"
DEFAULT_CLOCK_CAP = "0,2000"  # the seed's `nvidia-smi -lgc`: every published number was measured at this cap
# GB10: what vLLM's free-memory check measures against ("Free memory on device cuda:0 (104.46/121.69 GiB)")
DEFAULT_GPU_MEMORY_GIB = 121.69
_CLOCK_CAP = re.compile(r"([0-9]{1,5}),([0-9]{1,5})")
CLOCK_CAP_MAX_MHZ = 5000  # above any GPU's graphics clock (GB10's boost is about 3 GHz)
MAX_NODES = 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def placeholders(where: str, template: str) -> frozenset[str]:
    """The knob names (and `rank`) a node template uses; anything else is refused now, not at fill time."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SparkstackError(f"{where}{quoted(template)} is not a template ({exc}; "
                              "write {{ for a literal brace)") from None
    names = set()
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in PLACEHOLDERS or spec or conversion:
            whole = "{" + field + ("!" + conversion if conversion else "") + (":" + spec if spec else "") + "}"
            raise SparkstackError(f"{where}{quoted(template)} uses the placeholder {quoted(whole)}: "
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
# keeps the two equal). The lines the blog confirms by eye in a head's boot, with the KV size and graph lines, and
# the KV pool's GiB its table gives.
CONFIRM_KEYS = ("modelopt-nvfp4", "nvfp4-moe-backend", "eagle3-aux-layers", "kv-cache-memory", "kv-cache-size",
                "breakable-cuda-graph", "graph-capture")
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
            raise SparkstackError(f"{where}: unknown key {quoted(key)}")
        want = schema[key]
        ok = isinstance(value, (int, float) if want is float else want) and not (
            want in (int, float) and isinstance(value, bool))
        if not ok:
            raise SparkstackError(f"{where}: {key} must be {_TOML_TYPES[want]}, got {_toml_type(value)} {quoted(value)}")


CONTROL = re.compile(r"[\x01-\x08\x0b-\x1f\x7f]")
MAX_ARG_BYTES = 32 * 1024  # a quarter of Linux's limit on one argv element (MAX_ARG_STRLEN)
OPTION_LIKE = re.compile(r"--|-[A-Za-z]")  # what argparse always reads as an option, never as a value
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY"}


def unquote_arg(where: str, arg: object) -> str:
    """An arg written for a shell (wrapped in quotes) becomes the one word the shell would have passed.

    Anything else stays literal: `$`, `;`, `|` and friends are never interpreted.
    """
    if not isinstance(arg, str):
        raise SparkstackError(f"{where}: args must be strings, got {quoted(arg)}")
    if "\0" in arg:  # no argv element can carry a NUL byte
        raise SparkstackError(f"{where}: arg {quoted(arg[:60])} holds a NUL byte")
    if CONTROL.search(arg):  # an escape or a carriage return in an engine arg is a paste gone wrong, and
        # would rewrite the terminal of whoever reads the argv; tabs and newlines are JSON's own whitespace
        raise SparkstackError(f"{where}: arg {quoted(arg[:60])} holds a control character")
    if len(arg) >= 2 and arg[0] in "'\"" and arg[-1] == arg[0]:
        try:
            words = shlex.split(arg)
        except ValueError as exc:
            raise SparkstackError(f"{where}: arg {quoted(arg)} is not one shell word ({exc})") from None
        if len(words) != 1:
            raise SparkstackError(f"{where}: arg {quoted(arg)} is several shell words; give each as its own element")
        return words[0]
    return arg


def check_args(where: str, raw: list) -> tuple[str, ...]:
    """Unquote the args; each flag is one the pinned vLLM's `vllm serve` takes, written out in full; every known
    value flag appears once, with a value of its kind.

    `--flag=value` of a known flag is split in two, so a knob finds and replaces it.
    """
    engine = serve_flags()
    args: list[str] = []
    wants_value: str | None = None  # the flag before, when it takes the next arg as its value
    for a in raw:
        a = unquote_arg(where, a)
        if len(a.encode()) > MAX_ARG_BYTES:
            what = f"the value of {wants_value}" if wants_value else f"an arg beginning {quoted(a[:40])}"
            raise SparkstackError(f"{where}: {what} is {len(a.encode())} bytes, over {MAX_ARG_BYTES}: no engine flag "
                                  "takes that much (a config that large belongs in a file)")
        if OPTION_LIKE.match(a):  # argparse never takes `--x` or `-x` as a value: it is always a flag
            if wants_value is not None:
                raise SparkstackError(f"{where}: {wants_value} needs a value, got the option {quoted(a)}")
            # a typo'd flag fails a real boot 15 minutes in; the recorded parser catches it here
            if problem := engine.problem(a):
                raise SparkstackError(f"{where}: {problem}")
            wants_value = a if engine.takes_value(a) else None
            a = engine.spelled_out(a)
            if (flag := a.split("=", 1)[0]) in SECRET_FLAGS:  # an argv is shown by ps, docker inspect and our plans
                raise SparkstackError(f"{where}: {flag} puts the key in the container's argv, where `docker inspect` "
                                      f"and `ps` show it; remove it and set {SECRET_FLAGS[flag]} instead")
        else:
            wants_value = None
        flag, eq, value = a.partition("=")
        args += [flag, value] if eq and flag in VALUE_FLAGS else [a]
    seen: set[str] = set()
    i = 0
    while i < len(args):
        flag = args[i]
        if flag not in VALUE_FLAGS:
            i += 1
            continue
        if flag in seen:
            raise SparkstackError(f"{where}: {flag} appears twice in args")
        seen.add(flag)
        if i + 1 == len(args):
            raise SparkstackError(f"{where}: {flag} is the last arg and has no value")
        if OPTION_LIKE.match(args[i + 1]):
            raise SparkstackError(f"{where}: {flag} needs a value, got the option {quoted(args[i + 1])}")
        check_value(f"{where}: {flag} ", args[i + 1], VALUE_FLAGS[flag])
        i += 2
    return tuple(args)


def find_recipe(name_or_path: str | None) -> Path:
    value = name_or_path or DEFAULT_RECIPE
    p = Path(value)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise SparkstackError(f"{printable(p)}: no such recipe file")
        return p
    if p.is_dir() and (p / "recipe.toml").is_file():
        return p / "recipe.toml"
    for base in shipped.recipe_dirs():
        candidate = base / value / "recipe.toml"
        if candidate.is_file():
            return candidate
    looked = ", ".join(printable(b) for b in shipped.recipe_dirs()) or "nowhere: no checkout and no shipped recipes"
    raise SparkstackError(f"no recipe {quoted(value)} (looked in {looked})")


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
    check_value(f"{where}: host=", n["host"], text)
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
    w = printable(path)
    doc = _read_toml(path, w)
    _check(w, doc, _TOP_KEYS)
    for key in ("name", "model", "docker_image"):
        if key not in doc:
            raise SparkstackError(f"{w}: missing key {key!r}")
    if doc.get("engine", "vllm") != "vllm":
        raise SparkstackError(f"{w}: engine {quoted(doc['engine'])} is not supported (only vllm)")
    status = doc.get("status", "ok")
    if status not in ("ok", "blocked"):
        raise SparkstackError(f"{w}: status must be \"ok\" or \"blocked\", got {quoted(status)}")
    if status == "blocked" and not doc.get("blocked_reason"):
        raise SparkstackError(f"{w}: a blocked recipe needs blocked_reason")
    for key, kind in (("name", text), ("docker_image", image_ref), ("model", repo_id), ("distributed_backend", word),
                      ("shm_size", shm_size), ("blocked_reason", one_line), ("docker_image_dir", one_line)):
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
                raise SparkstackError(f"{w} [{label}]: {k} must be a string, got {_toml_type(v)} {quoted(v)}")
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(k):
            raise SparkstackError(f"{w} [env]: {quoted(k)} is not an environment variable name")
        if k in RECIPE_ONLY_ENV:
            raise SparkstackError(f"{w} [env]: {k} cannot be set in a recipe: {RECIPE_ONLY_ENV[k]}")
        check_value(f"{w} [env]: {k}=", v, KNOB_KINDS[k] if k in ENV_KNOBS else no_nul)
    unknown_knobs = set(knobs) - set(KNOB_DEFAULTS)
    if unknown_knobs:
        raise SparkstackError(f"{w} [knobs]: unknown knob {quoted(sorted(unknown_knobs)[0])}")
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
        raise SparkstackError(f"{w} [drafter]: cache_name_knob={quoted(drafter['cache_name_knob'])} is not a cache-name "
                              f"knob ({' or '.join(CACHE_NAME_KNOBS)})")
    if "method" in drafter:
        check_value(f"{w} [drafter]: method=", drafter["method"], word)
    clock_cap = doc.get("clock_cap", DEFAULT_CLOCK_CAP)
    cap = _CLOCK_CAP.fullmatch(clock_cap)
    if not cap or int(cap[1]) > int(cap[2]) or not 0 < int(cap[2]) <= CLOCK_CAP_MAX_MHZ:
        raise SparkstackError(f"{w}: clock_cap={quoted(clock_cap)} is not MIN,MAX in MHz with MIN <= MAX <= "
                              f"{CLOCK_CAP_MAX_MHZ} (e.g. {DEFAULT_CLOCK_CAP!r}, for nvidia-smi -lgc)")
    clock_cap = f"{int(cap[1])},{int(cap[2])}"  # one spelling for nvidia-smi, tune's stamp and preflight
    gpu_gib = doc.get("gpu_memory_gib", DEFAULT_GPU_MEMORY_GIB)
    if not (math.isfinite(gpu_gib) and 0 < gpu_gib <= 65536):
        raise SparkstackError(f"{w}: gpu_memory_gib={gpu_gib!r} is not a number of GiB in (0, 65536]")
    if "repo" in drafter:
        check_value(f"{w} [drafter]: repo=", drafter["repo"], repo_id)
    if "revision" in drafter and "repo" not in drafter:
        raise SparkstackError(f"{w} [drafter]: revision needs repo (the HF repo it is a revision of)")
    for where, table, key in ((f"{w}: ", doc, "model_revision"), (f"{w} [drafter]: ", drafter, "revision")):
        if key in table:
            check_value(f"{where}{key}=", table[key], commit_or_unpinned)
    _check(f"{w} [kv]", doc.get("kv", {}), _KV_KEYS)
    kv = dict(doc.get("kv", {}))
    for key, value in kv.items():
        if type(value) is int and value < 1:  # page sizes are divisors and token counts divide: 0 is never meant
            raise SparkstackError(f"{w} [kv]: {key}={value} must be at least 1")
    kv["pages"] = _pages(f"{w} [kv.pages]", kv.get("pages", {}))
    kv["boot"] = kv_boot(f"{w} [kv.boot]", kv["boot"]) if "boot" in kv else None
    if "licence" in drafter:
        check_value(f"{w} [drafter]: licence=", drafter["licence"], text)
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
        check_value(f"{where}: ", dtype, word)
        if not isinstance(table, dict):
            raise SparkstackError(f"{where}.{dtype}: must be a table, got {_toml_type(table)}")
        _check(f"{where}.{dtype}", table, _PAGE_KEYS)
        for key, value in table.items():
            if value < 1:
                raise SparkstackError(f"{where}.{dtype}: {key}={value} must be at least 1")
        out.append((dtype, table.get("mla_page_bytes_per_token"), table.get("indexer_page_bytes_per_token")))
    return tuple(out)


def kv_boot(where: str, table: dict) -> KvBoot:
    """A [kv.boot] table, checked (the loader's, and write.py's check of what it writes)."""
    _check(where, table, _KV_BOOT_KEYS)
    for key in ("tokens", "pool_bytes", "pool", "source", "date"):
        if key not in table:
            raise SparkstackError(f"{where}: missing key {key!r}")
    for key in ("tokens", "pool_bytes"):
        if not 1 <= table[key] <= INT_MAX:
            raise SparkstackError(f"{where}: {key}={table[key]} must be a whole number of at least 1")
    if table["pool"] not in KV_BOOT_POOLS:
        raise SparkstackError(f"{where}: pool must be \"pin\" or \"profiled\", got {quoted(table['pool'])}")
    if not _ISO_DATE.fullmatch(table["date"]):
        raise SparkstackError(f"{where}: date={quoted(table['date'])} is not a date (YYYY-MM-DD)")
    for key in ("source", "vllm_version", "image_id"):
        if key in table:
            check_value(f"{where}: {key}=", table[key], text)
    return KvBoot(**table)


def _serves_mtp(w: str, doc: dict) -> str | None:
    """A recipe that serves its checkpoint's MTP layers on purpose says so, and why (preflight names the reason)."""
    on, reason = doc.get("serves_mtp", False), doc.get("serves_mtp_reason")
    if on and not reason:
        raise SparkstackError(f"{w}: serves_mtp = true needs serves_mtp_reason (why the MTP layers are served)")
    if reason is not None and not on:
        raise SparkstackError(f"{w}: serves_mtp_reason is set but serves_mtp is not true")
    if reason is not None:
        check_value(f"{w}: serves_mtp_reason=", reason, text)
    return reason if on else None


def _boot(where: str, boot: dict) -> BootExpect:
    _check(where, boot, _BOOT_KEYS)
    expect = boot.get("expect", [])
    for key in expect:
        if key not in CONFIRM_KEYS:
            raise SparkstackError(f"{where}: expect names {quoted(key)}, not a boot line sparkstack knows "
                                  f"({', '.join(CONFIRM_KEYS)})")
    if len(set(expect)) != len(expect):
        raise SparkstackError(f"{where}: expect names a line twice")
    missing = boot.get("missing", "fail")
    if missing not in BOOT_MISSING:
        raise SparkstackError(f"{where}: missing must be \"fail\" or \"warn\", got {quoted(missing)}")
    return BootExpect(tuple(expect), missing)

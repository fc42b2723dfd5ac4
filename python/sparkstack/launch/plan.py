"""The launch plan: recipe + environment knobs + local host facts -> one `docker run` argv per rank.

Pure apart from reading refs/main of the two cache entries on this machine.
Precedence: built-in defaults < the recipe's knob defaults and values < environment variables set.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.errors import SparkstackError
from sparkstack.hfcache import entry_holds, entry_name, hub_path, read_ref, ref_file, snapshot_text
from sparkstack.recipe import KNOB_DEFAULTS, KNOB_KINDS, NODE_KINDS, NodeSpec, Recipe, check_value, show, show_path

CONTAINER_HUB = "/root/.cache/huggingface/hub"
FABRIC_IPS = ("10.0.0.1", "10.0.0.2")
LAB_DROPS = (("--gpus", "all"), ("--ulimit", "memlock=-1:-1"), ("--device", "/dev/infiniband:/dev/infiniband"))
SECRET_ENV = ("VLLM_API_KEY",)  # passed to docker by name only: the value never enters an argv

# Flags the launcher derives itself; a recipe's copy of any of them is removed from its args.
GENERATED_FLAGS = ("--served-model-name", "--host", "--port", "--trust-remote-code", "--tensor-parallel-size",
                   "--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                   "--headless")
BARE_FLAGS = {"--trust-remote-code", "--headless"}
# Knobs that set one engine flag in the recipe's args: (flag, aliases, insert-after anchor).
VALUE_KNOBS = {
    "MAX_MODEL_LEN": ("--max-model-len", (), None),
    "MAX_NUM_SEQS": ("--max-num-seqs", (), None),
    "MAX_NUM_BATCHED_TOKENS": ("--max-num-batched-tokens", (), None),
    "MOE_BACKEND": ("--moe-backend", (), None),
    "GPU_MEM_UTIL": ("--gpu-memory-utilization", (), None),
    # The seed launcher wrote --kv-cache-memory, which vLLM takes only as argparse's abbreviation of
    # --kv-cache-memory-bytes: launch writes the full name (vLLM's own parser with abbreviations off judges it).
    "KV_CACHE_MEMORY": ("--kv-cache-memory-bytes", ("--kv-cache-memory",), "--kv-cache-dtype"),
}
# Abbreviations recipes in the seed's shape carry, and the option vLLM means by each: written in full.
FULL_NAMES = {"--kv-cache-memory": "--kv-cache-memory-bytes"}
# Generated flags whose value a plain recipe may set in its own args, as that knob's default.
RECIPE_VALUE_DEFAULTS = {"--served-model-name": "SERVED_NAME", "--port": "API_PORT",
                         "--master-addr": "MASTER_ADDR", "--master-port": "MASTER_PORT"}


@dataclass(frozen=True)
class Knobs:
    values: Mapping[str, str]
    active: frozenset[str]  # declared by the recipe or set in the environment: these may edit args
    from_env: frozenset[str]

    def __getitem__(self, name: str) -> str:
        return self.values[name]


@dataclass(frozen=True)
class ImageFlag:
    """What `launch --image` named: a built OCI layout (run by its content-addressed tag), or a plain reference."""

    ref: str  # what docker runs
    config_digest: str | None  # known when a layout was given
    layout: Path | None


def image_flag(value: str) -> ImageFlag:
    """A path to an existing OCI layout or archive is read (its tag and config digest); anything else is a reference."""
    from sparkstack.image.plan import complete_output

    path = Path(value)
    looks_like_path = value.startswith(("/", "./", "../", "~")) or value.endswith(("/", ".tar"))
    if not path.exists():
        if looks_like_path:  # no image reference starts with / or . nor ends with / or .tar
            raise SparkstackError(f"--image {show_path(path)}: no such OCI layout or image archive")
        return ImageFlag(value, None, None)
    built = complete_output(path)
    if built is None:
        raise SparkstackError(f"--image {show_path(path)}: not a complete OCI layout or image archive")
    return ImageFlag(built.name or built.config_digest, built.config_digest, path.absolute())


def resolve_knobs(recipe: Recipe, environ: Mapping[str, str], image: ImageFlag | None = None) -> Knobs:
    """Knob values by precedence: built-in defaults < the recipe < `--image` (IMAGE only) < the environment."""
    values = dict(KNOB_DEFAULTS)
    src = show_path(recipe.path)
    where = {k: "built-in default " for k in KNOB_DEFAULTS}  # where each value came from, for the one error line
    values["IMAGE"], where["IMAGE"] = recipe.docker_image, f"{src}: docker_image="
    if not recipe.knobs:  # plain shape: the recipe's own values stand in for the defaults
        values["SERVED_NAME"] = recipe.model
        values["MODEL_CACHE_NAME"] = entry_name(recipe.model)
        where["SERVED_NAME"] = where["MODEL_CACHE_NAME"] = f"{src}: model-derived "
        for flag, knob in RECIPE_VALUE_DEFAULTS.items():
            if flag in recipe.args:
                i = recipe.args.index(flag)
                if i + 1 < len(recipe.args):
                    values[knob], where[knob] = recipe.args[i + 1], f"{src} args: {flag} "
        env = dict(recipe.env)
        for knob in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
            if knob in env:
                values[knob], where[knob] = env[knob], f"{src} [env]: {knob}="
    values.update(dict(recipe.knobs))
    where.update({k: f"{src} [knobs]: {k}=" for k, _ in recipe.knobs})
    if image is not None:
        values["IMAGE"], where["IMAGE"] = image.ref, "--image "
    from_env = {k for k in KNOB_DEFAULTS if k in environ}
    values.update({k: environ[k] for k in from_env})
    where.update({k: f"environment variable {k}=" for k in from_env})
    check_knobs(values, where)
    return Knobs(values, frozenset(dict(recipe.knobs)) | frozenset(from_env), frozenset(from_env))


def check_knobs(values: Mapping[str, str], where: Mapping[str, str]) -> None:
    """The boundary for knob values: each has its kind (recipe.KNOB_KINDS); the first bad one is the error."""
    for name in KNOB_DEFAULTS:
        check_value(where[name], values[name], KNOB_KINDS[name])
    if int(values["API_PORT"]) == int(values["MASTER_PORT"]):
        # Blame the one set in the environment, when only one of them is.
        env_master = where["MASTER_PORT"].startswith("environment") and not where["API_PORT"].startswith("environment")
        first, second = ("MASTER_PORT", "API_PORT") if env_master else ("API_PORT", "MASTER_PORT")
        raise SparkstackError(f"{where[first]}{show(values[first])} is also {second}: the head cannot bind both ports")


@dataclass(frozen=True)
class RankPlan:
    rank: int
    host: str
    ssh: str | None  # None: run on this machine
    docker_host: str | None
    name: str
    fabric_ip: str
    nic: str
    hca: str
    hub: str  # host path of the HF hub mounted into the container
    docker_run: tuple[str, ...]
    secret_env: tuple[str, ...] = ()
    engine_argv: tuple[str, ...] = ()  # what follows the image in docker_run: the argv vLLM parses

    @property
    def headless(self) -> bool:
        return self.rank != 0

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "ssh": self.ssh, "docker_host": self.docker_host,
                "name": self.name, "fabric_ip": self.fabric_ip, "nic": self.nic, "hca": self.hca, "hub": self.hub,
                "docker_run": list(self.docker_run), "engine_argv": list(self.engine_argv),
                "secret_env_by_name": list(self.secret_env)}


@dataclass(frozen=True)
class Served:
    """The snapshot of one cache entry every rank serves: the recipe's pinned commit, else what refs/main names."""

    label: str  # "model" or "drafter"
    cache_name: str
    revision: str | None  # None: not pinned and no readable refs/main
    pinned: bool
    ref_main: str | None  # what the head's refs/main names: it may differ from a pinned commit

    def to_json(self) -> dict:
        return {"label": self.label, "cache_name": self.cache_name, "revision": self.revision, "pinned": self.pinned,
                "ref_main": self.ref_main}


@dataclass(frozen=True)
class LaunchPlan:
    recipe: Recipe
    knobs: Knobs
    profile: str
    image: str
    model_revision: str | None
    drafter_revision: str | None
    ranks: tuple[RankPlan, ...]
    notes: tuple[str, ...] = field(default=())
    image_source: str = "recipe"  # env, flag or recipe: which of them named the image
    image_config_digest: str | None = None  # known when --image named a built layout
    image_layout: Path | None = None  # that layout: loaded on the head where missing
    served: tuple[Served, ...] = ()

    @property
    def api_port(self) -> int:
        return int(self.knobs["API_PORT"])

    def to_json(self) -> dict:
        return {
            "recipe": self.recipe.name, "recipe_path": str(self.recipe.path), "status": self.recipe.status,
            "blocked_reason": self.recipe.blocked_reason or None, "profile": self.profile, "image": self.image,
            "image_source": self.image_source, "image_config_digest": self.image_config_digest,
            "image_layout": None if self.image_layout is None else str(self.image_layout),
            "model_revision": self.model_revision, "drafter_revision": self.drafter_revision,
            "served": [s.to_json() for s in self.served],
            "knobs": {k: self.knobs[k] for k in sorted(KNOB_DEFAULTS)}, "knobs_from_env": sorted(self.knobs.from_env),
            "ranks": [r.to_json() for r in self.ranks], "notes": list(self.notes),
        }


def _strip_flag(args: list[str], flags: tuple[str, ...]) -> int | None:
    """Remove every occurrence of the flags (with their value); return where the first one was."""
    first = None
    i = 0
    while i < len(args):
        if args[i] in flags:
            takes_value = args[i] not in BARE_FLAGS and i + 1 < len(args) and not args[i + 1].startswith("--")
            del args[i:i + (2 if takes_value else 1)]
            first = i if first is None else first
        else:
            i += 1
    return first


def _after(args: list[str], anchor: str | None) -> int:
    if anchor and anchor in args:
        i = args.index(anchor)
        return i + (2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1)
    return len(args)


def tail_args(recipe: Recipe, knobs: Knobs, drafter_path: str | None) -> list[str]:
    """The recipe's args with generated flags removed and the active knobs applied in place."""
    args = [FULL_NAMES.get(a, a) for a in recipe.args]
    _strip_flag(args, GENERATED_FLAGS + ("--load-format",) if "LOAD_FORMAT" in knobs.active else GENERATED_FLAGS)
    for knob, (flag, aliases, anchor) in VALUE_KNOBS.items():
        if knob not in knobs.active:
            continue
        at = _strip_flag(args, (flag,) + aliases)
        value = knobs[knob]
        if value == "":  # set but empty: drop the flag
            continue
        at = _after(args, anchor) if at is None else at
        args[at:at] = [flag, value]
    if "EAGER" in knobs.active:
        at = _strip_flag(args, ("--enforce-eager",))
        if knobs["EAGER"] == "1":
            args.insert(_after(args, "--moe-backend") if at is None else at, "--enforce-eager")
        elif knobs["EAGER"] not in ("0", ""):
            raise SparkstackError(f"EAGER={knobs['EAGER']!r}: expected 0 or 1")
    if "--speculative-config" in args:
        i = args.index("--speculative-config")
        args[i + 1] = speculative_config(args[i + 1], drafter_path, knobs)
    return args


def speculative_config(raw: str, drafter_path: str | None, knobs: Knobs) -> str:
    try:
        spec = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SparkstackError(f"--speculative-config is not JSON ({str(exc)[:80]}): {show(raw)}") from None
    if not isinstance(spec, dict):
        raise SparkstackError(f"--speculative-config must be a JSON object: {show(raw)}")
    ordered = {"method": spec.pop("method", "dflash")}
    if drafter_path is not None:
        spec.pop("model", None)
        ordered["model"] = drafter_path
    elif "model" in spec:
        ordered["model"] = spec.pop("model")
    if "NUM_SPEC_TOKENS" in knobs.active:
        try:
            spec["num_speculative_tokens"] = int(knobs["NUM_SPEC_TOKENS"])
        except ValueError:
            raise SparkstackError(f"NUM_SPEC_TOKENS={knobs['NUM_SPEC_TOKENS']!r} is not a whole number") from None
    ordered.update(spec)
    return json.dumps(ordered, separators=(",", ":"))


def _served(label: str, hub: Path, cache_name: str, repo: str | None, pin: str | None, notes: list[str]) -> Served:
    """The recipe's pinned commit when the entry holds its repo, else refs/main of the local entry. A bad ref
    becomes a note (the plan is still printed; preflight fails unless a pin makes refs/main moot)."""
    try:
        ref = read_ref(hub / cache_name)
    except SparkstackError as exc:
        notes.append(str(exc))
        ref = None
    if pin is not None and repo is not None and not entry_holds(cache_name, repo):
        notes.append(f"{cache_name} is not an entry of the recipe's {label} {repo}: its pinned revision does not "
                     "apply; serving refs/main")
        pin = None
    if pin is None and ref is None:
        notes.append(f"{ref_file(hub / cache_name)} is missing: preflight will fail")
    return Served(label, cache_name, pin or ref, pin is not None, ref)


def _nodes(recipe: Recipe, knobs: Knobs) -> list[NodeSpec]:
    if recipe.nodes:
        return list(recipe.nodes)
    nodes = [NodeSpec("head", None, knobs["MASTER_ADDR"], None, None, None)]
    for i in range(1, recipe.required_nodes):
        nodes.append(NodeSpec(f"worker{i}", "{WORKER_SSH}", FABRIC_IPS[i] if i < len(FABRIC_IPS) else None, None, None, None))
    return nodes


def _fill(value: str | None, knobs: Knobs, rank: int) -> str | None:
    if value is None:
        return None
    try:
        return value.format(rank=rank, **knobs.values)
    except (KeyError, IndexError, ValueError) as exc:
        raise SparkstackError(f"cannot fill {value!r}: unknown placeholder {exc}") from None


def _fill_checked(where: str | None, key: str, value: str | None, knobs: Knobs, rank: int) -> str | None:
    """A node template filled for one rank, then checked like a literal (its placeholders were checked at load)."""
    filled = _fill(value, knobs, rank)
    if filled is not None and where is not None:
        check_value(f"{where}: {key}=", filled, NODE_KINDS[key])
    return filled


def build_plan(recipe: Recipe, environ: Mapping[str, str], profile: str = "production",
               image: ImageFlag | None = None) -> LaunchPlan:
    if profile not in ("production", "lab"):
        raise SparkstackError(f"profile {profile!r}: expected production or lab")
    knobs = resolve_knobs(recipe, environ, image)
    notes = []
    if "IMAGE" in knobs.from_env:
        if image is not None:
            notes.append("IMAGE is set in the environment: it wins over --image")
        image_source, image = "env", None
    else:
        image_source = "flag" if image is not None else "recipe"
    local_hub = Path(hub_path(knobs["HF_HOME"]))
    served = [_served("model", local_hub, knobs["MODEL_CACHE_NAME"], recipe.model, recipe.model_pin, notes)]
    if recipe.drafter_cache_knob:
        served.append(_served("drafter", local_hub, knobs[recipe.drafter_cache_knob], recipe.drafter_repo,
                              recipe.drafter_pin, notes))
    in_container = {s.label: snapshot_text(CONTAINER_HUB, s.cache_name, s.revision or "<refs/main missing>")
                    for s in served}
    model_path, drafter_path = in_container["model"], in_container.get("drafter")
    tail = tail_args(recipe, knobs, drafter_path)
    nodes = _nodes(recipe, knobs)
    nnodes = len(nodes)
    ranks = []
    fabric_of: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        where = f"{show_path(recipe.path)} [[nodes]] #{rank + 1}" if recipe.nodes else f"rank {rank}"
        where += f" ({node.host})"
        # A recipe's node templates are checked once filled; the built-in nodes hold knob values, already checked.
        fill = functools.partial(_fill_checked, where if recipe.nodes else None, knobs=knobs, rank=rank)
        ssh = fill("ssh", node.ssh) if rank else None
        # One fabric address per rank: a worker silently borrowing the head's would announce the wrong host.
        fabric_ip = fill("fabric_ip", node.fabric_ip)
        if fabric_ip is None:
            if nnodes > 1:
                raise SparkstackError(f"{where}: no fabric_ip: with {nnodes} nodes every rank needs its own")
            fabric_ip = knobs["MASTER_ADDR"]
        if fabric_ip in fabric_of:
            raise SparkstackError(f"{where}: fabric address {show(fabric_ip)} is also rank {fabric_of[fabric_ip]}'s: "
                                  "every rank needs its own")
        fabric_of[fabric_ip] = rank
        nic, hca = fill("nic", node.nic) or knobs["CX_NIC"], fill("hca", node.hca) or knobs["CX_HCA"]
        name = knobs["NAME"].replace("{rank}", str(rank))
        hub = hub_path(knobs["HF_HOME"], remote=ssh is not None)
        secret = tuple(k for k in SECRET_ENV if k in environ) if rank == 0 else ()
        argv = docker_run(recipe, knobs, rank, nnodes, name, hub, fabric_ip, nic, hca, model_path, tail, profile, secret)
        engine = engine_argv(recipe, knobs, rank, nnodes, model_path, tail)
        ranks.append(RankPlan(rank, node.host, ssh, fill("docker_host", node.docker_host), name, fabric_ip, nic, hca,
                              hub, tuple(argv), secret, tuple(engine)))
    revision = {s.label: s.revision for s in served}
    return LaunchPlan(recipe, knobs, profile, knobs["IMAGE"], revision["model"], revision.get("drafter"), tuple(ranks),
                      tuple(notes), image_source, image.config_digest if image else None,
                      image.layout if image else None, tuple(served))


def docker_run(recipe: Recipe, knobs: Knobs, rank: int, nnodes: int, name: str, hub: str, fabric_ip: str, nic: str,
               hca: str, model_path: str, tail: list[str], profile: str, secret_env: tuple[str, ...]) -> list[str]:
    options = ["-d", "--name", name, "--restart", "no", "--gpus", "all", "--network", "host", "--ipc", "host",
               "--shm-size", recipe.shm_size, "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK",
               "--device", "/dev/infiniband:/dev/infiniband", "-v", f"{hub}:{CONTAINER_HUB}:ro"]
    if profile == "lab":  # the lab has no GPU, no CAP_SYS_RESOURCE and no /dev/infiniband
        for flag, value in LAB_DROPS:
            i = options.index(flag)
            assert options[i + 1] == value
            del options[i:i + 2]
    # Deliberate addition: labels that let `status` and `stop` find what sparkstack started.
    options += ["--label", f"org.sparkstack.recipe={recipe.name}", "--label", f"org.sparkstack.rank={rank}"]
    env: dict[str, str] = {"VLLM_HOST_IP": fabric_ip}
    recipe_env = dict(recipe.env)
    for knob in ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS"):
        if knob in knobs.active:
            env[knob] = knobs[knob]
            recipe_env.pop(knob, None)
    env.update(recipe_env)
    env.update(nccl_env(nic, hca))
    for k, v in env.items():
        options += ["-e", f"{k}={v}"]
    for k in secret_env:
        options += ["-e", k]
    return ["docker", "run", *options, knobs["IMAGE"], *engine_argv(recipe, knobs, rank, nnodes, model_path, tail)]


def engine_argv(recipe: Recipe, knobs: Knobs, rank: int, nnodes: int, model_path: str, tail: list[str]) -> list[str]:
    """The image's entrypoint (`vllm serve`) arguments: the model, the generated flags, then the recipe's tail."""
    engine = [model_path, "--served-model-name", knobs["SERVED_NAME"], "--host", "0.0.0.0", "--port", knobs["API_PORT"],
              "--trust-remote-code", "--tensor-parallel-size", str(recipe.tensor_parallel_size)]
    if "LOAD_FORMAT" in knobs.active and knobs["LOAD_FORMAT"]:
        engine += ["--load-format", knobs["LOAD_FORMAT"]]
    engine += ["--distributed-executor-backend", recipe.distributed_backend, "--nnodes", str(nnodes),
               "--node-rank", str(rank), "--master-addr", knobs["MASTER_ADDR"], "--master-port", knobs["MASTER_PORT"]]
    if rank != 0:
        engine.append("--headless")
    return [*engine, *tail]


def nccl_env(nic: str, hca: str) -> dict[str, str]:
    """NCCL and gloo pinned to the fabric port, as the tuned deployment runs them."""
    return {
        "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": hca, "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic,
        "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ADDR_RANGE": "10.0.0.0/24", "NCCL_NVLS_ENABLE": "0",
        "NCCL_CROSS_NIC": "0", "NCCL_IB_MERGE_NICS": "0", "NCCL_CUMEM_ENABLE": "0", "NCCL_IGNORE_CPU_AFFINITY": "1",
        "NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_IB_TIMEOUT": "22",
    }

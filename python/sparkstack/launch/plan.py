"""The launch plan: a Deployment (deploy/) plus one `docker run` argv per rank.

Pure: the deployment read what there is to read (the recipe, refs/main). This module owns the argv: docker's
options, the engine's flags, the recipe's tail with the knobs applied, the speculative config and the NCCL env.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass

from sparkstack.deploy.plan import Deployment, ImageFlag, Knobs, Rank, plan_deployment
from sparkstack.errors import SparkstackError
from sparkstack.hfcache import snapshot_text
from sparkstack.recipe import ENV_KNOBS, KNOB_DEFAULTS, Recipe
from sparkstack.text import quoted

CONTAINER_HUB = "/root/.cache/huggingface/hub"
LAB_DROPS = (("--gpus", "all"), ("--ulimit", "memlock=-1:-1"), ("--device", "/dev/infiniband:/dev/infiniband"))
SECRET_ENV = ("VLLM_API_KEY",)  # passed to docker by name only: the value never enters an argv

# Flags the launcher derives itself; a recipe's copy of any of them is removed from its args.
GENERATED_FLAGS = ("--served-model-name", "--host", "--port", "--trust-remote-code", "--tensor-parallel-size",
                   "--distributed-executor-backend", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                   "--headless")
BARE_FLAGS = {"--trust-remote-code", "--headless"}
PER_RANK_FLAGS = ("--node-rank", "--headless")  # one recipe serves every rank: a fixed copy would be wrong for one
# Where launch's value of a generated flag comes from, for the refusal of a recipe copy that says otherwise.
GENERATED_FROM = {"--served-model-name": "SERVED_NAME", "--host": "launch (every interface)", "--port": "API_PORT",
                  "--tensor-parallel-size": "the recipe's tensor_parallel_size",
                  "--distributed-executor-backend": "the recipe's distributed_backend", "--nnodes": "the rank count",
                  "--master-addr": "MASTER_ADDR", "--master-port": "MASTER_PORT"}
# Knobs that set one engine flag in the recipe's args: (flag, insert-after anchor).
VALUE_KNOBS = {
    "MAX_MODEL_LEN": ("--max-model-len", None),
    "MAX_NUM_SEQS": ("--max-num-seqs", None),
    "MAX_NUM_BATCHED_TOKENS": ("--max-num-batched-tokens", None),
    "MOE_BACKEND": ("--moe-backend", None),
    "GPU_MEM_UTIL": ("--gpu-memory-utilization", None),
    # The seed launcher wrote --kv-cache-memory, argparse's abbreviation of --kv-cache-memory-bytes: a loaded
    # recipe's args are spelled out (recipe/engine_flags.py), as the image's gate, abbreviations off, wants them.
    "KV_CACHE_MEMORY": ("--kv-cache-memory-bytes", "--kv-cache-dtype"),
}


@dataclass(frozen=True)
class RankPlan(Rank):
    """A deployment's rank plus what launch runs there."""

    docker_run: tuple[str, ...] = ()
    secret_env: tuple[str, ...] = ()
    engine_argv: tuple[str, ...] = ()  # what follows the image in docker_run: the argv vLLM parses

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "ssh": self.ssh, "docker_host": self.docker_host,
                "name": self.name, "fabric_ip": self.fabric_ip, "nic": self.nic, "hca": self.hca, "hub": self.hub,
                "docker_run": list(self.docker_run), "engine_argv": list(self.engine_argv),
                "secret_env_by_name": list(self.secret_env)}


@dataclass(frozen=True)
class LaunchPlan:
    """A Deployment plus the argv per rank, for one profile."""

    deployment: Deployment
    profile: str
    ranks: tuple[RankPlan, ...]
    gpu_memory_utilization: float  # what the engine is told (--gpu-memory-utilization), or vLLM's default
    launch_notes: tuple[str, ...] = ()  # overruled recipe copies of generated flags; a worker's `~`

    recipe = property(lambda self: self.deployment.recipe)
    knobs = property(lambda self: self.deployment.knobs)
    image = property(lambda self: self.deployment.image)
    model_revision = property(lambda self: self.deployment.model_revision)
    drafter_revision = property(lambda self: self.deployment.drafter_revision)
    notes = property(lambda self: self.deployment.notes + self.launch_notes)
    image_source = property(lambda self: self.deployment.image_source)
    image_config_digest = property(lambda self: self.deployment.image_config_digest)
    image_layout = property(lambda self: self.deployment.image_layout)
    served = property(lambda self: self.deployment.served)
    api_port = property(lambda self: self.deployment.api_port)

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


def generated_copies_overruled(recipe: Recipe, generated: list[str]) -> tuple[str, ...]:
    """A recipe's copy of a flag launch writes itself is dropped. One that says what launch says (the seed's
    `--trust-remote-code`) goes silently; one that says otherwise is named in a note, since launch's value wins
    (the seed's `--served-model-name glm53` under SERVED_NAME); a per-rank flag is refused: one recipe serves
    every rank, so a fixed copy is wrong for one of them."""
    values = {}
    for i, a in enumerate(generated):
        if a in GENERATED_FLAGS:
            values[a] = None if a in BARE_FLAGS else generated[i + 1]
    notes = []
    args = recipe.args
    for i, flag in enumerate(args):
        if flag not in GENERATED_FLAGS or flag == "--trust-remote-code":
            continue
        if flag in PER_RANK_FLAGS:
            raise SparkstackError(f"{recipe.name} args: {flag} is set per rank by launch; remove it from args")
        value = args[i + 1] if i + 1 < len(args) else ""
        if value != values[flag]:
            source = GENERATED_FROM[flag]
            notes.append(f"the recipe's args say {flag} {quoted(value)}; launch sets {flag} {quoted(values[flag])} "
                         f"from {source} (remove it from args" + (f", or set {source})" if source.isupper() else ")"))
    return tuple(notes)


def tail_args(recipe: Recipe, knobs: Knobs, drafter_path: str | None) -> list[str]:
    """The recipe's args with generated flags removed and the active knobs applied in place."""
    args = list(recipe.args)
    _strip_flag(args, GENERATED_FLAGS + ("--load-format",) if "LOAD_FORMAT" in knobs.active else GENERATED_FLAGS)
    for knob, (flag, anchor) in VALUE_KNOBS.items():
        if knob not in knobs.active:
            continue
        at = _strip_flag(args, (flag,))
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
        raise SparkstackError(f"--speculative-config is not JSON ({str(exc)[:80]}): {quoted(raw)}") from None
    if not isinstance(spec, dict):
        raise SparkstackError(f"--speculative-config must be a JSON object: {quoted(raw)}")
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


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's, when the argv sets none


def plan_launch_from_recipe(recipe: Recipe, environ: Mapping[str, str], profile: str = "production",
               image: ImageFlag | None = None) -> LaunchPlan:
    """The deployment of `recipe` in `environ`, then launch's argv for it."""
    if profile not in ("production", "lab"):
        raise SparkstackError(f"profile {profile!r}: expected production or lab")
    return plan_launch(plan_deployment(recipe, environ, image), environ, profile)


def plan_launch(deployment: Deployment, environ: Mapping[str, str], profile: str = "production") -> LaunchPlan:
    """One `docker run` argv per rank of the deployment (`environ`: which secrets pass by name)."""
    if profile not in ("production", "lab"):
        raise SparkstackError(f"profile {profile!r}: expected production or lab")
    recipe, knobs = deployment.recipe, deployment.knobs
    in_container = {s.label: snapshot_text(CONTAINER_HUB, s.cache_name, s.revision or "<refs/main missing>")
                    for s in deployment.served}
    model_path, drafter_path = in_container["model"], in_container.get("drafter")
    nnodes = len(deployment.ranks)
    launch_notes = generated_copies_overruled(recipe, engine_argv(recipe, knobs, 0, nnodes, model_path, []))
    launch_notes += tuple(f"rank {r.rank}'s {r.hub} is under its user's home on {r.ssh}: launch reads that $HOME "
                          "over ssh and writes it in before `docker run` (docker would not expand the ~)"
                          for r in deployment.ranks if r.hub.startswith("~"))
    tail = tail_args(recipe, knobs, drafter_path)
    ranks = []
    for r in deployment.ranks:
        secret = tuple(k for k in SECRET_ENV if k in environ) if r.rank == 0 else ()
        argv = docker_run(recipe, knobs, r.rank, nnodes, r.name, r.hub, r.fabric_ip, r.nic, r.hca, model_path, tail,
                          profile, secret, fabric_range(r.fabric_ip for r in deployment.ranks))
        engine = engine_argv(recipe, knobs, r.rank, nnodes, model_path, tail)
        ranks.append(RankPlan(r.rank, r.host, r.ssh, r.docker_host, r.name, r.fabric_ip, r.nic, r.hca, r.hub,
                              tuple(argv), secret, tuple(engine)))
    flag = "--gpu-memory-utilization"
    head = ranks[0].docker_run
    utilization = float(head[head.index(flag) + 1]) if flag in head else DEFAULT_GPU_MEMORY_UTILIZATION
    return LaunchPlan(deployment, profile, tuple(ranks), utilization, launch_notes)


def docker_run(recipe: Recipe, knobs: Knobs, rank: int, nnodes: int, name: str, hub: str, fabric_ip: str, nic: str,
               hca: str, model_path: str, tail: list[str], profile: str, secret_env: tuple[str, ...],
               addr_range: str) -> list[str]:
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
    for knob in ENV_KNOBS:
        if knob in knobs.active:
            env[knob] = knobs[knob]
            recipe_env.pop(knob, None)
    env.update(recipe_env)
    env.update(nccl_env(nic, hca, addr_range))
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


def fabric_range(fabric_ips) -> str:
    """The smallest network of /24 or wider holding every rank's fabric address: NCCL then takes the RoCE GIDs
    on the fabric only (10.0.0.0/24 for the seed's 10.0.0.1 and 10.0.0.2)."""
    ips = [ipaddress.IPv4Address(ip) for ip in fabric_ips]
    for prefix in range(24, -1, -1):
        net = ipaddress.IPv4Network(f"{ips[0]}/{prefix}", strict=False)
        if all(ip in net for ip in ips):
            return str(net)
    raise AssertionError("0.0.0.0/0 holds every address")


def nccl_env(nic: str, hca: str, addr_range: str) -> dict[str, str]:
    """NCCL and gloo pinned to the fabric port, as the tuned deployment runs them."""
    return {
        "NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": hca, "NCCL_IB_GID_INDEX": "3",
        "NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic,
        "NCCL_IB_ADDR_FAMILY": "AF_INET", "NCCL_IB_ADDR_RANGE": addr_range, "NCCL_NVLS_ENABLE": "0",
        "NCCL_CROSS_NIC": "0", "NCCL_IB_MERGE_NICS": "0", "NCCL_CUMEM_ENABLE": "0", "NCCL_IGNORE_CPU_AFFINITY": "1",
        "NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_IB_TIMEOUT": "22",
    }

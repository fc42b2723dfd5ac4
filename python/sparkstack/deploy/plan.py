"""The deployment, planned: recipe + environment -> knobs, ranks, hubs and the snapshots every rank serves.

Pure apart from reading the recipe and refs/main of its two cache entries on this machine. Precedence:
built-in defaults < the recipe's knob defaults and values < `--image` (IMAGE only) < environment variables set.
launch, tune, ship, fetch, soak and top take a `Deployment`; launch adds the docker argv per rank.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkstack.errors import SparkstackError, UsageError
from sparkstack.hfcache import entry_holds, entry_name, hub_path, read_ref, ref_file
from sparkstack.recipe import ENV_KNOBS, KNOB_DEFAULTS, KNOB_KINDS, NODE_KINDS, NodeSpec, Recipe, check_value, load_recipe
from sparkstack.remote import Runner
from sparkstack.text import printable, quoted

FABRIC_IPS = ("10.0.0.1", "10.0.0.2")
# Generated flags whose value a plain recipe may set in its own args, as that knob's default.
RECIPE_VALUE_DEFAULTS = {"--served-model-name": "SERVED_NAME", "--port": "API_PORT",
                         "--master-addr": "MASTER_ADDR", "--master-port": "MASTER_PORT"}
ACTIONS = ("all", "stop", "status")  # the words launch takes besides a rank number


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
            raise SparkstackError(f"--image {printable(path)}: no such OCI layout or image archive")
        return ImageFlag(value, None, None)
    built = complete_output(path)
    if built is None:
        raise SparkstackError(f"--image {printable(path)}: not a complete OCI layout or image archive")
    return ImageFlag(built.name or built.config_digest, built.config_digest, path.absolute())


def resolve_knobs(recipe: Recipe, environ: Mapping[str, str], image: ImageFlag | None = None) -> Knobs:
    """Knob values by precedence: built-in defaults < the recipe < `--image` (IMAGE only) < the environment."""
    values = dict(KNOB_DEFAULTS)
    src = printable(recipe.path)
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
        for knob in ENV_KNOBS:
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
        raise SparkstackError(f"{where[first]}{quoted(values[first])} is also {second}: the head cannot bind both ports")


@dataclass(frozen=True)
class Rank:
    """One machine of the deployment: where it is reached, its container, its fabric port and its hub."""

    rank: int
    host: str
    ssh: str | None  # None: run on this machine
    docker_host: str | None
    name: str  # the container's
    fabric_ip: str
    nic: str
    hca: str
    hub: str  # host path of the HF hub mounted into the container

    @property
    def headless(self) -> bool:
        return self.rank != 0


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
class Deployment:
    recipe: Recipe
    knobs: Knobs
    ranks: tuple[Rank, ...]
    served: tuple[Served, ...] = ()
    notes: tuple[str, ...] = field(default=())
    image_source: str = "recipe"  # env, flag or recipe: which of them named the image
    image_config_digest: str | None = None  # known when --image named a built layout
    image_layout: Path | None = None  # that layout: loaded on the head where missing

    @property
    def image(self) -> str:
        return self.knobs["IMAGE"]

    @property
    def api_port(self) -> int:
        return int(self.knobs["API_PORT"])

    def revision(self, label: str) -> str | None:
        return {s.label: s.revision for s in self.served}.get(label)

    @property
    def model_revision(self) -> str | None:
        return self.revision("model")

    @property
    def drafter_revision(self) -> str | None:
        return self.revision("drafter")

    @property
    def local_hub(self) -> Path:
        """The hub on this machine (the head's)."""
        return Path(hub_path(self.knobs["HF_HOME"]))

    @property
    def cache_names(self) -> tuple[str, ...]:
        """The recipe's model and drafter cache entries (MODEL_CACHE_NAME and the drafter's knob)."""
        names = [self.knobs["MODEL_CACHE_NAME"]]
        if self.recipe.drafter_cache_knob:
            names.append(self.knobs[self.recipe.drafter_cache_knob])
        return tuple(names)


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


def plan_deployment(recipe: Recipe, environ: Mapping[str, str], image: ImageFlag | None = None) -> Deployment:
    """Knobs by precedence, the snapshots served, and one Rank per node (templates filled and checked)."""
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
    return Deployment(recipe, knobs, tuple(_ranks(recipe, knobs)), tuple(served), tuple(notes), image_source,
                      image.config_digest if image else None, image.layout if image else None)


def _ranks(recipe: Recipe, knobs: Knobs) -> list[Rank]:
    nodes = _nodes(recipe, knobs)
    nnodes = len(nodes)
    ranks = []
    fabric_of: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        where = f"{printable(recipe.path)} [[nodes]] #{rank + 1}" if recipe.nodes else f"rank {rank}"
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
            raise SparkstackError(f"{where}: fabric address {quoted(fabric_ip)} is also rank {fabric_of[fabric_ip]}'s: "
                                  "every rank needs its own")
        fabric_of[fabric_ip] = rank
        nic, hca = fill("nic", node.nic) or knobs["CX_NIC"], fill("hca", node.hca) or knobs["CX_HCA"]
        name = knobs["NAME"].replace("{rank}", str(rank))
        hub = hub_path(knobs["HF_HOME"], remote=ssh is not None)
        ranks.append(Rank(rank, node.host, ssh, fill("docker_host", node.docker_host), name, fabric_ip, nic, hca, hub))
    if nnodes > 1:
        _check_rendezvous(knobs["MASTER_ADDR"], ranks)
    return ranks


def _check_rendezvous(master_addr: str, ranks: list[Rank]) -> None:
    """The workers meet rank 0 at MASTER_ADDR and each other at their fabric addresses: none of them may be one
    only its own host can reach. (That MASTER_ADDR is an address of rank 0's host is preflight's to check.)"""
    for r in ranks:
        if ipaddress.ip_address(r.fabric_ip).is_loopback:
            raise SparkstackError(f"rank {r.rank} ({r.host}): fabric address {quoted(r.fabric_ip)} is a loopback "
                                  f"address: the other {len(ranks) - 1} rank(s) cannot reach it")
    if ipaddress.ip_address(master_addr).is_loopback:
        raise SparkstackError(f"MASTER_ADDR={quoted(master_addr)} is a loopback address: the workers cannot reach "
                              f"rank 0 there; set MASTER_ADDR={ranks[0].fabric_ip} (rank 0's fabric address)")


def load_deployment(recipe: str | None, environ: Mapping[str, str], image: str | None = None) -> Deployment:
    """The one loader: a recipe by name or path (None: the default), the environment, and `--image` if given."""
    loaded = load_recipe(recipe)
    return plan_deployment(loaded, environ, image_flag(image) if image is not None else None)


def runner_for(rank: Rank, ssh_config: Path | None) -> Runner:
    """How to run commands on a rank: here, or over ssh; its docker at its docker_host."""
    return Runner(ssh=rank.ssh, ssh_config=ssh_config, docker_host=rank.docker_host)


def select_ranks(plan, target: str, actions: tuple[str, ...] = ACTIONS) -> list:
    """The ranks a TARGET names: one rank number, or `all` (`actions`: the other words the command takes).
    `plan` is a Deployment, or anything with its `ranks` (launch's plan)."""
    if target == "all":
        return list(plan.ranks)
    if target.isascii() and target.isdigit() and str(int(target)) == target and int(target) < len(plan.ranks):
        return [plan.ranks[int(target)]]
    raise UsageError(f"TARGET must be a rank (0..{len(plan.ranks) - 1}), {', '.join(actions)}; got {target!r}")

"""Writing a recipe: pinned revisions, edited in place through tomlkit; a shipped recipe is never edited."""

from __future__ import annotations

import codecs
import shlex
import tomllib
from collections.abc import Sequence
from pathlib import Path

from sparkstack import fsio, shipped
from sparkstack.errors import SparkstackError
from sparkstack.recipe.load import KvBoot, Recipe, kv_boot
from sparkstack.recipe.values import UNPINNED, check_value, commit_or_unpinned
from sparkstack.text import printable


RECIPE_COPY = "my-recipe.toml"  # where the steps for an installed recipe copy it: the current directory


def copy_and_rerun(recipe: Path, rerun: Sequence[str]) -> str:
    """The steps for a recipe installed with sparkstack, which is never edited in place: copy it here, then run
    `rerun` (the command line that writes the recipe, without its --recipe) on the copy."""
    return (f"{shlex.join(['cp', str(recipe), RECIPE_COPY])} && "
            f"{shlex.join([*rerun, '--recipe', './' + RECIPE_COPY])}")


def refuse_installed_recipe(recipe: Recipe, rerun: Sequence[str]) -> None:
    """A recipe installed with sparkstack (package data, site-packages, the Nix store) is never edited in place: the
    refusal says to copy it and run `rerun` (the command that writes it, without its --recipe) on the copy."""
    root = shipped.installed_copy_root(recipe.path)
    if root is not None:
        raise SparkstackError(f"{printable(recipe.path)}: is a shipped recipe installed under {printable(root)}, not "
                              f"writable; copy it and run again on the copy: {copy_and_rerun(recipe.path, rerun)}")


def _refuse_symlink(recipe: Recipe, rerun: Sequence[str]) -> None:
    """Replacing a symlink would put a regular file where the link was, the target unchanged: write the target."""
    if recipe.path.is_symlink():
        raise SparkstackError(f"{printable(recipe.path)}: is a symlink; write the file it names instead: "
                              f"{shlex.join([*rerun, '--recipe', str(recipe.path.resolve())])}")


def write_revisions(recipe: Recipe, model_revision: str | None, drafter_revision: str | None,
                    rerun: Sequence[str]) -> None:
    """Pin revisions in the recipe's file through tomlkit (comments and layout stay), replaced atomically.

    None leaves a field alone. An installed or symlinked recipe is refused, with the command to run instead
    (`rerun`: the command that pins, without its --recipe)."""
    import tomlkit

    path, w = recipe.path, printable(recipe.path)
    refuse_installed_recipe(recipe, rerun)
    _refuse_symlink(recipe, rerun)
    raw = path.read_bytes()
    bom = codecs.BOM_UTF8 if raw.startswith(codecs.BOM_UTF8) else b""
    original = raw.decode("utf-8-sig")
    doc, expect = tomlkit.parse(original), tomllib.loads(original)
    for table, plain, key, was, new in ((doc, expect, "model_revision", recipe.model_revision, model_revision),
                                        (doc.get("drafter"), expect.get("drafter"), "revision", recipe.drafter_revision,
                                         drafter_revision)):
        if new is None:
            continue
        check_value(f"{w}: {key}=", new, commit_or_unpinned)
        if plain.get(key, UNPINNED) != was:
            raise SparkstackError(f"{w}: {key} changed since it was read; run again")
        table[key] = plain[key] = new
    text = tomlkit.dumps(doc)
    if tomllib.loads(text) != expect:  # the edit landed on exactly those keys, and nothing else moved
        raise SparkstackError(f"{w}: pinning would change more than the revision fields; nothing written")
    fsio.write_atomic(path, bom + text.encode("utf-8"))


def write_kv_boot(recipe: Recipe, entry: KvBoot, rerun: Sequence[str]) -> bool:
    """Record a boot's KV measurement in the recipe's file as [kv.boot], through tomlkit (comments and layout stay),
    replaced atomically; an installed or symlinked recipe is refused, as write_revisions refuses it (`rerun`: the
    command that records it, without its --recipe).

    A pinned boot's pool is exact, so it also becomes the planner's calibration point ([kv] measured_bytes and
    measured_tokens: the per-token cost `plan kv` divides by); returns whether it did. A profiled pool (its bytes
    good to 0.01 GiB) is recorded beside the cost and leaves it alone."""
    import tomlkit

    path, w = recipe.path, printable(recipe.path)
    refuse_installed_recipe(recipe, rerun)
    _refuse_symlink(recipe, rerun)
    table = entry.toml()
    kv_boot(f"{w} [kv.boot]", table)  # what is written is what the loader accepts
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

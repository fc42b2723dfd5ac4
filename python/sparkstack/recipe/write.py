"""Writing a recipe: pinned revisions, edited in place through tomlkit; a shipped recipe is never edited."""

from __future__ import annotations

import codecs
import shlex
import tomllib

from sparkstack import fsio, shipped
from sparkstack.errors import SparkstackError
from sparkstack.recipe.load import KvBoot, Recipe, kv_boot
from sparkstack.recipe.values import UNPINNED, check_value, commit_or_unpinned
from sparkstack.text import printable


def refuse_installed_recipe(recipe: Recipe) -> None:
    """A recipe installed with sparkstack (package data, site-packages, the Nix store) is never edited in place."""
    root = shipped.installed_copy_root(recipe.path)
    if root is not None:
        raise SparkstackError(f"{printable(recipe.path)}: is a shipped recipe installed under {printable(root)}, not "
                              f"writable; copy it and pin the copy: cp {shlex.quote(str(recipe.path))} my-recipe.toml "
                              "&& sparkstack fetch --resolve --recipe ./my-recipe.toml")


def write_revisions(recipe: Recipe, model_revision: str | None, drafter_revision: str | None) -> None:
    """Pin revisions in the recipe's file through tomlkit (comments and layout stay), replaced atomically.

    None leaves a field alone. An installed recipe is refused, with the copy command to run."""
    import tomlkit

    path, w = recipe.path, printable(recipe.path)
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
        check_value(f"{w}: {key}=", new, commit_or_unpinned)
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

    path, w = recipe.path, printable(recipe.path)
    refuse_installed_recipe(recipe)
    if path.is_symlink():
        raise SparkstackError(f"{w}: is a symlink; write the file it names instead: --recipe "
                              f"{shlex.quote(str(path.resolve()))}")
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

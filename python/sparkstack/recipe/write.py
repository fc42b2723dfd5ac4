"""Writing a recipe: pinned revisions, edited in place through tomlkit; a shipped recipe is never edited."""

from __future__ import annotations

import codecs
import shlex
import tomllib

from sparkstack import fsio, shipped
from sparkstack.errors import SparkstackError
from sparkstack.recipe.load import Recipe
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

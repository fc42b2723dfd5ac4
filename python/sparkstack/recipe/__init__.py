"""Recipes: the existing TOML recipe shape, plus knobs, nodes, status, drafter and KV geometry.

values.py holds the value kinds, knobs.py the knob tables, load.py the loading (validated, frozen data; nothing
touches the host) and write.py the pinning of revisions and the boot's KV measurement ([kv.boot]) in a recipe's file. kv.py is the KV planner.
"""

from sparkstack.recipe.knobs import (
    CACHE_NAME_KNOBS, ENV_KNOBS, KNOB_DEFAULTS, KNOB_KINDS, NODE_KINDS, PLACEHOLDERS, RECIPE_ONLY_ENV, VALUE_FLAGS,
)
from sparkstack.recipe.load import (
    BOOT_MISSING, CLOCK_CAP_MAX_MHZ, CONFIRM_KEYS, DEFAULT_CLOCK_CAP, DEFAULT_GPU_MEMORY_GIB, DEFAULT_RECIPE,
    KV_BOOT_POOLS, MAX_NODES, BootExpect, KvBoot, KvGeometry, NodeSpec, Recipe, check_args, find_recipe, load_recipe, placeholders, unquote_arg,
)
from sparkstack.recipe.values import UNPINNED, Kind, check_value, meaning
from sparkstack.recipe.write import copy_and_rerun, refuse_installed_recipe, write_kv_boot, write_revisions

__all__ = [
    "BOOT_MISSING", "CACHE_NAME_KNOBS", "CLOCK_CAP_MAX_MHZ", "CONFIRM_KEYS", "DEFAULT_CLOCK_CAP", "DEFAULT_GPU_MEMORY_GIB",
    "DEFAULT_RECIPE", "ENV_KNOBS", "KV_BOOT_POOLS", "KvBoot", "KNOB_DEFAULTS", "KNOB_KINDS", "MAX_NODES", "NODE_KINDS", "PLACEHOLDERS",
    "RECIPE_ONLY_ENV", "UNPINNED", "VALUE_FLAGS", "BootExpect", "Kind", "KvGeometry", "NodeSpec", "Recipe",
    "check_args", "check_value", "copy_and_rerun", "find_recipe", "load_recipe", "meaning", "placeholders", "refuse_installed_recipe",
    "unquote_arg", "write_kv_boot", "write_revisions",
]

"""Which tensors belong to the MTP (multi-token prediction) layer, and the config edit that disables it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sparkstack.errors import SparkstackError
from sparkstack.text import quoted

# The published GLM-5.3-Flash main stack has 45 layers; MTP sits at index 45.
DEFAULT_NUM_HIDDEN_LAYERS = 45
# Far above any real model; a larger value is a typo or hostile, and would silently find no MTP layer.
MAX_NUM_HIDDEN_LAYERS = 100_000
MTP_COMPONENTS = frozenset({"mtp", "mtp_layers", "nextn", "shared_head"})
# The numeric rule covers the language model's decoder stack only (a vision tower has layers of its own),
# under the prefixes the text stack takes in plain and multimodal checkpoints.
_TEXT_STACK_LAYER = re.compile(r"(?:model\.|model\.language_model\.|language_model\.model\.)layers\.(\d+)\.")
_ANY_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _at_least(digits: str, n: int) -> bool:
    """int(digits) >= n, without converting a hostile thousand-digit index (Python refuses past 4300)."""
    digits = digits.lstrip("0")
    return len(digits) > len(str(n)) or int(digits or "0") >= n


def _mtp_by_name(key: str) -> bool:
    return any(part in MTP_COMPONENTS for part in key.split("."))


def is_mtp_key(key: str, num_hidden_layers: int) -> bool:
    """A key is MTP when it sits in a text-stack layer at or past the main stack, or under an MTP-named component."""
    match = _TEXT_STACK_LAYER.match(key)
    if match and _at_least(match.group(1), num_hidden_layers):
        return True
    return _mtp_by_name(key)


def numbered_outside_text_stack(keys: Iterable[str], num_hidden_layers: int) -> tuple[str, ...]:
    """Keys kept only because the numeric rule stops at the text stack: a layer index >= num_hidden_layers
    anywhere else (a vision tower, say). Reported, so a checkpoint with an unusual prefix is noticed."""
    found = []
    for key in keys:
        match = _ANY_LAYER.search(key)
        if match and _at_least(match.group(1), num_hidden_layers) and not is_mtp_key(key, num_hidden_layers):
            found.append(key)
    return tuple(sorted(found))


@dataclass(frozen=True)
class LayerCount:
    value: int
    source: str  # "config.json", "config.json text_config" or "default"


def num_hidden_layers(config: dict[str, Any], path: str = "config.json") -> LayerCount:
    """Read num_hidden_layers from the top level or text_config; both present must agree."""
    found = {}
    if "num_hidden_layers" in config:
        found["config.json"] = config["num_hidden_layers"]
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        found["config.json text_config"] = text["num_hidden_layers"]
    for where, value in found.items():
        key = "num_hidden_layers" if where == "config.json" else "text_config.num_hidden_layers"
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_NUM_HIDDEN_LAYERS:
            raise SparkstackError(f"{path}: {key} must be an integer from 1 to {MAX_NUM_HIDDEN_LAYERS}, "
                                  f"got {quoted(value)}")
    if len(set(found.values())) > 1:
        raise SparkstackError(f"{path}: num_hidden_layers disagrees between levels: {found}")
    if not found:
        return LayerCount(DEFAULT_NUM_HIDDEN_LAYERS, "default")
    where, value = next(iter(found.items()))
    return LayerCount(value, where)


def mtp_keys(names: Iterable[str], num_hidden_layers: int) -> list[str]:
    """The MTP tensors among `names`, in their order (what strip drops)."""
    return [name for name in names if is_mtp_key(name, num_hidden_layers)]


def mtp_levels_left(config: dict[str, Any]) -> list[str]:
    """The config levels (top, text_config) where MTP is not switched off as config_without_mtp leaves it:
    `<where> num_nextn_predict_layers = <value>` for each; [] when stripped."""
    levels = {"config.json": config}
    if isinstance(config.get("text_config"), dict):
        levels["text_config"] = config["text_config"]
    return [f"{where} num_nextn_predict_layers = {level.get('num_nextn_predict_layers', 'unset')}"
            for where, level in levels.items()
            if level.get("num_nextn_predict_layers") != 0 or isinstance(level.get("num_nextn_predict_layers"), bool)]


def config_without_mtp(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy with MTP switched off at the top level and, when present, inside text_config."""
    edited = dict(config)
    levels = [edited]
    if isinstance(edited.get("text_config"), dict):
        edited["text_config"] = dict(edited["text_config"])
        levels.append(edited["text_config"])
    for level in levels:
        level["num_nextn_predict_layers"] = 0
        level["index_share_for_mtp_iteration"] = False
    return edited

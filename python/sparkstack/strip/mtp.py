"""Which tensors belong to the MTP (multi-token prediction) layer, and the config edit that disables it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sparkstack.errors import SparkstackError

# The published GLM-5.3-Flash main stack has 45 layers; MTP sits at index 45.
DEFAULT_NUM_HIDDEN_LAYERS = 45
MTP_COMPONENTS = frozenset({"mtp", "mtp_layers", "nextn", "shared_head"})
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def is_mtp_key(key: str, num_hidden_layers: int) -> bool:
    """A key is MTP when it sits in a layer at or past the main stack, or under an MTP-named component."""
    match = _LAYER_INDEX.search(key)
    if match and int(match.group(1)) >= num_hidden_layers:
        return True
    return any(part in MTP_COMPONENTS for part in key.split("."))


@dataclass(frozen=True)
class LayerCount:
    value: int
    source: str  # "config.json", "config.json text_config" or "default"


def num_hidden_layers(config: dict[str, Any]) -> LayerCount:
    """Read num_hidden_layers from the top level or text_config; both present must agree."""
    found = {}
    if "num_hidden_layers" in config:
        found["config.json"] = config["num_hidden_layers"]
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        found["config.json text_config"] = text["num_hidden_layers"]
    for where, value in found.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SparkstackError(f"{where}: num_hidden_layers must be a positive integer, got {value!r}")
    if len(set(found.values())) > 1:
        raise SparkstackError(f"config.json: num_hidden_layers disagrees between levels: {found}")
    if not found:
        return LayerCount(DEFAULT_NUM_HIDDEN_LAYERS, "default")
    where, value = next(iter(found.items()))
    return LayerCount(value, where)


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

"""The options several commands share, each defined once (as pip's cmdoptions): a command calls the definition,
or embeds a group (`command.embed`), and never spells the flag again. A command's own help may say what the option
means there (--recipe in bench is the reference's recipe); default, kind and flag stay the definition's."""

from __future__ import annotations

from dataclasses import dataclass

from sparkstack.command import option

RECIPE_HELP = ("Recipe name (shipped, or under SPARKSTACK_RECIPES) or path. Default: glm53-flash-dflash2-nvfp4.")
TEMPERATURE_HELP = "Sampling temperature (1.0 is the model's own default)."


def recipe_option(help: str = RECIPE_HELP):
    return option(None, "--recipe", help=help)


def image_option(help: str, kind: object = "text"):
    return option(None, "--image", kind=kind, help=help)


def temperature_option(help: str = TEMPERATURE_HELP):
    return option(1.0, "--temperature", kind=("float", 0, 2), show_default=True, help=help)


def top_p_option():
    return option(0.95, "--top-p", kind=("float", 0, 1), show_default=True, help="Sampling top_p.")


@dataclass(frozen=True, kw_only=True)
class SamplingOptions:
    """How the requests sample: bench's, soak's, and (temperature) up's and sweep's for their bench."""

    temperature: float = temperature_option()
    top_p: float = top_p_option()

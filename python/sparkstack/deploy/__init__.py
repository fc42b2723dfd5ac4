"""The deployment (`deploy.plan`): recipe + environment -> knobs, ranks, hubs and served snapshots.

Its floor stands above recipe, hfcache and remote, below every command that acts on the ranks: launch, tune,
ship, fetch, soak and top take its `Deployment`.
"""

from sparkstack.deploy.plan import (
    Deployment,
    ImageFlag,
    Knobs,
    Rank,
    Served,
    image_flag,
    load_deployment,
    plan_deployment,
    resolve_knobs,
    runner_for,
    select_ranks,
)

__all__ = ["Deployment", "ImageFlag", "Knobs", "Rank", "Served", "image_flag", "load_deployment", "plan_deployment",
           "resolve_knobs", "runner_for", "select_ranks"]

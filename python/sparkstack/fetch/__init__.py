"""`sparkstack fetch`: the recipe's pinned model and drafter commits into the head's HF cache."""

from sparkstack.fetch.apply import EntryResult, apply_fetch, apply_resolve
from sparkstack.fetch.plan import FetchPlan, ResolvePlan, plan_fetch, plan_resolve

__all__ = ["EntryResult", "FetchPlan", "ResolvePlan", "apply_fetch", "apply_resolve", "plan_fetch", "plan_resolve"]

"""MTP removal: plan from headers, then a zero-copy, verified, atomic rewrite."""

from sparkstack.strip.apply import StripResult, apply_plan
from sparkstack.strip.plan import StripPlan, make_plan

__all__ = ["StripPlan", "StripResult", "apply_plan", "make_plan"]

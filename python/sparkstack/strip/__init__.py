"""MTP removal: plan from headers, then a zero-copy, verified, atomic rewrite."""

from sparkstack.strip.apply import StripResult, apply_strip
from sparkstack.strip.plan import StripPlan, plan_strip

__all__ = ["StripPlan", "StripResult", "apply_strip", "plan_strip"]

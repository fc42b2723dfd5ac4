"""`sparkstack up`: the whole runbook as one planned, resumable command. It composes the stages' command
objects (plan/apply, one spelling each); the areas act."""

from sparkstack.up.apply import UpResult, apply_up
from sparkstack.up.plan import STAGES, UpPlan, plan_up, stage_range

__all__ = ["STAGES", "UpPlan", "UpResult", "apply_up", "plan_up", "stage_range"]

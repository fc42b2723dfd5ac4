"""`sparkstack up`: the whole runbook as one planned, resumable command. It composes; the areas act."""

from sparkstack.up.apply import StageFailed, UpInterrupted, UpResult, apply_up, read_record, record_path
from sparkstack.up.plan import STAGES, UpInputs, UpPlan, plan_up, stage_range

__all__ = ["STAGES", "StageFailed", "UpInputs", "UpInterrupted", "UpPlan", "UpResult", "apply_up", "plan_up",
           "read_record", "record_path", "stage_range"]

"""`sparkstack verify URL`: prove a served OpenAI-compatible vLLM endpoint does what the stack needs.

checks.py holds the checks as data (required or warn-only) with their probes; run.py plans (pure) and runs them,
returning frozen results."""

from sparkstack.verify.checks import CHECKS, VerifyCheck, served_models
from sparkstack.verify.run import (
    Result,
    VerifyPlan,
    mask_key,
    plan_verify,
    run_verify,
    verdict,
)

__all__ = ["CHECKS", "Result", "VerifyCheck", "VerifyPlan", "mask_key", "plan_verify", "run_verify", "served_models",
           "verdict"]

"""Daemonless, deterministic image builds from a pinned base and a declarative overlay."""

from sparkstack.image.build import BuildPlan, BuildResult, build_image, drift_report, pin_overlay, plan_build

__all__ = ["BuildPlan", "BuildResult", "build_image", "drift_report", "pin_overlay", "plan_build"]

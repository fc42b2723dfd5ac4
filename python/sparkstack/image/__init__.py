"""Daemonless, deterministic image builds from a pinned base and a declarative overlay."""

from sparkstack.image.build import BuildResult, build_image
from sparkstack.image.plan import BuildPlan, plan_build

__all__ = ["BuildPlan", "BuildResult", "build_image", "plan_build"]

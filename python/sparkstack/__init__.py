"""sparkstack: plan, build, ship and launch GLM-5.3-Flash + DFlash2 on DGX Spark pairs."""

__version__ = "0.1.0"

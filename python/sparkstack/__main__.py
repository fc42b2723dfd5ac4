"""`python -m sparkstack`: the same CLI as the `sparkstack` script."""

from sparkstack.cli import entry

entry()

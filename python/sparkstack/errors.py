"""The one exception type that reaches the user as a single line."""


class SparkstackError(Exception):
    """A failed check or operation. The CLI prints str(exc) on one line and exits 1."""


class UsageError(SparkstackError):
    """A bad command line: the CLI prints str(exc) on one line and exits 2."""

"""`sparkstack top`: a live view of a serving engine from its /metrics (no request is ever sent)."""

"""Measure a served stack: the fixed prompt suite, bench blocks, and run-to-run comparison."""

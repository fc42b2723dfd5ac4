"""Host tuning (`sparkstack tune`): facts.py reads a rank's host facts, plan.py says what differs, apply.py acts.

Kept empty of imports: launch's preflight reads tune.facts, and tune's plan reads launch's plan.
"""

"""Host tuning (`sparkstack tune`): facts.py reads a rank's host facts, plan.py says what differs, apply.py acts.

Kept empty of imports. tune stands below launch: its plan reads deploy's Deployment, and launch's preflight,
guard and --drop-caches read tune.facts and tune.pagecache.
"""

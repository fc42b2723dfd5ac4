"""MTP removal: plan from headers, then a zero-copy, verified, atomic rewrite (plan.py, apply.py; the command in
command.py). Nothing is imported here, so that naming the command loads only its declaration."""

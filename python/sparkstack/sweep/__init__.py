"""`sparkstack sweep`: vary knobs over boots of the pair, bench each cell with one salt, one table and one picture.

plan.py (the cells, their order and identities), state.py (the per-sweep record and the intended apply), report.py
(the table), plot.py (the picture). The apply is written on the command objects (stop, launch, bench)."""

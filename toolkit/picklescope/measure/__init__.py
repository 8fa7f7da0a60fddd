"""Measurement: warm child processes, the sides' bodies, sampling on one clock, budgets, the watchdog,
the one kill record, verdicts. A measured run is started, fed and folded into a result here."""

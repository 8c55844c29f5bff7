"""Attacks on dpsql that run, each against an unprotected baseline and against dpsql itself.

Every module here is runnable as `python -m benchmarks.attacks.<name>` (from the repository root) and prints
its outcome with the figures behind it; `tests/attacks/` runs the same code at CI sizes and asserts on it.

- tracker: "how many smokers" minus "how many smokers other than X" (Denning 1980);
- averaging: the same query asked until the noise averages away;
- reconstruction: Dinur-Nissim least squares over many random subset counts;
- floating_point: Mironov's (CCS 2012) low-bits distinguisher on textbook float Laplace and on dpsql;
- error_oracle: a query whose *failure* depends on one person's row (a side channel found by this work);
- audit: an empirical lower bound on epsilon from neighbouring datasets, per mechanism and aggregate;
- sensitivity: measurement changes between a dataset and the same without one unit (property tests);
- ledger_faults: concurrent spenders and SIGKILLed processes against one budget ledger;
- fuzz: generated and mutated SQL through the whole pipeline.

Randomness: every run takes a seed and draws dpsql's noise from its test-only seeded generator, so figures
repeat exactly. Statistical claims carry Clopper-Pearson (or Hoeffding) intervals, never hand-picked slack.
"""

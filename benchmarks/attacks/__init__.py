"""Attacks on dpsql that run, each against an unprotected baseline and against dpsql itself (issue 3).

Every attack module is runnable as `python -m benchmarks.attacks.<name>` (from the repository root) and prints
its outcome with the figures behind it; `tests/attacks/` runs the same code at CI sizes and asserts on it.

Attacks and checks:
- tracker: "how many smokers" minus "how many smokers other than X" (Denning 1980);
- averaging: the same query asked until the noise averages away;
- reconstruction: Dinur-Nissim least squares over many random subset counts;
- floating_point: Mironov's (CCS 2012) low-bits distinguisher on textbook float Laplace and on dpsql;
- error_oracle: queries whose *failure* depends on one person's row (side channels found by this suite);
- audit (with audit_events): an empirical lower bound on epsilon from neighbouring datasets;
- sensitivity: measurement changes between a dataset and the same without one unit (property tests);
- ledger_faults (with ledger_worker): concurrent spenders, SIGKILLed processes, unwritable ledgers;
- fuzz (with fuzz_grammar): generated and mutated SQL through the whole pipeline;
- side_channels: issue 7's classes 2 (the optimizer moving analyst code out of TRY) and 4 (Python after the
  charge: lossy conversions, merged groups), one bit of one row per query;
- timing (class 5): one row's nested text growth against the clock, with and without the query time limit;
- differential: generated accepted row expressions on tables that differ in one adversarial row (errors, merges,
  per-row work).

Shared parts: baseline (plain DuckDB), people (the two-world guessing game), sampling (the bounded SQL once,
dpsql's release many times), stats (Clopper-Pearson, DP bounds), script; datasets, policies and seeded sessions
come from benchmarks/support.py, which the tests use too.

Randomness: every run takes a seed and draws dpsql's noise from its test-only seeded generator, so figures
repeat exactly. Statistical claims carry Clopper-Pearson (or Hoeffding) intervals, never hand-picked slack.
"""

"""Attacks, the empirical DP audit, sensitivity edge cases, ledger faults and fuzzing (issue 3), at CI sizes.

The attack code lives in benchmarks/attacks/, where each attack also runs as a script with larger sizes.
"""

"""How many generated cases a sweep runs: all of them in the full suite (CI), a quarter in the fast inner loop.

The fast loop (`pytest -m "not slow"`) exists to be run after every change, so it samples the property tests and
fuzzers instead of skipping them; the full suite runs every case. conftest.py decides which run this is from the
marker expression before any test module is imported.
"""

FAST = False
SHARE = 4  # the fast loop runs one case in SHARE
FLOOR = 10  # and never fewer than this, so a sampled sweep still has a chance to find what the whole one finds


def cases(full: int, floor: int = FLOOR) -> int:
    """The number of cases to run of a sweep of `full` (at least `floor` of them in the fast loop)."""
    return min(full, max(floor, full // SHARE)) if FAST else full

"""From raw observations to per-cell statistics, dpsql-to-peer ratios and coverage.

A *cell* is one released value: (data set, query, aggregate, group). Per cell, system and epsilon: the median and
95th percentile of the relative error |released - truth| / |truth| over the runs, against the bounded truth (what
the mechanism is centred on) and against the raw truth; the empirical coverage of dpsql's 95% intervals of the
bounded truth; and the mechanism's theoretical error from the noise standard deviation dpsql reports.

Theory: for Laplace noise with standard deviation s, the median of |noise| is s ln2/sqrt2 and its 95th percentile
s ln20/sqrt2. This is exact for a value from one measurement (a COUNT, or a SUM dpsql measures directly) and a
first-order approximation for the combinations of measurements (SUM = S + mid N, AVG, VAR, STDDEV).

A non-finite release (a peer's AVG over a noisy count of 0, the square root of a negative variance) counts as an
infinite error. Cells whose exact value is 0 have no relative error and are left out (none in this workload).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.records import DPSQL, Observation, Truth
from benchmarks.workload import Query

LAPLACE_MEDIAN_PER_STD = math.log(2) / math.sqrt(2)
LAPLACE_P95_PER_STD = math.log(20) / math.sqrt(2)
SMALL_CELL = 0.03  # cells holding less than 3% of the table's rows are "small" (the workload aims at ~1-2%)
LARGE_CELL = 0.10


def size_class(fraction: float) -> str:
    return "small" if fraction < SMALL_CELL else "large" if fraction >= LARGE_CELL else "medium"


@dataclass(frozen=True, slots=True)
class Cell:
    """One released value: (data set, query, aggregate, group), with the size class of its group."""

    dataset: str
    query: str
    aggregate: str
    kind: str
    group: str
    size: str  # small, medium, large
    grouped: bool
    basic: bool  # the query asks COUNT/SUM/AVG only


@dataclass(frozen=True, slots=True)
class CellStat(Cell):
    fraction: float
    system: str
    epsilon: float
    runs: int
    truth_bounded: float
    truth_raw: float | None
    median_rel: float
    p95_rel: float
    median_rel_ci_low: float  # a 95% confidence interval of the median (order statistics)
    median_rel_ci_high: float
    median_rel_raw: float | None
    p95_rel_raw: float | None
    nonfinite: int
    coverage: float | None  # dpsql only
    theory_median_rel: float | None  # dpsql only
    theory_p95_rel: float | None


@dataclass(frozen=True, slots=True)
class CellRatio(Cell):
    """dpsql's median relative error over a peer's, for one cell at one epsilon."""

    epsilon: float
    peer: str
    dpsql_median_rel: float
    peer_median_rel: float
    ratio: float
    significantly_worse: bool  # dpsql's median CI lies wholly above the peer's


def _relative(values: np.ndarray, truth: float) -> np.ndarray:
    errors = np.abs(values - truth) / abs(truth)
    return np.where(np.isfinite(errors), errors, np.inf)


def _p95(errors: np.ndarray) -> float:
    # An order statistic, not an interpolation: errors may be infinite, and inf - inf is not a number.
    return float(np.quantile(errors, 0.95, method="higher"))


def median_ci(errors: np.ndarray) -> tuple[float, float]:
    """A confidence interval of the median of at least 95%: the order statistics X_(j) and X_(n+1-j) (1-based) with
    the largest j whose exact coverage, P(j <= B < n+1-j) for B ~ Binomial(n, 1/2), is at least 95%. Below 6 values
    no pair of order statistics covers the median that often (3 values: min and max cover 75%): the interval is
    then [0, inf], which no comparison can call significant. (The normal approximation used before gave [min, max]
    for 3 values, and called cells 'significantly worse' against a peer's 3 runs at a 75% level.)"""
    ordered = np.sort(errors)
    n = len(ordered)
    best = None
    for j in range(1, n // 2 + 1):
        if _order_coverage(n, j) < 0.95:
            break
        best = j
    if best is None:
        return 0.0, math.inf
    return float(ordered[best - 1]), float(ordered[n - best])


def _order_coverage(n: int, j: int) -> float:
    """P(X_(j) <= median <= X_(n+1-j)) for n independent draws of a continuous distribution: the number of draws
    below the median, B ~ Binomial(n, 1/2), is at least j and at most n - j."""
    return sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2**n


def cell_stats(observations: Iterable[Observation], truths: Sequence[Truth],
               queries: dict[str, Query]) -> list[CellStat]:
    truth_of = {(t.dataset, t.query, t.aggregate, t.group): t for t in truths}
    buckets: dict[tuple, list[Observation]] = defaultdict(list)
    for o in observations:
        buckets[(o.dataset, o.query, o.aggregate, o.group, o.system, o.epsilon)].append(o)
    stats = []
    for (dataset, query_name, aggregate, group, system, epsilon), rows in buckets.items():
        truth = truth_of.get((dataset, query_name, aggregate, group))
        if truth is None or not truth.bounded:
            continue
        query = queries[query_name]
        values = np.array([o.value for o in rows], dtype=float)
        errors = _relative(values, truth.bounded)
        raw_errors = _relative(values, truth.raw) if truth.raw else None
        coverage = theory_median = theory_p95 = None
        if system == DPSQL:
            low = np.array([o.low for o in rows], dtype=float)
            high = np.array([o.high for o in rows], dtype=float)
            slack = 1e-9 * abs(truth.bounded)  # the float rounding of a clamped interval end
            coverage = float(np.mean((low - slack <= truth.bounded) & (truth.bounded <= high + slack)))
            std = float(np.median([o.std for o in rows]))
            theory_median = LAPLACE_MEDIAN_PER_STD * std / abs(truth.bounded)
            theory_p95 = LAPLACE_P95_PER_STD * std / abs(truth.bounded)
        ci_low, ci_high = median_ci(errors)
        stats.append(CellStat(
            dataset, query_name, aggregate, rows[0].kind, group, size_class(truth.fraction), query.grouped,
            query.basic, truth.fraction, system, epsilon, len(rows), truth.bounded, truth.raw,
            float(np.median(errors)), _p95(errors), ci_low, ci_high,
            float(np.median(raw_errors)) if raw_errors is not None else None,
            _p95(raw_errors) if raw_errors is not None else None,
            int(np.sum(~np.isfinite(values))), coverage, theory_median, theory_p95))
    return stats


def ratios(stats: Sequence[CellStat]) -> list[CellRatio]:
    """dpsql against each peer, cell by cell, at equal epsilon."""
    mine = {(s.dataset, s.query, s.aggregate, s.group, s.epsilon): s for s in stats if s.system == DPSQL}
    out = []
    for s in stats:
        if s.system == DPSQL:
            continue
        d = mine.get((s.dataset, s.query, s.aggregate, s.group, s.epsilon))
        if d is None:
            continue
        ratio = _ratio(d.median_rel, s.median_rel)
        out.append(CellRatio(s.dataset, s.query, s.aggregate, s.kind, s.group, s.size, s.grouped, s.basic,
                             s.epsilon, s.system, d.median_rel, s.median_rel, ratio,
                             d.median_rel_ci_low > s.median_rel_ci_high))
    return out


def _ratio(mine: float, theirs: float) -> float:
    """A ratio of median errors; two exact medians (discrete noise that is mostly 0 at large ε) tie."""
    if theirs > 0:
        return mine / theirs
    return 1.0 if mine == 0 else math.inf


def best_peer_ratios(cell_ratios: Sequence[CellRatio]) -> list[CellRatio]:
    """Per cell and epsilon, the ratio to the most accurate peer on that cell."""
    best: dict[tuple, CellRatio] = {}
    for r in cell_ratios:
        key = (r.dataset, r.query, r.aggregate, r.group, r.epsilon)
        if key not in best or r.peer_median_rel < best[key].peer_median_rel:
            best[key] = r
    return list(best.values())


def geometric_mean(values: Sequence[float]) -> float:
    finite = [v for v in values if 0 < v < math.inf]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


THEORY = "theory"  # dpsql's theoretical median error, as a pseudo-system in curves


def common_medians(stats: Sequence[CellStat], dataset: str, kind: str, epsilon: float) -> tuple[dict[str, float], int]:
    """Per system, the median over cells of each cell's median relative error, over the cells that every system
    answering this kind here answered (peers skip kinds and refuse some points): like is compared with like.
    Also dpsql's theoretical median ("theory"). Returns the medians and the number of common cells."""
    chosen = [c for c in stats if (c.dataset, c.kind, c.epsilon) == (dataset, kind, epsilon)]
    by_system: dict[str, dict[tuple, CellStat]] = defaultdict(dict)
    for c in chosen:
        by_system[c.system][(c.query, c.aggregate, c.group)] = c
    if not by_system:
        return {}, 0
    common = set.intersection(*(set(cells) for cells in by_system.values()))
    if not common:
        return {}, 0
    medians = {system: float(np.median([cells[k].median_rel for k in common])) for system, cells in by_system.items()}
    if DPSQL in by_system:
        medians[THEORY] = float(np.median([by_system[DPSQL][k].theory_median_rel for k in common]))
    return medians, len(common)

"""An empirical differential privacy audit: a statistical lower bound on epsilon from neighbouring datasets.

For each mechanism and aggregate kind, a query runs on a dataset D and on D' = D plus one privacy unit chosen
as a worst case (more rows than the contribution bound allows, values far beyond the clamp bounds). The output
is released many times on each; an event S ("the released value is at least t", "group g is absent", ...) is
chosen on one half of the draws, and on the other half P[M(D') in S] and P[M(D) in S] get one-sided
Clopper-Pearson bounds. If lo(P[M(A) in S]) > e^eps hi(P[M(B) in S]) + delta the mechanism is not
(eps, delta)-DP, so ln((lo - delta) / hi) is a lower bound on its epsilon with 95% confidence. It must not
exceed the claim; a mechanism whose noise is halved must be caught.

Claims: a Laplace query at epsilon e is (e, delta_q)-DP, delta_q being the partition-selection delta it is
charged (0 without selection). A Gaussian query under zCDP accounting is rho = e^2/2 zCDP, audited as the
(eps(rho, delta - delta_q), delta)-DP it implies at delta = GAUSSIAN_DELTA (stats.zcdp_epsilon).

The bounded SQL runs once per dataset and dpsql's release is drawn many times (sampling.py); `end_to_end`
checks on fewer draws that `PrivateSession.execute` releases the same distribution.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.attacks.audit_events import Witness, audit_draws
from benchmarks.attacks.baseline import PlainDuckDB
from benchmarks.attacks.sampling import Measured, Release, measure, sample_releases
from benchmarks.attacks.script import options, scratch
from benchmarks.attacks.stats import same_distribution_pvalue, zcdp_epsilon
from benchmarks.support import DEFAULT_BUDGET, GAUSSIAN, Budget, Table, column, open_session, seeded, write_dataset
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.planning.measurements import Measurement, MeasurementKind
from dpsql.planning.plan import QueryPlan

EPSILON = 1.0  # of every audited query
GAUSSIAN_DELTA = 0.01
MAX_ROWS = 3
LOWER, UPPER = -20.0, 10.0
TABLE = Table("audit", "uid", (column("uid", "int"), column("g", "text"), column("x", "float", LOWER, UPPER)),
              MAX_ROWS)
MECHANISMS = {"laplace": DEFAULT_BUDGET, "gaussian": GAUSSIAN}


def _population(units: int, rows: int, seed: int, spread: bool) -> list[tuple[Any, ...]]:
    chooser = random.Random(seed)
    return [(uid, "a", chooser.uniform(LOWER, UPPER) if spread else -5.0)
            for uid in range(1, units + 1) for _ in range(rows)]


LARGE = _population(60, MAX_ROWS, 1, spread=True)  # group "a" passes partition selection almost always
SMALL = _population(4, 2, 2, spread=False)  # few rows, all at -5: one unit moves AVG and VAR a lot


def _unit(rows: int, x: float | None, groups: Sequence[str] = ("a",)) -> list[tuple[Any, ...]]:
    """The added unit: more rows than the bound keeps, each value far outside the clamp bounds."""
    return [(0, groups[i % len(groups)], x) for i in range(rows)]


@dataclass(frozen=True)
class Case:
    kind: str
    sql: str
    base: list[tuple[Any, ...]]
    extra: list[tuple[Any, ...]]
    keys: tuple[tuple[Any, ...], ...] = ((),)  # the groups whose values (or absence) are the features
    # Further features, each the difference of two features (i, j): post-processing of the release, so the claim
    # holds for them too; an event on one output alone misses a leak in a combination (COUNT(*) - COUNT(x)).
    differences: tuple[tuple[int, int], ...] = ()

    def features(self, runs: list[Release], aggregates: int) -> np.ndarray:
        """One row per release: each key's aggregate values in order, NaN where the group was not released, then
        the differences."""
        absent = np.full(aggregates, np.nan)
        values = np.array([np.concatenate([run.get(key, absent) for key in self.keys]) for run in runs], dtype=float)
        if not self.differences:
            return values
        return np.column_stack([values, *[values[:, i] - values[:, j] for i, j in self.differences]])


CASES = (
    Case("COUNT(*)", "SELECT COUNT(*) FROM audit", LARGE, _unit(10, 1e9)),
    Case("COUNT(DISTINCT unit)", "SELECT COUNT(DISTINCT uid) FROM audit", LARGE, _unit(10, 1e9)),
    Case("SUM", "SELECT SUM(x) FROM audit", LARGE, _unit(10, -1e9)),
    Case("AVG", "SELECT AVG(x) FROM audit", SMALL, _unit(10, -1e9)),
    Case("VAR/STDDEV", "SELECT VARIANCE(x), STDDEV(x) FROM audit", SMALL, _unit(10, 1e9)),
    # COUNT, SUM and AVG from one pair of complementary sums (x - lo, hi - x) sharing one share (measurements.Pair)
    Case("COUNT, SUM, AVG (a pair)", "SELECT COUNT(*), SUM(x), AVG(x) FROM audit", SMALL, _unit(10, 1e9)),
    # The pair's NULL rows (hi - lo each) share its share: a unit of NULL rows moves COUNT(*) - COUNT(x) alone.
    Case("COUNT(*) - COUNT(x) (a pair, NULL rows)", "SELECT COUNT(*), COUNT(x), AVG(x) FROM audit", SMALL,
         _unit(10, None), differences=((0, 1),)),
    Case("GROUP BY, partition selection", "SELECT g, COUNT(*) FROM audit GROUP BY g", LARGE,
         _unit(MAX_ROWS, 1e9, ("a", "a", "z")), keys=(("a",), ("z",))),  # 2 rows in "a", 1 in a new group
)
MORE_CASES = (  # other worst cases, for the script
    Case("SUM, upper clamp", "SELECT SUM(x) FROM audit", LARGE, _unit(10, 1e9)),
    Case("AVG, upper clamp", "SELECT AVG(x) FROM audit", SMALL, _unit(10, 1e9)),
    Case("GROUP BY, all rows in one group", "SELECT g, COUNT(*) FROM audit GROUP BY g", LARGE, _unit(10, 1e9),
         keys=(("a",), ("z",))),
    Case("GROUP BY, unit alone in 3 groups", "SELECT g, SUM(x) FROM audit GROUP BY g", LARGE,
         _unit(3, 1e9, ("y", "z", "w")), keys=(("a",), ("y",), ("z",), ("w",))),
)


@dataclass(frozen=True)
class Claim:
    epsilon: float
    delta: float


def claim(plan: QueryPlan) -> Claim:
    selection = float(plan.cost.delta)
    if isinstance(plan.measurements[0].mechanism, GaussianMechanism):
        return Claim(zcdp_epsilon(float(plan.cost.rho), GAUSSIAN_DELTA - selection), GAUSSIAN_DELTA)
    return Claim(float(plan.cost.epsilon), selection)


def halve_noise(plan: QueryPlan) -> QueryPlan:
    """A deliberately broken plan: every measurement's noise scale halved, the claimed cost unchanged."""
    def broken(mechanism: LaplaceMechanism | GaussianMechanism) -> LaplaceMechanism | GaussianMechanism:
        if isinstance(mechanism, GaussianMechanism):
            return GaussianMechanism(mechanism.sensitivity, mechanism.rho * 4)
        return LaplaceMechanism(mechanism.sensitivity, mechanism.epsilon * 2)
    return replace(plan, measurements=tuple(replace(m, mechanism=broken(m.mechanism)) for m in plan.measurements))


@dataclass(frozen=True)
class AuditResult:
    case: str
    mechanism: str
    variant: str  # "dpsql", or how the mechanism was broken
    claim: Claim
    witness: Witness
    draws: int  # per dataset

    @property
    def holds(self) -> bool:
        return self.witness.epsilon <= self.claim.epsilon

    def line(self) -> str:
        verdict = "ok" if self.holds else "VIOLATION"
        return (f"  {self.case:34} {self.mechanism:8} {self.variant:22} epsilon >= {self.witness.epsilon:6.3f}  "
                f"claimed {self.claim.epsilon:6.3f} (delta {self.claim.delta:.0e})  {verdict:9} "
                f"[{self.draws} draws per dataset; event {self.witness.event} more likely under "
                f"{self.witness.over}]")


@dataclass(frozen=True)
class Neighbours:
    """A case's two datasets, loaded, with the query's exact measurements on each."""

    case: Case
    mechanism: str
    d: Measured
    d_prime: Measured
    policies: tuple[Path, Path]

    @property
    def plan(self) -> QueryPlan:
        return self.d.plan


def load(folder: Path, case: Case, mechanism: str, seed: int) -> Neighbours:
    budget: Budget = MECHANISMS[mechanism]
    policies = (write_dataset(folder / "d", TABLE, case.base, budget),
                write_dataset(folder / "d_prime", TABLE, case.base + case.extra, budget))
    measured = []
    for policy in policies:
        session = open_session(policy, seed)
        try:
            measured.append(measure(session, case.sql, epsilon=EPSILON))
        finally:
            session.close()
    if measured[0].bounded_sql != measured[1].bounded_sql:
        raise AssertionError("the plan depends on the data")
    return Neighbours(case, mechanism, measured[0], measured[1], policies)


def audit(neighbours: Neighbours, draws: int, seed: int, variant: str = "dpsql",
          plan: QueryPlan | None = None, rows: tuple[list, list] | None = None) -> AuditResult:
    """Audit one case; `plan` and `rows` replace dpsql's own to audit a deliberately broken variant."""
    plan = plan or neighbours.plan
    exact = rows or (neighbours.d.rows, neighbours.d_prime.rows)
    rng = seeded(seed)
    d, d_prime = (neighbours.case.features(sample_releases(plan, r, rng, draws), len(plan.recipes)) for r in exact)
    stated = claim(neighbours.plan)
    return AuditResult(neighbours.case.kind, neighbours.mechanism, variant, stated,
                       audit_draws(d, d_prime, stated.delta), draws)


def uncapped_rows(neighbours: Neighbours) -> tuple[list, list]:
    """COUNT(*) computed without the contribution bound: a rewrite that forgot to cap rows per unit."""
    counts = []
    for policy in neighbours.policies:
        plain = PlainDuckDB(policy)
        try:
            counts.append([(plain.scalar("SELECT COUNT(*) FROM audit"),)])
        finally:
            plain.close()
    return counts[0], counts[1]


def nulls_in_rows(plan: QueryPlan) -> QueryPlan:
    """A deliberately broken pair: its NULL rows' measurement, (COUNT(*) - COUNT(x)) * (hi - lo), calibrated to the
    rows a unit moves instead of rows times hi - lo (the sensitivity of a plain count of NULL rows)."""
    def broken(m: Measurement) -> Measurement:
        if not (m.spec.paired and m.spec.kind is MeasurementKind.NULLS):
            return m
        units, mechanism = 2 * m.spec.value_point.bound, m.mechanism
        if isinstance(mechanism, GaussianMechanism):
            return replace(m, mechanism=GaussianMechanism(-(-mechanism.sensitivity // units), mechanism.rho))
        return replace(m, mechanism=LaplaceMechanism(-(-mechanism.sensitivity // units), mechanism.epsilon))
    return replace(plan, measurements=tuple(broken(m) for m in plan.measurements))


def ignore_threshold(plan: QueryPlan) -> QueryPlan:
    """A deliberately broken partition selection: any group with a noisy count of 1 or more is released."""
    return replace(plan, selection=replace(plan.selection, threshold=1))


BROKEN: dict[str, Callable[[Neighbours], tuple[QueryPlan | None, tuple[list, list] | None]]] = {
    "noise scale halved": lambda n: (halve_noise(n.plan), None),
    "rows per unit uncapped": lambda n: (None, uncapped_rows(n)),
    "selection threshold 1": lambda n: (ignore_threshold(n.plan), None),
    "pair's NULL rows in rows": lambda n: (nulls_in_rows(n.plan), None),
}


def broken_variants(case: Case, plan: QueryPlan) -> list[str]:
    """The ways of breaking dpsql that this case can witness."""
    variants = ["noise scale halved"]
    if case.sql == "SELECT COUNT(*) FROM audit":
        variants.append("rows per unit uncapped")
    if "GROUP BY" in case.sql:
        variants.append("selection threshold 1")
    if any(m.spec.paired and m.spec.kind is MeasurementKind.NULLS for m in plan.measurements):
        variants.append("pair's NULL rows in rows")
    return variants


@dataclass(frozen=True)
class EndToEnd:
    """`executions` answers per dataset through PrivateSession.execute, compared with the batched release."""

    executions: int
    pvalues: tuple[float, float]  # chi-square homogeneity, end to end vs batched, on D and on D'
    witness: Witness
    claim: Claim


def end_to_end(neighbours: Neighbours, executions: int, draws: int, seed: int) -> EndToEnd:
    """For an ungrouped single-aggregate case: the same audit on answers that went through the whole pipeline."""
    answers = []
    for policy in neighbours.policies:
        session = open_session(policy, seed)
        try:
            answers.append(np.array([[session.execute(neighbours.case.sql, epsilon=EPSILON).rows[0][0]]
                                     for _ in range(executions)], dtype=float))
        finally:
            session.close()
    rng = seeded(seed)
    batched = [neighbours.case.features(sample_releases(neighbours.plan, m.rows, rng, draws), 1)
               for m in (neighbours.d, neighbours.d_prime)]
    pvalues = tuple(same_distribution_pvalue(a[:, 0], b[:, 0]) for a, b in zip(answers, batched, strict=True))
    stated = claim(neighbours.plan)
    return EndToEnd(executions, pvalues, audit_draws(answers[0], answers[1], stated.delta), stated)


def main() -> None:
    args = options(__doc__, draws=100000, executions=500, seed=17)  # draws: per dataset; executions: end to end
    print("empirical DP audit: lower bounds on epsilon (95% confidence) against the claim")
    with scratch() as folder:
        e2e = end_to_end(load(folder, CASES[0], "laplace", args.seed), args.executions, args.draws, args.seed)
    print(f"  end to end, {CASES[0].kind}, laplace: {e2e.executions} executions per dataset; chi-square p-values "
          f"against the batched release {e2e.pvalues[0]:.3f} (D), {e2e.pvalues[1]:.3f} (D'); epsilon >= "
          f"{e2e.witness.epsilon:.3f}, claimed {e2e.claim.epsilon:g}")
    for case in CASES + MORE_CASES:
        for mechanism in MECHANISMS:
            with scratch() as folder:
                neighbours = load(folder, case, mechanism, args.seed)
                print(audit(neighbours, args.draws, args.seed).line(), flush=True)
                for name in broken_variants(case, neighbours.plan):
                    plan, rows = BROKEN[name](neighbours)
                    print(audit(neighbours, args.draws, args.seed + 1, name, plan, rows).line(), flush=True)


if __name__ == "__main__":
    main()

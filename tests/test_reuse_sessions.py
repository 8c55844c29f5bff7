"""Answers derived from released measurements, end to end (issue 32): their noise has the law their combination
implies, their intervals cover, and nothing derived ever reads a measurement of other rows, other data, or another
analyst's questions when the policy keeps those private.

The data is tests/test_reuse_identities.py's: units with more rows than the cap, values outside a key's declared
ones and NULLs (the OTHER cells a coarser group sums), NULL and out-of-bounds values. Noise comes from the seeded
test generator; each statistical check's tolerance is a quantile of the statistic's own distribution under the law
it checks (chi-square and binomial tails at 1e-4), not a hand-picked slack.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binom, chisquare

from benchmarks.support import DEFAULT_BUDGET, Budget, create_ledger, seeded, write_dataset, write_policy
from dpsql.dp.mechanisms import LaplaceMechanism
from dpsql.planning.spending import targets_of
from dpsql.rewrite.identity import relation_identity
from dpsql.session import PrivateSession
from dpsql.store.measurements import MeasurementStore
from tests.sizes import cases
from tests.test_reuse_identities import TABLE, _rows

LEVEL = 0.95
TAIL = 1e-4  # each statistical check fails wrongly with at most this probability (its seed is fixed besides)
FINE = "SELECT g, h, COUNT(*) FROM t GROUP BY g, h"  # 3 cells per group of g: h true, false, NULL (OTHER)
COARSE = "SELECT g, COUNT(*) FROM t GROUP BY g"


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return create_ledger(write_dataset(tmp_path_factory.mktemp("sessions"), TABLE, _rows(), Budget(epsilon=1e6)))


def _session(policy: Path, seed: int, analyst: str = "alice", **options: object) -> PrivateSession:
    return PrivateSession(policy, analyst, rng=seeded(seed), bounding_seed=11, **options)


def _fresh(session: PrivateSession) -> None:
    """An empty measurement store, as if the session had just begun."""
    session.measurements = MeasurementStore(None, session.engine.data_version)


def _exact_counts(session: PrivateSession, sql: str) -> dict[object, int]:
    """The exact bounded COUNT(*) of each group of a one-key query (what its noise is added to)."""
    return {row[0]: int(row[1]) for row in session.measure(session.prepare(sql))}


def _laplace_pmf(mechanism: LaplaceMechanism, reach: int) -> np.ndarray:
    """P(Z = z) for z in -reach..reach, the discrete Laplace of the mechanism's scale, written independently of
    dpsql's sampler and of dp/noise_sums.py."""
    support = np.arange(-reach, reach + 1)
    alpha = math.exp(-1 / float(mechanism.scale))
    return (1 - alpha) / (1 + alpha) * alpha ** np.abs(support)


def _sum_pmf(mechanism: LaplaceMechanism, count: int, reach: int) -> np.ndarray:
    """The pmf of the sum of `count` independent draws, on -count*reach..count*reach."""
    one = _laplace_pmf(mechanism, reach)
    total = np.array([1.0])
    for _ in range(count):
        total = np.convolve(total, one)
    return total


def _exact_half_width(pmf: np.ndarray) -> int:
    """The least integer t with P(|E| <= t) >= LEVEL, E on -c..c with pmf `pmf`."""
    centre = len(pmf) // 2
    return next(t for t in range(centre + 1) if pmf[centre - t:centre + t + 1].sum() >= LEVEL)


def _chi_square_pvalue(errors: list[int], pmf: np.ndarray) -> float:
    """Goodness of fit of integer errors to the pmf (centred), over bins of expected count at least 5."""
    centre = len(pmf) // 2
    n = len(errors)
    counts = np.bincount(np.asarray(errors) + centre, minlength=len(pmf))
    observed, expected, pending_o, pending_e = [], [], 0, 0.0
    for o, p in zip(counts, pmf, strict=True):
        pending_o, pending_e = pending_o + o, pending_e + n * p
        if pending_e >= 5:
            observed.append(pending_o)
            expected.append(pending_e)
            pending_o, pending_e = 0, 0.0
    observed[-1] += pending_o
    expected[-1] += pending_e
    expected = list(np.asarray(expected) * n / sum(expected))
    return float(chisquare(observed, expected).pvalue)


def _derived_runs(policy: Path, asked_epsilon: float, sessions: int, seed: int) -> Iterator[tuple]:
    """`sessions` sessions, each from an empty store: FINE at epsilon 2, then COARSE at `asked_epsilon`; yields the
    plan COARSE was answered with (before it ran) and its result."""
    session = _session(policy, seed)
    try:
        for _ in range(sessions):
            _fresh(session)
            session.execute(FINE, epsilon=2.0)
            derived = session.plan_for(COARSE, epsilon=asked_epsilon)
            yield session, derived, session.execute(COARSE, epsilon=asked_epsilon)
    finally:
        session.close()


def test_a_coarser_group_has_the_law_of_the_sum_of_its_cells(policy: Path) -> None:
    """COUNT by g from COUNT by g, h at a lower epsilon than that: free, and each group's noise is the sum of its 3
    cells' independent discrete Laplace noises (h true, false, and NULL: OTHER). The released values follow that
    convolution (chi-square), and the interval's half-width is its exact 95% quantile."""
    errors: list[int] = []
    exact = None
    for session, derived, result in _derived_runs(policy, 0.5, 300, seed=21):
        if exact is None:
            exact = _exact_counts(session, COARSE)
            stored = [s.stored for s in derived.combination.used()]
            assert len(stored) == 1 and stored[0].label == "COUNT(*)", derived.combination.used()
            mechanism = stored[0].mechanism
            pmf = _sum_pmf(mechanism, 3, 60 * int(mechanism.scale) + 20)
            half_width = _exact_half_width(pmf)
        assert result.cost.epsilon == 0 and result.derived_from, result.note
        for (group, value), (_, (low, high)) in zip(result.rows, result.intervals, strict=True):
            errors.append(value - exact[group])
            assert (value - low, high - value) == (half_width, half_width)
    assert _chi_square_pvalue(errors, pmf) > TAIL


@pytest.mark.slow  # about 2.5 s: many releases
def test_old_and_new_measurements_combine_by_inverse_variance(policy: Path) -> None:
    """COUNT by g at the epsilon of COUNT by g, h: the 3-cell sums are noisier than a new measurement would be, so
    a new one is measured (at less than the query's epsilon) and combined with them by their inverse variances. The
    released value is that combination of the stored sums and the new cells (read back from the store); the new
    cells' noises are independent of the old ones and have their mechanism's law (chi-square on the new cells'
    noise against the discrete Laplace); and the half-width is the 95% quantile of the exact law of
    c1 (N1 + N2 + N3) + c2 N4 (computed here from the pmfs), up to a count's interval rounded outward to integers and
    the conservative slack of dp/noise_sums.py (a thousandth of its deviation)."""
    new_errors: list[int] = []
    exact = None
    for session, derived, result in _derived_runs(policy, 2.0, 200, seed=22):
        combination = derived.combination
        sources = combination.used()
        old = next(s for s in sources if s.stored is not None)
        new = next(s for s in sources if s.stored is None)
        if exact is None:
            exact = _exact_counts(session, COARSE)
            v_old = Fraction(3) * Fraction(old.mechanism.variance)
            v_new = Fraction(new.mechanism.variance)
            weights = (v_new / (v_old + v_new), v_old / (v_old + v_new))  # inverse-variance, computed here
            law = _Law(old.mechanism, new.mechanism, weights)
        assert 0 < result.cost.epsilon < 2 and result.derived_from, result.note
        fresh = [m for m in session.measurements.candidates(session.prepare(COARSE).relation, "alice", False)
                 if m.grouping.keys == ("g",)]
        assert len(fresh) == 1
        sums = dict(zip(["a", "b"], old.values, strict=True))
        for (group, value), (_, (low, high)) in zip(result.rows, result.intervals, strict=True):
            estimate = float(weights[0] * sums[group] + weights[1] * fresh[0].cells[(group,)])
            assert abs(value - estimate) <= 0.5, (value, estimate)  # a count is released rounded to an integer
            new_errors.append(fresh[0].cells[(group,)] - exact[group])
            half = (high - low) / 2
            assert law(half + 0.5) <= 1 - LEVEL, "the interval (rounded outward) misses more than 5%"
            assert law(half - 1.5 - 1e-3 * law.std) > 1 - LEVEL, "the interval is wider than the law needs"
    assert _chi_square_pvalue(new_errors, _sum_pmf(new.mechanism, 1, 60 * int(new.mechanism.scale) + 20)) > TAIL


class _Law:
    """P(|w1 S + w2 N| > t), S the sum of 3 discrete Laplace draws of one mechanism, N one of another."""

    def __init__(self, first: LaplaceMechanism, second: LaplaceMechanism, weights: tuple[Fraction, Fraction]) -> None:
        reach = [60 * int(m.scale) + 20 for m in (first, second)]
        s = _sum_pmf(first, 3, reach[0])
        n = _sum_pmf(second, 1, reach[1])
        values = (float(weights[0]) * np.arange(-3 * reach[0], 3 * reach[0] + 1)[:, None]
                  + float(weights[1]) * np.arange(-reach[1], reach[1] + 1)[None, :])
        self.magnitudes = np.abs(values).ravel()
        self.masses = (s[:, None] * n[None, :]).ravel()
        self.std = math.sqrt(float((self.masses * values.ravel() ** 2).sum()))

    def __call__(self, t: float) -> float:
        return float(self.masses[self.magnitudes > t].sum())


def test_derived_intervals_cover_at_95_percent(policy: Path) -> None:
    """Over whole exploration sessions (a fine grouping, its roll-ups, a total, the total again at another epsilon,
    a SUM beside counts already released), every interval of every answer derived in part or in full from released
    measurements holds the exact bounded value at least 95% of the time: the number covered is above the 1e-4
    quantile of Binomial(n, 0.95)."""
    chain = [(FINE, 1.0), (COARSE, 1.0), ("SELECT COUNT(*) FROM t", 0.5), ("SELECT COUNT(*) FROM t", 2.0),
             ("SELECT g, COUNT(*), SUM(y) FROM t GROUP BY g", 1.0), ("SELECT h, COUNT(*) FROM t GROUP BY h", 0.7)]
    session = _session(policy, 23)
    truths = {}
    for sql, _ in chain:
        prepared = session.prepare(sql)
        keys = len(prepared.plan.query.keys)
        truths[sql] = {row[:keys]: row[keys:] for row in _exact_outputs(session, sql, keys)}
    covered = total = 0
    sessions = cases(150, floor=40)
    try:
        for _ in range(sessions):
            _fresh(session)
            for sql, epsilon in chain:
                result = session.execute(sql, epsilon=epsilon)
                if not result.derived_from:
                    continue
                keys = len(session.prepare(sql).plan.query.keys)
                for row, intervals in zip(result.rows, result.intervals, strict=True):
                    for truth, interval in zip(truths[sql][tuple(row[:keys])], intervals[keys:], strict=True):
                        covered += interval[0] <= truth <= interval[1]
                        total += 1
    finally:
        session.close()
    assert total >= sessions * 20 // 3, total  # 1,000 derived intervals in 150 sessions
    assert covered >= binom.ppf(TAIL, total, LEVEL), (covered, total)


def _exact_outputs(session: PrivateSession, sql: str, keys: int) -> list[tuple]:
    """The query's exact bounded outputs per group: its answer with no noise at all."""
    original = LaplaceMechanism.sample
    LaplaceMechanism.sample = lambda self, rng: 0  # type: ignore[method-assign]
    try:
        noiseless = _session(session.policy.path, 0)
        try:
            return list(noiseless.execute(sql, epsilon=1.0).rows)
        finally:
            noiseless.close()
    finally:
        LaplaceMechanism.sample = original  # type: ignore[method-assign]


# Nothing derived reads a measurement of other rows, other data, or another analyst's questions.


def _reusing(policy: Path, seed: int, analyst: str = "alice") -> PrivateSession:
    return _session(policy, seed, analyst, reuse=True)


def test_a_filter_on_a_public_key_is_other_rows(policy: Path) -> None:
    """`WHERE g = 'a'` keeps a unit's first rows among those with g = 'a' (the filtered cap ranks after the filter),
    not the rows of group 'a' of the unfiltered cap: another count (shown here on the exact values), so it is
    measured and charged in full, never summed from the released groups. A filter spelled otherwise (its conjuncts
    in another order, a table alias) is the same rows and is derived."""
    session = _reusing(policy, 31)
    try:
        _fresh(session)
        grouped = _exact_counts(session, COARSE)["a"]
        filtered = session.measure(session.prepare("SELECT COUNT(*) FROM t WHERE g = 'a'"))[0][0]
        assert filtered != grouped, "the data must show the re-ranking"
        session.execute(COARSE, epsilon=2.0)
        for sql in ("SELECT COUNT(*) FROM t WHERE g = 'a'", "SELECT h, COUNT(*) FROM t WHERE g = 'a' GROUP BY h",
                    "SELECT g, COUNT(*) FROM t WHERE y > 2 GROUP BY g"):
            result = session.execute(sql, epsilon=0.5)
            assert (result.cost.epsilon, result.derived_from) == (Fraction(1, 2), ()), (sql, result.note)
        session.execute("SELECT g, COUNT(*) FROM t WHERE y > 2 AND h GROUP BY g", epsilon=2.0)
        result = session.execute("SELECT g, COUNT(*) FROM t AS u WHERE u.h AND u.y > 2 GROUP BY g", epsilon=0.5)
        assert result.cost.epsilon == 0 and result.derived_from, result.note
        result = session.execute("SELECT g, COUNT(*) FROM t WHERE y > 3 AND h GROUP BY g", epsilon=0.5)
        assert result.cost.epsilon == Fraction(1, 2) and not result.derived_from, result.note
    finally:
        session.close()


def test_another_analysts_measurements_are_theirs_unless_shared(tmp_path: Path) -> None:
    """Per analyst by default: bob pays in full for what alice asked, and learns nothing of her questions (his
    answer's sources and note do not mention them). With `[reuse] shared = true` bob's answer derives from hers."""
    folder = tmp_path / "private"
    private = create_ledger(write_dataset(folder, TABLE, _rows()))
    shared_folder = tmp_path / "shared"
    shared = create_ledger(write_dataset(shared_folder, TABLE, _rows()))
    with shared.open("a") as handle:
        handle.write("\n[reuse]\nshared = true\n")
    for path, free in ((private, False), (shared, True)):
        alice, bob = _reusing(path, 41), _reusing(path, 42, "bob")
        try:
            assert alice.measurements.path == bob.measurements.path and alice.measurements.path is not None
            alice.execute(FINE, epsilon=2.0)
            result = bob.execute(COARSE, epsilon=0.5)
            assert (result.cost.epsilon == 0) == free and bool(result.derived_from) == free, (path, result.note)
        finally:
            alice.close()
            bob.close()


def test_data_prepared_again_invalidates_the_store(tmp_path: Path) -> None:
    """With a prepared store, released measurements outlive the session: a later session of the same data derives
    from them. Once one row of the data changes and the store is prepared again, every measurement of the old data
    is deleted when the measurement store is opened, and the query is measured and charged in full."""
    folder = tmp_path / "prepared"
    policy = create_ledger(write_dataset(folder, TABLE, _rows()))
    with policy.open("a") as handle:
        handle.write("\n[engine]\nstore = true\n")

    def ask(seed: int) -> tuple[PrivateSession, object]:
        session = PrivateSession(policy, "alice", rng=seeded(seed), reuse=True)  # the store's own secret salt
        return session, session.execute(COARSE, epsilon=0.5)

    first = PrivateSession(policy, "alice", rng=seeded(50), reuse=True)
    try:
        assert first.engine.ranking_persistent and first.measurements.path is not None
        first.execute(FINE, epsilon=2.0)
        stored = first.measurements.path
    finally:
        first.close()
    session, result = ask(51)
    session.close()
    assert result.cost.epsilon == 0 and result.derived_from, "a later session of the same data reuses"
    write_dataset(folder, TABLE, [*_rows(), (999, "a", True, 5.0, 1)])  # one unit more: the neighbouring data
    with policy.open("a") as handle:
        handle.write("\n[engine]\nstore = true\n")
    session, result = ask(52)
    try:
        assert session.engine.store_built, "the data was prepared again"
        with sqlite3.connect(stored) as con:
            versions = {row[0] for row in con.execute("SELECT DISTINCT data_version FROM measurements")}
        assert versions == {session.engine.data_version}, "measurements of the old data were kept"
        assert result.cost.epsilon == Fraction(1, 2) and not result.derived_from, result.note
    finally:
        session.close()


@pytest.mark.parametrize(("edit", "sql"), [({"max_rows": 2}, COARSE),
                                           ({"bound": (0, 20)}, "SELECT g, SUM(x) FROM t GROUP BY g")])
def test_another_contribution_bound_or_value_bound_is_never_reused(tmp_path: Path, edit: dict, sql: str) -> None:
    """The steward edits the policy: another cap on a unit's rows, or other clamping bounds. The policy's text is
    part of the data version, so the store forgets what it measured before (and the query is charged in full); and
    even apart from that, the capped rows are other rows (another relation) or the sum another quantity (another
    functional), so no version check is the only guard."""
    folder = tmp_path / "edited"
    policy = create_ledger(write_dataset(folder, TABLE, _rows()))
    before = _reusing(policy, 61)
    try:
        before.execute(sql, epsilon=2.0)
        old = before.prepare(sql).plan
    finally:
        before.close()
    table = TABLE.declaration()
    if "max_rows" in edit:
        table["max_rows_per_unit"] = edit["max_rows"]
    else:
        table["columns"]["x"] = {**table["columns"]["x"], "lower": edit["bound"][0], "upper": edit["bound"][1]}
    write_policy(folder / "policy.toml", {"t": table}, DEFAULT_BUDGET.keys())
    after = _reusing(policy, 62)
    try:
        new = after.prepare(sql).plan
        if "max_rows" in edit:
            assert relation_identity(new) != relation_identity(old)
        else:
            assert not set(targets_of(new)) & set(targets_of(old))
        result = after.execute(sql, epsilon=0.5)
        assert result.cost.epsilon == Fraction(1, 2) and not result.derived_from, result.note
        with sqlite3.connect(after.measurements.path) as con:
            versions = {row[0] for row in con.execute("SELECT DISTINCT data_version FROM measurements")}
        assert versions == {after.engine.data_version}
    finally:
        after.close()

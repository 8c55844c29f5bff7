"""A neighbouring-dataset audit of whole exploration sessions with reuse (issue 32): what a session releases costs
no more than it was charged.

D is tests/test_reuse_identities.py's data; D' adds one worst-case unit (more rows than the cap, in declared and
undeclared groups and NULLs, values beyond the clamp bounds). The same session of queries (drill-down, roll-up, a
total after its parts, a repeat at another epsilon, a filtered chain, an accuracy target) runs on each with its noise
set to zero, so that every released noisy cell is its exact value, and the decisions (what is derived, what is
measured now and at what epsilon) are those of the real session: they read the laws of the released noise, never
its values.

Everything the session releases is a function of the noisy cells it drew, and each drawn cell is kept in the
measurement store (checked: the draws and the stored cells are as many). So the privacy loss of the whole session
is that of the stored vectors, which is exact for independent discrete noise: a discrete Laplace vector of scale b
whose cells move by d_i between D and D' has a worst-case log-likelihood ratio of sum |d_i| / b, reached; a discrete
Gaussian one of variance s^2 is (sum d_i^2 / (2 s^2))-zCDP (CKS 2020). That loss is checked against the charge of
the ledger entry that paid for each vector, entry by entry (sequential composition: a charge covers what it paid
for), not only in total.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction
from pathlib import Path

import pytest

from benchmarks.support import GAUSSIAN, Budget, create_ledger, seeded, write_dataset, write_policy
from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.planning.reuse import StoredMeasurement
from dpsql.session import PrivateSession
from dpsql.store.measurements import MeasurementStore
from tests.test_reuse_identities import TABLE, _rows

# The neighbour: 9 rows (the cap keeps 3 of them), in every kind of cell, values beyond x's [0, 10] and y's [0, 5].
NEIGHBOUR = [(1000, g, h, x, 7) for g, h, x in [("a", True, 50.0), ("b", None, -40.0), ("c", False, 12.5),
                                                  (None, True, None), ("a", None, 11.0), ("b", False, -3.0),
                                                  ("c", True, 99.0), (None, None, 10.0), ("a", False, None)]]
SESSION = [  # (sql, epsilon or None, accuracy or None)
    ("SELECT g, h, COUNT(*), SUM(x) FROM t GROUP BY g, h", 1.0, None),
    ("SELECT g, COUNT(*) FROM t GROUP BY g", 0.4, None),  # a roll-up: free
    ("SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g", 1.0, None),  # as accurate as on its own: a reduced charge
    ("SELECT COUNT(*), AVG(x) FROM t", 1.0, None),  # the total after its parts
    ("SELECT h, SUM(y), COUNT(y) FROM t GROUP BY h", 0.8, None),
    ("SELECT SUM(y) FROM t", 0.3, None),
    ("SELECT COUNT(*) FROM t", None, 4.0),  # an accuracy target
    ("SELECT g, COUNT(*) FROM t WHERE y > 2 GROUP BY g", 1.0, None),
    ("SELECT COUNT(*) FROM t WHERE y > 2", 0.5, None),
    ("SELECT g, h, COUNT(*), SUM(x) FROM t GROUP BY g, h", 1.0, None),  # a repeat: reduced
]
BUDGETS = {"laplace": Budget(epsilon=1e6), "gaussian": Budget(epsilon=1e6, accounting="zcdp", mechanism="gaussian")}
assert GAUSSIAN.mechanism == BUDGETS["gaussian"].mechanism


def _run(folder: Path, rows: list[tuple], budget: Budget, monkeypatch: pytest.MonkeyPatch,
         questions: list[tuple] = SESSION, **table: object) -> tuple:
    """The session's `questions` on `rows` with zero noise (`table`: more keys of the table's declaration): its
    stored measurements (in order), each ledger entry's cost, and how many noise draws it made."""
    draws = Counter()

    def silent(self, rng) -> int:
        draws["cells"] += bool(self.sensitivity)
        return 0

    monkeypatch.setattr(LaplaceMechanism, "sample", silent)
    monkeypatch.setattr(GaussianMechanism, "sample", silent)
    write_dataset(folder, TABLE, rows, budget)
    policy = create_ledger(write_policy(folder / "policy.toml", {"t": {**TABLE.declaration(), **table}},
                                        budget.keys()))
    store = MeasurementStore(None, "audit")
    session = PrivateSession(policy, "alice", rng=seeded(0), bounding_seed=11, measurements=store)
    costs: dict[int, Fraction] = {}
    relations = []
    try:
        for sql, epsilon, accuracy in questions:
            result = session.execute(sql, epsilon=epsilon, accuracy=accuracy)
            if result.cost.epsilon:
                costs[result.charge] = result.cost.epsilon
            relations.append(session.prepare(sql, epsilon=epsilon, accuracy=accuracy).relation)
        stored = {m.id: m for relation in dict.fromkeys(relations) for m in store.candidates(relation, "alice", False)}
    finally:
        session.close()
        monkeypatch.undo()
    return [stored[i] for i in sorted(stored)], costs, draws["cells"]


def _loss(before: StoredMeasurement, after: StoredMeasurement, zcdp: bool) -> Fraction:
    """The exact worst-case privacy loss of releasing this vector on D or D' (epsilon, or rho under zCDP)."""
    assert before.cells.keys() == after.cells.keys()
    moves = [after.cells[cell] - before.cells[cell] for cell in before.cells]
    mechanism = before.mechanism
    if zcdp:
        assert isinstance(mechanism, GaussianMechanism)
        return Fraction(sum(d * d for d in moves)) / (2 * mechanism.sigma2)
    assert isinstance(mechanism, LaplaceMechanism)
    return Fraction(sum(abs(d) for d in moves)) / mechanism.scale


@pytest.mark.parametrize("kind", list(BUDGETS))
def test_a_whole_session_costs_no_more_than_it_was_charged(tmp_path: Path, kind: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    free, loss = _audit(tmp_path, BUDGETS[kind], NEIGHBOUR, SESSION, monkeypatch)
    assert free >= 1 and loss > 0, "the session must derive some answers, and the neighbour move some cells"


def test_per_group_bounds_keep_the_cells_outside_the_declared_values_unreleased(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With per-group bounds (k = 2 groups of r = 1 row) Gaussian noise is calibrated to the L2 of one row in each
    of two groups, sqrt(2). A unit whose two groups are both outside the declared values would put both rows into
    one cell of values outside them (L2 2, twice the squared sensitivity paid for): such cells are never measured
    with per-group bounds (planning/reuse.grouping_of), and the audit shows the session within its charges."""
    neighbour = [(1000, g, True, 1.0, 1) for g in ("c", "c", None, None)]
    questions = [("SELECT g, COUNT(*) FROM t GROUP BY g", 1.0, None), ("SELECT g, COUNT(*) FROM t GROUP BY g", 0.5,
                                                                        None)]
    _audit(tmp_path, BUDGETS["gaussian"], neighbour, questions, monkeypatch, max_groups_per_unit=2,
           max_rows_per_group=1)


def _audit(tmp_path: Path, budget: Budget, neighbour: list[tuple], questions: list[tuple],
           monkeypatch: pytest.MonkeyPatch, **table: object) -> tuple[int, Fraction]:
    """Run the questions on D and D' (D plus `neighbour`), check every ledger entry covers the exact loss of what it
    paid for; how many answers were free, and the whole session's loss."""
    zcdp = budget.accounting == "zcdp"
    stored, costs, draws = _run(tmp_path / "d", _rows(), budget, monkeypatch, questions, **table)
    stored_n, costs_n, draws_n = _run(tmp_path / "d_prime", [*_rows(), *neighbour], budget, monkeypatch, questions,
                                      **table)
    # The same decisions in both worlds (they never read the data), and nothing drawn that was not kept.
    assert [(m.label, m.functional, m.grouping, m.mechanism, m.charge) for m in stored] == \
        [(m.label, m.functional, m.grouping, m.mechanism, m.charge) for m in stored_n]
    assert costs == costs_n and draws == draws_n
    assert draws == sum(len(m.cells) for m in stored), "a noise draw that no stored measurement accounts for"
    losses: dict[int, Fraction] = defaultdict(Fraction)
    for before, after in zip(stored, stored_n, strict=True):
        losses[before.charge] += _loss(before, after, zcdp)
    assert set(losses) <= set(costs)
    for charge, loss in losses.items():
        allowed = costs[charge] ** 2 / 2 if zcdp else costs[charge]
        assert float(loss) <= float(allowed) * (1 + 1e-9), (charge, float(loss), float(allowed))
    total = sum(losses.values(), Fraction(0))
    charged = sum((c ** 2 / 2 if zcdp else c for c in costs.values()), Fraction(0))
    assert total <= charged
    return len(questions) - len(costs), total

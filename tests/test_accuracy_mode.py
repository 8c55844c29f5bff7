"""Ask for accuracy, not epsilon (planning/accuracy.py): the epsilon charged is the smallest on the grid whose plan
gives every released noisy cell a 95% interval within +/- the accuracy, decided from the plan alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import dpsql
from benchmarks.support import seeded, write_policy
from dpsql.errors import DataError, ProgrammingError, QueryRejected
from dpsql.frontends.cli import main
from dpsql.planning.accuracy import grid_epsilon, widest_half_width
from dpsql.session import PrivateSession
from tests.conftest import create_ledger

QUERIES = (
    ("SELECT COUNT(*) FROM pums", 10),
    ("SELECT sex, COUNT(*), SUM(income) FROM pums GROUP BY sex", 2_000_000),
    ("SELECT educ, COUNT(DISTINCT age), COUNT(DISTINCT pid) FROM pums GROUP BY educ", 3.5),
    ("SELECT SUM(age) FROM pums WHERE married = 1", 300),
    ("SELECT COUNT(income) FROM pums", 1),
)


def _grid_index(epsilon) -> int:
    low, high = 0, 900 * 20
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if grid_epsilon(middle) <= epsilon else (low, middle)
    assert grid_epsilon(low) == epsilon, "the epsilon chosen is a grid value"
    return low


@pytest.mark.parametrize(("sql", "accuracy"), QUERIES)
def test_the_smallest_grid_epsilon_meets_the_accuracy_and_one_step_less_does_not(pums_session, sql: str,
                                                                                 accuracy: float) -> None:
    chosen = pums_session.prepare(sql, accuracy=accuracy).plan
    assert widest_half_width(chosen) <= accuracy
    smaller = pums_session.prepare(sql, epsilon=float(grid_epsilon(_grid_index(chosen.cost.epsilon) - 1))).plan
    assert widest_half_width(smaller) > accuracy


@pytest.mark.parametrize(("sql", "accuracy"), QUERIES)
def test_the_released_intervals_are_within_the_accuracy(pums_session, sql: str, accuracy: float) -> None:
    result = pums_session.execute(sql, accuracy=accuracy)
    widths = [(high - low) / 2 for row in result.intervals for cell in row if cell is not None
              for low, high in [cell]]
    assert widths and max(widths) <= accuracy + 1e-9 * accuracy


@pytest.mark.parametrize("accounting", [{"accounting": "zcdp"}, {"accounting": "zcdp", "mechanism": "gaussian"}])
def test_zcdp_and_gaussian_budgets_are_sized_too(tmp_path: Path, accounting: dict) -> None:
    (tmp_path / "t.csv").write_text("pid,x\n1,2.5\n2,3\n")
    policy = create_ledger(write_policy(tmp_path / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
        "columns": {"pid": {"type": "int"}, "x": {"type": "float", "lower": 0, "upper": 10}}}},
        {"epsilon": 10, "delta": 1e-6, **accounting}))
    session = PrivateSession(policy, "tester", rng=seeded(1))
    try:
        chosen = session.prepare("SELECT COUNT(*), SUM(x) FROM t", accuracy=60).plan
        assert widest_half_width(chosen) <= 60
        index = _grid_index(chosen.cost.epsilon)
        assert widest_half_width(session.prepare("SELECT COUNT(*), SUM(x) FROM t",
                                                 epsilon=float(grid_epsilon(index - 1))).plan) > 60
    finally:
        session.close()


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT MEDIAN(income) FROM pums", "follows the rows around its value"),
    ("SELECT COUNT(*) * 2 FROM pums", "sizes the aggregates themselves"),
])
def test_outputs_whose_width_depends_on_the_data_are_refused(pums_session, sql: str, message: str) -> None:
    before = pums_session.spending().epsilon_spent
    with pytest.raises(QueryRejected, match=message):
        pums_session.execute(sql, accuracy=100)
    assert pums_session.spending().epsilon_spent == before


@pytest.mark.parametrize("accuracy", [0, -1, float("nan"), float("inf"), True, "ten", "-3", "n=", "n=1,=2",
                                      {"n": 0}])
def test_a_bad_accuracy_is_a_clear_error(pums_session, accuracy) -> None:
    with pytest.raises(DataError, match="accuracy"):
        pums_session.prepare("SELECT COUNT(*) AS n FROM pums", accuracy=accuracy)


def test_an_accuracy_beyond_the_budget_and_both_knobs_are_refused(pums_session) -> None:
    with pytest.raises(ProgrammingError, match="needs more than epsilon"):
        pums_session.prepare("SELECT SUM(income) FROM pums", accuracy=1)
    with pytest.raises(ProgrammingError, match="not both"):
        pums_session.prepare("SELECT COUNT(*) FROM pums", epsilon=1, accuracy=10)


def test_the_db_api_and_the_command_line_take_an_accuracy(pums_policy: Path) -> None:
    with dpsql.connect(pums_policy, "tester") as con:
        explained = con.explain("SELECT COUNT(*) FROM pums", accuracy=10)
        cursor = con.cursor().execute("SELECT COUNT(*) FROM pums", accuracy=10)
        low, high = cursor.intervals[0][0]
        assert (high - low) / 2 <= 10
        charged = f"Cost: epsilon {float(cursor.cost.epsilon):g},"
        assert charged in explained
        # Asked again, the count already released is as accurate: derived from it, at no charge
        assert "Cost: epsilon 0, delta 0 (derived from released measurements, no charge)" in con.explain(
            "SELECT COUNT(*) FROM pums", accuracy=10)
    runner = CliRunner()
    out = runner.invoke(main, ["explain", "SELECT COUNT(*) FROM pums", "--policy", str(pums_policy),
                               "--accuracy", "10"])
    assert out.exit_code == 0 and charged in out.output
    out = runner.invoke(main, ["query", "SELECT COUNT(*) FROM pums", "--policy", str(pums_policy),
                               "--accuracy", "10", "--ci", "--analyst", "tester"])
    assert out.exit_code == 0, out.output

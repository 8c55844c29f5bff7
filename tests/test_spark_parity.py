"""The Spark engine against the DuckDB engine on generated queries and adversarial rows (issue 34): the same seeds
give the same release, or both refuse, or Spark refuses before any charge saying why. benchmarks/spark_parity.py
holds the data, the adversarial rows and expressions and the comparison; `python -m benchmarks.spark_parity` runs
more queries (benchmarks/results/spark_parity.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from benchmarks.spark_parity import Parity, Summary, generated, parity
from dpsql.engines import spark_sql

pytestmark = pytest.mark.slow  # a JVM, and each query on both engines

QUERIES, SEED = 40, 34


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory):
    with parity(tmp_path_factory.mktemp("parity"), SEED) as checker:
        yield checker


def test_generated_queries_release_identically_or_are_refused_on_spark_before_the_charge(checker: Parity) -> None:
    summary = generated(checker, QUERIES, SEED)
    assert not summary.different, "\n".join(summary.lines())
    assert summary.shapes["adversarial"] > 0
    # Most are answered: a comparison of refusals would prove little.
    assert summary.identical > QUERIES // 2, "\n".join(summary.lines())


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM visits WHERE 1 / score > 5",
    "SELECT cost % score IS NULL AS k, COUNT(*) FROM visits GROUP BY k"])
def test_the_comparison_sees_spark_s_own_division_by_zero(checker: Parity, monkeypatch: pytest.MonkeyPatch,
                                                           sql: str) -> None:
    """The comparison can fail: with Spark's `/` and `%` as they were (NULL for a zero divisor, issue 34), a
    division by a score of 0 or -0.0 releases another count."""
    monkeypatch.setattr(spark_sql, "_by_zero", lambda node, by_zero: node)
    monkeypatch.setattr(checker, "summary", Summary())
    engine = checker.spark.engine
    engine._translated.clear()  # translated afresh, without DuckDB's meaning of a zero divisor
    try:
        checker.compare(sql, "adversarial", SEED)
        assert len(checker.summary.different) == 1, "\n".join(checker.summary.lines())
    finally:
        engine._translated.clear()

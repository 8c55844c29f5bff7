"""A grouped answer with no rows is charged; every front end says why, with the threshold and what to change.

The command line says it on stderr (tests/test_cli.py), the DB-API with a `NoRowsReleased` warning (warnings.warn
and Cursor.messages), the server with a NOTICE. The reason is read from the plan and the released answer only:
the same whether the data has groups below the threshold or no group at all.
"""

from __future__ import annotations

import re
import warnings
from fractions import Fraction
from pathlib import Path

import psycopg
import pytest

import dpsql
from benchmarks.support import seeded, start_server
from tests.server.conftest import dsn, sample_policy

# visit_date has no declared values: its groups go through partition selection. At epsilon 0.1 the threshold is
# far above any day's visits in the sample (a few dozen at most), so no group is released.
BY_DAY = "SELECT visit_date, COUNT(*) FROM visits WHERE age > ? GROUP BY visit_date"


def _reason(threshold: int) -> str:
    return (f"no rows: every group of visit_date has a noisy row count below the partition-selection threshold "
            f"{threshold}, so none was released. Declare the public values of the keys in the policy (values = "
            "[...]) to release every group, or spend more epsilon to lower the threshold.")


def test_the_dbapi_warns_and_lists_the_reason(visits_policy: Path) -> None:
    with dpsql.connect(visits_policy, "dbapi", epsilon=0.1, rng=seeded(8)) as con:
        cur = con.cursor()
        with pytest.warns(dpsql.NoRowsReleased) as caught:
            cur.execute(BY_DAY, (30,))
        threshold = cur.result.plan.selection.threshold
        assert cur.fetchall() == [] and [str(w.message) for w in caught] == [_reason(threshold)]
        assert [(kind, str(value)) for kind, value in cur.messages] == [(dpsql.NoRowsReleased, _reason(threshold))]
        assert con.budget().queries == 1  # charged: it ran on the data
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cur.execute("SELECT region, COUNT(*) FROM visits GROUP BY region")  # rows: nothing to say
        assert cur.messages == [] and len(cur.fetchall()) == 5


def test_no_group_at_all_and_groups_below_the_threshold_read_the_same(visits_policy: Path) -> None:
    """Some visits are over 30 on most days; nobody is over 200. The two empty answers say the same."""
    with dpsql.connect(visits_policy, "dbapi", epsilon=0.1, rng=seeded(9)) as con:
        cur = con.cursor()
        said = []
        for age in (30, 200):
            with pytest.warns(dpsql.NoRowsReleased):
                cur.execute(BY_DAY, (age,))
            said.append([str(value) for _, value in cur.messages])
    assert said[0] == said[1] and len(said[0]) == 1


def test_a_warning_turned_error_keeps_the_paid_answer(visits_policy: Path) -> None:
    with dpsql.connect(visits_policy, "dbapi", epsilon=0.1, rng=seeded(10)) as con:
        cur = con.cursor()
        with warnings.catch_warnings():
            warnings.simplefilter("error", dpsql.NoRowsReleased)
            with pytest.raises(dpsql.NoRowsReleased):
                cur.execute(BY_DAY, (30,))
        assert cur.fetchall() == [] and cur.cost.epsilon == Fraction(1, 10) and len(cur.messages) == 1


def test_the_server_sends_a_notice(tmp_path: Path) -> None:
    running = start_server(sample_policy(tmp_path))
    try:
        notices: list[str] = []
        with psycopg.connect(dsn(running), autocommit=True) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
            conn.execute("SET dpsql.epsilon = 0.1")
            rows = conn.execute(BY_DAY.replace("?", "%s"), (30,)).fetchall()
            explained = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {BY_DAY.replace('?', '30')}").fetchall())
    finally:
        running.stop()
    threshold = int(re.search(r"noisy row count is at least (\d+)", explained).group(1))
    assert rows == [] and len(notices) == 2 and notices[0].startswith("dpsql: this query cost epsilon 0.1")
    assert notices[1] == f"dpsql: {_reason(threshold)}"

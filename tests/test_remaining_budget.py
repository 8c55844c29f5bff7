"""What an analyst is told is left: the smaller of their own share's rest and the whole budget's, in every front end.

The issue's case: a total of 50, alice's share 20. Alice has spent 3.5 (16.5 of her share left) and bob 31, so
34.5 of the total is spent and 15.5 is left: alice can spend 15.5, and every front end must say 15.5.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import psycopg
import pytest

import dpsql
from benchmarks.support import start_server
from dpsql.planning.plan import Cost
from tests.server.conftest import dsn, ledger_of, sample_policy
from tests.test_cli import run

LEFT = 15.5


@pytest.fixture
def spent(tmp_path: Path) -> Path:
    """The sample policy (with users) where alice's share is 20 and bob has spent most of the total."""
    policy = sample_policy(tmp_path)
    policy.write_text(policy.read_text() + "\n[budget.analysts.alice]\nepsilon = 20\n")
    with ledger_of(policy) as ledger:
        ledger.charge("alice", Cost(Fraction(7, 2), Fraction(0)), "SELECT 1")
        ledger.charge("bob", Cost(Fraction(31), Fraction(0)), "SELECT 2")
        alice = ledger.spending("alice")
        assert (alice.epsilon_total - alice.epsilon_spent, ledger.spending().epsilon_remaining) == (16.5, LEFT)
    return policy


def test_the_ledger_caps_an_analysts_rest_by_the_totals(spent: Path) -> None:
    with ledger_of(spent) as ledger:
        assert ledger.spending("alice").epsilon_remaining == LEFT
        assert ledger.spending("carol").epsilon_remaining == 1.5  # her own share is the smaller
        after = ledger.charge("alice", Cost(Fraction(1, 2), Fraction(0)), "SELECT 3")
        assert after.epsilon_remaining == LEFT - 0.5  # what a charge returns is capped the same way


def test_the_command_line_says_the_smaller(spent: Path) -> None:
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(spent), "--analyst", "alice",
                          "--epsilon", "0.5")
    assert code == 0, err
    assert f"alice has epsilon {LEFT - 0.5:g} of 20 left" in err
    code, out, _err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(spent), "--analyst", "alice",
                          "--epsilon", "0.5", "--format", "json")
    assert code == 0 and json.loads(out)["budget"]["epsilon_remaining"] == LEFT - 1
    code, out, _err = run("budget", "--policy", str(spent), "--analyst", "alice")
    assert code == 0 and f"alice: epsilon 4.5 spent of 20, {LEFT - 1:g} left" in out


def test_the_dbapi_says_the_smaller(spent: Path) -> None:
    with dpsql.connect(spent, "alice") as con:
        assert con.budget().epsilon_remaining == LEFT
        con.cursor().execute("SELECT COUNT(*) FROM visits", epsilon=0.5)
        assert con.budget().epsilon_remaining == LEFT - 0.5


def test_the_server_says_the_smaller(spent: Path) -> None:
    running = start_server(spent)
    try:
        notices: list[str] = []
        with psycopg.connect(dsn(running), autocommit=True) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
            budget = conn.execute("SHOW dpsql.budget").fetchone()
            conn.execute("SET dpsql.epsilon = 0.5")
            conn.execute("SELECT COUNT(*) FROM visits").fetchall()
    finally:
        running.stop()
    assert budget[:3] == ("alice", 3.5, LEFT)
    assert notices == [f"dpsql: this query cost epsilon 0.5; alice has epsilon {LEFT - 0.5:g} of 20 left"]

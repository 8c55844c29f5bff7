"""The server's measurement store (issue 32): one for all its sessions, read per analyst unless the policy shares.

alice's released counts by smoker and sex answer her later roll-up by sex in another connection for nothing; bob,
asking the same roll-up, is charged in full and his notice says nothing of her questions."""

from __future__ import annotations

import psycopg
import pytest

from benchmarks.support import start_server
from tests.server.conftest import charges, dsn, sample_policy

FINE = "SELECT smoker, sex, COUNT(*) FROM visits GROUP BY smoker, sex"
ROLL_UP = "SELECT sex, COUNT(*) FROM visits GROUP BY sex"


def _ask(running, user: str, sql: str, epsilon: float) -> str:
    notices: list[str] = []
    with psycopg.connect(dsn(running, user)) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        conn.execute(f"SET dpsql.epsilon = {epsilon}")
        conn.execute(sql).fetchall()
    assert len(notices) == 1, notices
    return notices[0]


def test_an_analysts_measurements_serve_their_later_sessions_only(tmp_path) -> None:
    running = start_server(sample_policy(tmp_path / "server"))
    try:
        _ask(running, "alice", FINE, 2)
        bob = _ask(running, "bob", ROLL_UP, 0.5)
        assert "cost epsilon 0.5" in bob and "derived" not in bob and "reusing" not in bob, bob
        assert charges(running.policy)[-1].analyst == "bob"
        assert charges(running.policy)[-1].epsilon == pytest.approx(0.5)
        alice = _ask(running, "alice", ROLL_UP, 0.5)
        assert "derived from released measurements, no charge" in alice, alice
        assert charges(running.policy)[-1].epsilon == 0 and charges(running.policy)[-1].analyst == "alice"
    finally:
        running.stop()

"""The budget ledger under faults: concurrent processes, SIGKILL at random points, unusable ledger locations."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.attacks.ledger_faults import (
    QUERY,
    cli_concurrently,
    first_use_concurrently,
    inspect,
    kill_at_random,
    readonly_cases,
    spend_concurrently,
    write_people,
)
from benchmarks.support import Budget, create_ledger, open_session
from dpsql.errors import LedgerError

EPSILON = 0.125  # a power of two: the ledger's exact sum reaches the budget after exactly budget / EPSILON answers


def test_concurrent_workers_spend_the_budget_exactly_once(tmp_path: Path) -> None:
    policy = write_people(tmp_path, Budget(epsilon=2.0))
    figures = spend_concurrently(policy, processes=4, attempts=8, epsilon=EPSILON)  # 32 attempts, room for 16
    assert figures.overspend == 0
    assert figures.answers == figures.ledger.charges == 16  # no answer unpaid, none charged twice, none lost
    assert figures.refusals == 16
    assert figures.ledger.consistent, figures.ledger


def test_concurrent_cli_processes_never_overspend(tmp_path: Path) -> None:
    policy = write_people(tmp_path, Budget(epsilon=1.0))
    figures, codes = cli_concurrently(policy, processes=5, epsilon=0.25)  # room for 4
    assert sorted(codes) == [0, 0, 0, 0, 3]
    assert figures.answers == figures.ledger.charges == 4
    assert figures.ledger.consistent, figures.ledger


def test_a_killed_process_never_leaves_an_answer_unpaid_nor_a_broken_ledger(tmp_path: Path) -> None:
    policy = write_people(tmp_path, Budget(epsilon=1e6))
    kills = kill_at_random(policy, kills=5, max_delay=2.0, seed=29)
    assert sum(k.answers for k in kills.kills) > 0  # some kills landed while queries were being answered
    assert kills.unpaid_answers == 0, kills.line()
    assert kills.extra_charges == 0, kills.line()
    assert kills.ledger.consistent, kills.line()
    session = open_session(policy, 1, "after")  # and the next process can still spend
    try:
        session.execute(QUERY, epsilon=EPSILON)
    finally:
        session.close()
    assert inspect(policy).per_analyst["after"] == 1


def test_an_unwritable_or_missing_ledger_location_gets_no_free_answer() -> None:
    results = readonly_cases()
    for refusal in results:
        assert not refusal.free_answer, refusal
        assert refusal.exit_code in (0, 1), refusal  # answered (and charged), or refused as a ledger error
    refused = {r.case for r in results if r.exit_code == 1 and not r.answered}
    assert {"read-only folder, no ledger yet", "read-only ledger file", "missing folder"} <= refused


@pytest.mark.parametrize("fault", ["folder removed", "ledger replaced by garbage", "ledger is a folder"])
def test_a_ledger_that_breaks_during_a_session_refuses_the_next_query(tmp_path: Path, fault: str) -> None:
    policy = write_people(tmp_path / "data", Budget(extra={"ledger": str(tmp_path / "ledgers" / "l.sqlite")}))
    (tmp_path / "ledgers").mkdir()
    session = open_session(policy, 1)
    try:
        session.execute(QUERY, epsilon=EPSILON)
        ledger = tmp_path / "ledgers" / "l.sqlite"
        if fault == "folder removed":
            shutil.rmtree(ledger.parent)
        else:
            for path in ledger.parent.iterdir():  # the ledger's files, and the engine's spill folder beside it
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            if fault == "ledger is a folder":
                ledger.mkdir()
            else:
                ledger.write_bytes(b"not a database, " * 512)
        with pytest.raises(LedgerError):
            session.execute(QUERY, epsilon=EPSILON)
    finally:
        session.close()


@pytest.mark.parametrize("attempt", range(3))
def test_several_processes_can_start_at_once_on_a_new_ledger(tmp_path: Path, attempt: int) -> None:
    """The first processes to use a ledger race to create it; each must still answer with its charge.
    (Fails intermittently since 59f3d94: a process that finds the file before its creator wrote the schema refuses
    with "was started with no accounting", or one gets "database is locked" switching the file to WAL.)"""
    figures = first_use_concurrently(tmp_path, processes=6)
    assert not figures.failures, figures.line()
    assert figures.answers == figures.charges == 6, figures.line()


def test_a_deleted_ledger_is_not_a_fresh_budget_for_the_next_process(tmp_path: Path) -> None:
    """A new process (every `dpsql query`) that finds no ledger must refuse, not start an empty one: the whole
    budget again. Creating a ledger is the steward's deliberate step (`dpsql budget --init`)."""
    policy = create_ledger(write_people(tmp_path, Budget(epsilon=1.0)))
    dpsql = str(Path(sys.executable).with_name("dpsql"))

    def ask() -> subprocess.CompletedProcess:
        return subprocess.run([dpsql, "query", QUERY, "--policy", str(policy), "--epsilon", "1", "--analyst", "a"],
                              capture_output=True, text=True, timeout=600)

    assert ask().returncode == 0
    assert ask().returncode == 3  # the budget is spent
    for path in tmp_path.glob("*.ledger.sqlite*"):
        path.unlink()
    again = ask()
    assert again.returncode != 0 and not again.stdout.strip(), again.stdout

"""The budget ledger under faults: concurrent spenders, SIGKILLed processes, read-only and missing ledgers.

- Concurrency: several processes (workers running PrivateSession, and the `dpsql` CLI) spend one budget at
  once. The total answered times the cost must not exceed the budget, every answer must have exactly one
  charge, and with more attempts than the budget allows, the budget is spent to the last query.
- Kills: a worker answering queries in a loop is SIGKILLed after a random delay (during start-up, loading,
  charging or releasing). The answers it printed must each have a charge (at most one charge more than answers:
  the query in flight), and the ledger must open, pass SQLite's integrity check and sum correctly afterwards.
- Read-only or missing ledger locations: the query must be refused (no answer) rather than answered for free.

The spending processes are ledger_worker.py's: one flushed line per attempt, so what the parent read before a
kill is exactly what was released.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from benchmarks.attacks.ledger_worker import QUERY, command
from benchmarks.attacks.script import options, scratch
from benchmarks.support import Budget, Table, column, create_ledger, open_session, write_dataset
from dpsql.policy import load_policy
from dpsql.store.ledger import BudgetLedger

ROOT = Path(__file__).resolve().parents[2]
PEOPLE = Table("people", "pid", (column("pid", "int"), column("smoker", "bool")))


def write_people(folder: Path, budget: Budget) -> Path:
    return write_dataset(folder, PEOPLE, [(pid, pid % 3 == 0) for pid in range(200)], budget)


@dataclass(frozen=True)
class LedgerState:
    integrity: str  # SQLite's PRAGMA integrity_check
    charges: int
    spent: Fraction  # the exact sum of the recorded epsilons
    reported: float  # what BudgetLedger.spending() reports
    total: float
    per_analyst: dict[str, int]

    @property
    def consistent(self) -> bool:
        return self.integrity == "ok" and abs(float(self.spent) - self.reported) <= 1e-12 * max(1.0, self.total) \
            and self.spent <= Fraction(repr(self.total))


def inspect(policy: Path) -> LedgerState:
    """Open the ledger afresh, as the next process would, and check it."""
    loaded = load_policy(policy)
    con = sqlite3.connect(loaded.budget.ledger)
    try:
        integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        con.close()
    ledger = BudgetLedger(loaded.budget.ledger, loaded.budget)
    history = ledger.history()
    per_analyst: dict[str, int] = {}
    for charge in history:
        per_analyst[charge.analyst] = per_analyst.get(charge.analyst, 0) + 1
    return LedgerState(integrity, len(history), sum((c.epsilon for c in history), Fraction(0)),
                       ledger.spending().epsilon_spent, loaded.budget.epsilon, per_analyst)


@dataclass(frozen=True)
class Concurrency:
    processes: int
    attempts: int  # in all
    answers: int
    refusals: int
    cost: Fraction  # of one query
    ledger: LedgerState

    @property
    def overspend(self) -> Fraction:
        return max(Fraction(0), self.answers * self.cost - Fraction(repr(self.ledger.total)))

    def line(self, what: str) -> str:
        return (f"  {what}: {self.processes} processes, {self.attempts} attempts at epsilon {float(self.cost):g} "
                f"against a budget of {self.ledger.total:g}: {self.answers} answers, {self.refusals} refusals, "
                f"{self.ledger.charges} charges, overspend {float(self.overspend):g}, ledger {self.ledger.integrity}")


def spend_concurrently(policy: Path, processes: int, attempts: int, epsilon: float) -> Concurrency:
    """Workers spending one (already created) ledger's budget at once."""
    create_ledger(policy)
    children = [subprocess.Popen(command(policy, f"worker{i}", attempts, epsilon, i), cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(processes)]
    lines = []
    for child in children:
        out, err = child.communicate(timeout=600)
        if child.returncode != 0:
            raise RuntimeError(f"a worker failed: {err.strip()[-2000:]}")
        lines += out.split()
    return Concurrency(processes, processes * attempts, lines.count("ANSWER"), lines.count("REFUSED"),
                       Fraction(repr(epsilon)), inspect(policy))


def cli_concurrently(policy: Path, processes: int, epsilon: float) -> tuple[Concurrency, list[int]]:
    """The `dpsql query` command, several at once on an already created ledger; returns the figures and the exit
    codes."""
    create_ledger(policy)
    dpsql = Path(sys.executable).with_name("dpsql")
    children = [subprocess.Popen([str(dpsql), "query", QUERY, "--policy", str(policy), "--epsilon", repr(epsilon),
                                  "--analyst", f"cli{i}", "--format", "csv"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(processes)]
    codes, answers = [], 0
    for child in children:
        out, _ = child.communicate(timeout=600)
        codes.append(child.returncode)
        answers += child.returncode == 0 and len(out.strip().splitlines()) == 2  # header and one value
    figures = Concurrency(processes, processes, answers, codes.count(3), Fraction(repr(epsilon)), inspect(policy))
    return figures, codes


@dataclass(frozen=True)
class FirstUse:
    """Several processes answering their first query at once on a ledger that does not exist yet."""

    processes: int
    answers: int
    charges: int
    failures: list[str]  # the last line each failed process wrote to stderr

    def line(self) -> str:
        failed = f"; failures: {sorted(set(self.failures))}" if self.failures else ""
        return (f"  first use: {self.processes} processes at once on a new ledger: {self.answers} answers, "
                f"{self.charges} charges, {len(self.failures)} failed{failed}")


def first_use_concurrently(folder: Path, processes: int, epsilon: float = 0.125) -> FirstUse:
    policy = write_people(folder, Budget(epsilon=processes * epsilon * 2))
    children = [subprocess.Popen(command(policy, f"first{i}", 1, epsilon, i), cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(processes)]
    answers, failures = 0, []
    for child in children:
        out, err = child.communicate(timeout=600)
        answers += out.split().count("ANSWER")
        if child.returncode != 0:
            failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit {child.returncode}")
    charges = charge_count(load_policy(policy).budget.ledger) or 0
    return FirstUse(processes, answers, charges, failures)


@dataclass(frozen=True)
class Kill:
    delay: float
    answers: int  # lines the parent read before the kill
    charges: int  # the ledger's charges for this worker afterwards


@dataclass(frozen=True)
class Kills:
    kills: list[Kill]
    ledger: LedgerState

    @property
    def unpaid_answers(self) -> int:
        return sum(max(0, k.answers - k.charges) for k in self.kills)

    @property
    def extra_charges(self) -> int:
        """Charges beyond one per answer plus the one query in flight at the kill."""
        return sum(max(0, k.charges - k.answers - 1) for k in self.kills)

    def line(self) -> str:
        delays = [k.delay for k in self.kills]
        return (f"  SIGKILL: {len(self.kills)} kills (delays {min(delays):.2f}..{max(delays):.2f} s), "
                f"{sum(k.answers for k in self.kills)} answers released, {self.ledger.charges} charges; answers "
                f"without a charge {self.unpaid_answers}, charges beyond answers + 1 in flight "
                f"{self.extra_charges}; ledger {self.ledger.integrity}, sums "
                f"{'correctly' if self.ledger.consistent else 'WRONG'}")


def kill_at_random(policy: Path, kills: int, max_delay: float, seed: int) -> Kills:
    """Odd kills land at a random time after the start (start-up, loading, the first queries); even kills wait
    for the first answer and land at a random time within the next few queries, so that however slow the
    machine, some kills hit the charge-then-release loop."""
    chooser = random.Random(seed)
    results = []
    for i in range(kills):
        analyst = f"killed{i}"
        child = subprocess.Popen(command(policy, analyst, 10**6, 0.001, i), cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = ""
        if i % 2 == 0:
            first = child.stdout.readline()
            delay = chooser.uniform(0.0, 0.2)
        else:
            delay = chooser.uniform(0.0, max_delay)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate()
        state = inspect(policy)
        results.append(Kill(delay, (first + out).split().count("ANSWER"), state.per_analyst.get(analyst, 0)))
    return Kills(results, inspect(policy))


@dataclass(frozen=True)
class Refusal:
    case: str
    exit_code: int
    answered: bool  # whether anything reached stdout
    charges_before: int | None  # None: no readable ledger
    charges_after: int | None
    message: str

    @property
    def free_answer(self) -> bool:
        """An answer without a charge recorded for it."""
        return self.answered and (self.charges_after is None or self.charges_after <= (self.charges_before or 0))


def charge_count(ledger: Path) -> int | None:
    try:
        con = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
        try:
            return con.execute("SELECT count(*) FROM charges").fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return None


def run_unprivileged(args: Sequence[str]) -> subprocess.CompletedProcess:
    """Run so that file modes bind the process: as root, still root but without any capability (through
    util-linux's setpriv), so the owner's permission bits apply as they do to any user.

    Not as another user: that user could not reach a checkout, a virtualenv or an interpreter that lives under
    a folder only its owner may enter (a home folder with mode 700, a `mktemp -d` folder)."""
    drop = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all"] if os.geteuid() == 0 else []
    return subprocess.run([*drop, *args], capture_output=True, text=True, timeout=600)


def readonly_cases() -> list[Refusal]:
    """The CLI against ledgers it cannot write: a read-only folder with no ledger yet, a read-only ledger file,
    a ledger file in a read-only folder (WAL needs files beside it), and a missing folder.

    The read-only modes clear the owner's write bits too, since the process runs as the files' owner."""
    with scratch() as folder:
        try:
            return _readonly_cases(folder)
        finally:
            for path in folder.rglob("*"):
                if path.is_dir():
                    path.chmod(0o755)


def _readonly_cases(folder: Path) -> list[Refusal]:
    dpsql = str(Path(sys.executable).with_name("dpsql"))
    cases = {"read-only folder, no ledger yet": (0o555, None), "read-only ledger file": (0o777, 0o444),
             "writable ledger in a read-only folder": (0o555, 0o666), "missing folder": (None, None)}
    results = []
    for i, (case, (folder_mode, file_mode)) in enumerate(cases.items()):
        home = folder / f"case{i}"
        location = "missing/ledger.sqlite" if folder_mode is None else "ledgers/ledger.sqlite"
        policy = write_people(home, Budget(epsilon=10.0, extra={"ledger": location}))
        ledger = home / location
        if folder_mode is not None:
            ledger.parent.mkdir()
            if file_mode is not None:  # an existing ledger with one charge in it
                BudgetLedger(ledger, load_policy(policy).budget, create=True).close()
                write_ledger_charge(policy)
                ledger.chmod(file_mode)
            ledger.parent.chmod(folder_mode)
        before = charge_count(ledger)
        done = run_unprivileged([dpsql, "query", QUERY, "--policy", str(policy), "--analyst", "ro",
                                 "--format", "csv"])
        results.append(Refusal(case, done.returncode, bool(done.stdout.strip()), before, charge_count(ledger),
                               done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""))
    return results


def write_ledger_charge(policy: Path) -> None:
    session = open_session(policy, 0, "setup")
    try:
        session.execute(QUERY, epsilon=1.0)
    finally:
        session.close()


def main() -> None:
    args = options(__doc__, processes=8, attempts=40, kills=100, seed=29)
    print("ledger under faults")
    with scratch() as folder:
        capacity = args.processes * args.attempts // 2  # half the attempts must be refused
        policy = write_people(folder / "spend", Budget(epsilon=capacity / 8, query_epsilon=0.125))
        print(spend_concurrently(policy, args.processes, args.attempts, 0.125).line("workers"))
        policy = write_people(folder / "cli", Budget(epsilon=1.0))
        figures, codes = cli_concurrently(policy, args.processes, 0.25)
        print(figures.line("dpsql query") + f"; exit codes {sorted(codes)}")
        policy = write_people(folder / "kill", Budget(epsilon=1e6))
        print(kill_at_random(policy, args.kills, 2.5, args.seed).line())
        for attempt in range(10):
            print(first_use_concurrently(folder / f"first{attempt}", args.processes).line())
    for refusal in readonly_cases():
        print(f"  {refusal.case}: exit {refusal.exit_code}, answered {refusal.answered}, charges "
              f"{refusal.charges_before} -> {refusal.charges_after}: {refusal.message}")

if __name__ == "__main__":
    main()

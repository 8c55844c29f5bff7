"""A process that spends a ledger's budget: it answers one query per attempt and prints one line for each.

"ANSWER <value>" once `execute` has returned (so the line is exactly what was released), or "REFUSED" for
BudgetExhausted; each line is flushed at once, so a parent that SIGKILLs this process has read every answer it
released. Run by ledger_faults.py as `python -m benchmarks.attacks.ledger_worker --policy P --analyst A ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.attacks.script import options
from benchmarks.support import open_session
from dpsql.errors import BudgetExhausted

QUERY = "SELECT COUNT(*) FROM people WHERE smoker"


def worker(policy: Path, analyst: str, attempts: int, epsilon: float, seed: int) -> None:
    session = open_session(policy, seed, analyst)
    for _ in range(attempts):
        try:
            value = session.execute(QUERY, epsilon=epsilon).rows[0][0]
        except BudgetExhausted:
            print("REFUSED", flush=True)
            continue
        print(f"ANSWER {value}", flush=True)


def command(policy: Path, analyst: str, attempts: int, epsilon: float, seed: int) -> list[str]:
    return [sys.executable, "-m", "benchmarks.attacks.ledger_worker", "--policy", str(policy), "--analyst", analyst,
            "--attempts", str(attempts), "--epsilon", repr(epsilon), "--seed", str(seed)]


def main() -> None:
    args = options(__doc__, policy=Path("policy.toml"), analyst="worker", attempts=1, epsilon=0.1, seed=0)
    worker(args.policy, args.analyst, args.attempts, args.epsilon, args.seed)


if __name__ == "__main__":
    main()

"""Fuzzing the whole pipeline: generated and mutated SQL (fuzz_grammar.py), odd parameters and odd epsilons,
through `PrivateSession.execute` and through the `dpsql query` command.

The oracle, per case, from the ledger before and after:
- answered: the ledger holds exactly one new charge, of the query's cost, and the bounded SQL that ran reads
  nothing but dpsql's prepared copy of the declared table;
- rejected: a dpsql.errors.Error, and the ledger is unchanged;
anything else is a violation: a charged error (the query ran on the data and then failed: whether it fails can
depend on the data, and nothing was released for the budget spent), an answer without its charge, an answer
that read something else, or a crash (any other exception: a traceback, or exit code 70 from the CLI).
"""

from __future__ import annotations

import math
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlglot import exp, parse_one

from benchmarks.attacks.fuzz_grammar import cases
from benchmarks.attacks.script import options, scratch
from benchmarks.support import Budget, Table, column, create_ledger, open_session, write_dataset
from dpsql.errors import Error
from dpsql.frontends.cli import main as cli
from dpsql.rewrite.passes import rewrite
from dpsql.session import PrivateResult, PrivateSession
from dpsql.sql.names import later_rows_table, prepared_table

EPSILON = 0.01
ODD_EPSILONS: tuple[Any, ...] = (0, -1, math.nan, math.inf, 1e-320, 5e-324, 1e-300, 1e-12, 1e13, "abc", "1e-3",
                                 True, None, 0.5)
ODD_PARAMETERS: tuple[Any, ...] = (1, -1, 0.5, math.nan, math.inf, "a", "'; DROP TABLE f; --", None, True, b"x",
                                   2**70, {"a": 1}, [1], "\x00", "ü")
@dataclass(frozen=True)
class Case:
    sql: str
    parameters: Any = None
    epsilon: Any = EPSILON


EDGE_CASES = (  # found by the fuzzer, minimised: each must end as an answer with its charge or a free rejection
    *(Case(sql, None, epsilon) for sql in ("SELECT COUNT(*) FROM f", "SELECT AVG(x) FROM f")
      for epsilon in ODD_EPSILONS),
    Case("SELECT COUNT(*) FROM f LIMIT 99999999999999999999"),
    Case("SELECT COUNT(*) FROM f ORDER BY 1e308"),
    Case("SELECT COUNT(*) FROM f HAVING AVG(x) > 1e - 308"),
    Case("SELECT COUNT(*) FROM f WHERE note LIKE 'a' ESCAPE 'ab'"),
    Case("SELECT COUNT(*) FROM f WHERE note LIKE 'a' ESCAPE 'ü'"),
    Case("SELECT SUM(2) FROM f"),
    Case("SELECT SUM(x + 1e6) FROM f"),
)
TABLE = Table("f", "uid", (
    column("uid", "int"), column("g", "text", values=("a", "b", "c")), column("h", "text"),
    column("x", "float", -10.0, 10.0), column("k", "int", 0.0, 100.0), column("flag", "bool"), column("d", "date"),
    column("note", "text")), max_rows=3)


def write_fuzz_table(folder: Path, seed: int = 0) -> Path:
    r = random.Random(seed)
    rows = [(r.choice([*range(60), None]), r.choice(["a", "b", "c", "z", None]), r.choice(["h1", "h2", "h3", None]),
             r.choice([r.uniform(-20, 20), None, math.nan]), r.choice([r.randint(-5, 120), None]),
             r.choice([True, False, None]), r.choice(["2023-05-01", "2024-02-29", None]),
             r.choice(["alpha", "beta", "a%b", "it's", "ü", None])) for _ in range(200)]
    # 1e12: never exhausted by a run (ODD_EPSILONS' 1e13 is the one that must be refused as too much)
    return create_ledger(write_dataset(folder, TABLE, rows, Budget(epsilon=1e12, query_epsilon=EPSILON)))


def with_inputs(queries: Sequence[str], rng: random.Random) -> list[Case]:
    """Parameters where the SQL has placeholders (and now and then where it has none); odd epsilons now and then."""
    out = []
    for sql in queries:
        placeholders = sql.count("?")
        parameters = [rng.choice(ODD_PARAMETERS) for _ in range(placeholders + (rng.random() < 0.1))] \
            if placeholders or rng.random() < 0.05 else None
        out.append(Case(sql, parameters, rng.choice(ODD_EPSILONS) if rng.random() < 0.08 else EPSILON))
    return out


@dataclass(frozen=True)
class Outcome:
    case: Case
    # "answered" | "probe" | "rejected" | "charged error" | "free answer" | "foreign read" | "crash"
    kind: str
    detail: str = ""

    @property
    def violation(self) -> bool:
        return self.kind not in ("answered", "probe", "rejected")

    @property
    def signature(self) -> str:
        return f"{self.kind}: {self.detail[:70]}"


def charges(ledger: Path) -> tuple[int, str | None]:
    """How many charges the ledger holds, and the epsilon of the last (read directly: cheap for thousands)."""
    con = sqlite3.connect(ledger)
    try:
        count = con.execute("SELECT count(*) FROM charges").fetchone()[0]
        last = con.execute("SELECT epsilon FROM charges ORDER BY id DESC LIMIT 1").fetchone()
    finally:
        con.close()
    return count, last[0] if last else None


def foreign_tables(result: PrivateResult) -> set[str]:
    """The tables the bounded SQL read, other than dpsql's prepared copy (and its later-rows table) and its own
    CTEs."""
    tree = parse_one(rewrite(result.plan).sql, read="duckdb")
    ctes = {cte.alias for cte in tree.find_all(exp.CTE)}
    name = result.plan.query.table.name
    allowed = {prepared_table(name), later_rows_table(name), *ctes}
    return {t.name for t in tree.find_all(exp.Table)} - allowed


def run_session(session: PrivateSession, case: Case) -> Outcome:
    ledger = session.policy.budget.ledger
    before, _ = charges(ledger)
    try:
        result = session.execute(case.sql, case.parameters, epsilon=case.epsilon)
    except Error as exc:
        after, _ = charges(ledger)
        return Outcome(case, "rejected" if after == before else "charged error", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a crash: what the oracle exists to find
        return Outcome(case, "crash", f"{type(exc).__name__}: {exc}")
    after, last = charges(ledger)
    if after == before and result.plan is None and not result.rows and not result.cost.epsilon:
        # A column probe (analysis/probes.py: LIMIT 0, a WHERE false on every row): the declared columns, no row
        # whatever the data, so nothing read and nothing to charge.
        return Outcome(case, "probe")
    if after != before + 1 or last is None or Fraction(last) != result.cost.epsilon:
        return Outcome(case, "free answer", f"charges {before} -> {after}, last {last}, cost {result.cost.epsilon}")
    foreign = foreign_tables(result)
    return Outcome(case, "foreign read", ", ".join(sorted(foreign))) if foreign else Outcome(case, "answered")


def run_cli(policy: Path, case: Case) -> Outcome:
    """The same case through `dpsql query` (in process, with click's runner)."""
    ledger = policy.parent / "policy.ledger.sqlite"
    before = charges(ledger)[0] if ledger.exists() else 0
    args = ["query", case.sql, "--policy", str(policy), "--analyst", "cli-fuzz", "--format", "csv"]
    if case.epsilon is not None:
        args += ["--epsilon", str(case.epsilon)]
    result = CliRunner().invoke(cli, args)
    after = charges(ledger)[0] if ledger.exists() else 0
    lines = result.output.strip().splitlines()
    message = lines[-1] if lines else ""
    uncaught = result.exception is not None and not isinstance(result.exception, SystemExit)
    if uncaught or result.exit_code not in (0, 1, 2, 3, 4):  # exit 70 is dpsql's "internal error (a bug)"
        return Outcome(case, "crash", f"exit {result.exit_code}: {message or repr(result.exception)}")
    if result.exit_code == 0:
        return Outcome(case, "answered" if after == before + 1 else "free answer", message)
    return Outcome(case, "rejected" if after == before else "charged error", message)


@dataclass
class Summary:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def counts(self) -> Counter:
        return Counter(o.kind for o in self.outcomes)

    @property
    def exhausted(self) -> int:
        """Ordinary cases refused for lack of budget: a run that ran dry would test nothing after that."""
        return sum(o.case.epsilon == EPSILON and o.detail.startswith("BudgetExhausted") for o in self.outcomes)

    def violations(self, kind: str | None = None) -> list[Outcome]:
        return [o for o in self.outcomes if o.violation and (kind is None or o.kind == kind)]

    def report(self, limit: int = 3) -> str:
        """Each distinct violation once (its first case), then the counts."""
        seen: dict[str, Outcome] = {}
        for outcome in self.violations():
            seen.setdefault(outcome.signature, outcome)
        lines = [f"{len(self.outcomes)} cases in {self.seconds:.1f} s: {dict(self.counts)}; "
                 f"{len(self.violations())} violations, {len(seen)} distinct"]
        for signature, outcome in list(seen.items())[:limit * 10]:
            lines.append(f"  {signature}\n      e.g. sql={outcome.case.sql!r} parameters={outcome.case.parameters!r} "
                         f"epsilon={outcome.case.epsilon!r}")
        return "\n".join(lines)


def fuzz(run: Callable[[Case], Outcome], inputs: Sequence[Case]) -> Summary:
    summary = Summary()
    start = time.perf_counter()
    for case in inputs:
        summary.outcomes.append(run(case))
    summary.seconds = time.perf_counter() - start
    return summary


def fuzz_session(folder: Path, n: int, seed: int) -> Summary:
    rng = random.Random(seed)
    session = open_session(write_fuzz_table(folder, seed), seed, "fuzz")
    try:
        return fuzz(lambda case: run_session(session, case), with_inputs(cases(rng, n), rng))
    finally:
        session.close()


def fuzz_cli(folder: Path, n: int, seed: int) -> Summary:
    rng = random.Random(seed)
    policy = write_fuzz_table(folder, seed)
    return fuzz(lambda case: run_cli(policy, case), with_inputs(cases(rng, n), rng))


def fuzz_edges(folder: Path, seed: int) -> Summary:
    session = open_session(write_fuzz_table(folder, seed), seed, "edges")
    try:
        return fuzz(lambda case: run_session(session, case), EDGE_CASES)
    finally:
        session.close()


def main() -> None:
    args = options(__doc__, cases=5000, cli_cases=500, seed=31)
    with scratch() as folder:
        print("fuzz, minimised edge cases:", fuzz_edges(folder / "edges", args.seed).report())
        print("fuzz, PrivateSession.execute:", fuzz_session(folder / "session", args.cases, args.seed).report())
        print("fuzz, dpsql query:", fuzz_cli(folder / "cli", args.cli_cases, args.seed + 1).report())


if __name__ == "__main__":
    main()

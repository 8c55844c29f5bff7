"""The Spark engine against the DuckDB engine (issue 34): the same generated queries, the same seeds, the same release.

`python -m benchmarks.spark_parity [--queries 1000 --seed 34]` prints the figures and writes them to
benchmarks/results/spark_parity.md; tests/test_spark_parity.py runs a seeded few dozen. The data are the exactness
harness's (benchmarks/exactness.py) plus adversarial units: the extreme integers, NaN, +-inf, -0.0, the extreme
doubles, zero divisors, NULLs, long and unusual text, dates far outside the declared range. The queries are the
exactness generator's (joins, subqueries, CTEs, per-unit aggregation, quantiles, COUNT(DISTINCT), coded keys,
grouping sets) and a source of its own whose expressions divide by values that can be 0, multiply the extreme
integers and compare the adversarial values.

Each query runs through the whole pipeline (PrivateSession.execute) on a DuckDB engine and on a Spark engine built
with the same bounding seed, each session's noise seeded alike before the query. Outcomes:
- identical: the release is the same, column names and types, rows, values (NaN and -0.0 compared by their repr)
  and intervals;
- refused by both (each with its own reason);
- refused on Spark only, before any charge, as "not supported on the Spark engine: ..." (the reason is counted);
- different: anything else (different releases, a refusal on DuckDB only, a Spark refusal that charged, a failure).
The sample analyst workload (benchmarks/analyst_workload.py) is compared the same way, on the sample data, and so
is SmartNoise's PUMS corpus (145 queries from SmartNoise SQL's tests and docs, held out of this repository:
`--corpus PATH`, by default /work/shared/corpora/smartnoise_pums.csv) on the shipped PUMS policy, at a negligible
noise (epsilon 1e6 a query).
"""

from __future__ import annotations

import csv
import dataclasses
import random
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.analyst_workload import QUESTIONS
from benchmarks.attacks.script import options, scratch
from benchmarks.exactness import MAX_ROWS, SOURCES, VISITS, Generator, Source, write_data
from benchmarks.support import SAMPLE, create_ledger, csv_cell, seeded, write_hospital
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import Error
from dpsql.policy import EngineChoice, Policy, load_policy
from dpsql.session import PrivateSession

SPARK = EngineChoice("spark", "local[2]", (("spark.sql.shuffle.partitions", "2"),))
BOUNDING_SEED = 34
RESULT = Path(__file__).parent / "results" / "spark_parity.md"
CORPUS = Path("/work/shared/corpora/smartnoise_pums.csv")
NEGLIGIBLE = 1e6  # a query's epsilon at which every noise draw rounds to nothing
SPARK_REFUSAL = "not supported on the Spark engine"
PUBLIC_REFUSAL = "this engine cannot read public tables"  # the checker's, when an engine has no public tables
OVERSPENT = "would overspend"  # the ledger's refusal: the harness's budget, not an engine's answer

_BIG = 2 ** 63 - 1
_INF, _NAN = float("inf"), float("nan")
# Adversarial visits, a unit each (pid, dept, region, age, stay, cost, score, smoker, day): every value the columns'
# types hold that one engine might treat differently from the other.
ADVERSARIAL = [
    [(_BIG, "a", "north", _BIG, _BIG, 1e308, 0.0, True, "2019-01-01"),
     (_BIG, "a", "north", -_BIG - 1, -_BIG - 1, -1e308, -0.0, False, "2024-12-31")],
    [(-_BIG - 1, "b", "south", 0, 0, _NAN, _NAN, False, "0001-01-01"),
     (-_BIG - 1, "b", "south", 1, 0, _INF, _INF, True, "9999-12-31")],
    [(0, "c", "x" * 300, 50, 0, -_INF, -_INF, True, "2020-02-29"),
     (0, "c", "it's \"quoted\", é ü 中", 41, 1, -0.0, 0.0, False, "1970-01-01")],
    [(10 ** 6 + 1, "d", "", 100, 30, None, 5e-324, True, "2021-06-30"),
     (10 ** 6 + 1, "d", " north", 3, 7, 0.0, -5e-324, True, "2021-07-01"),
     (10 ** 6 + 1, "a", "NORTH", 2 ** 53 + 1, 2 ** 31, 2.5, 2.5, False, "2022-01-01"),
     (10 ** 6 + 1, "b", "a\\b\t😀%_!", 99, 2, -0.4, -0.5, False, "2022-01-02")],
    [(10 ** 6 + 2, "b", "east", -7, -3, -2.5, -2.5, True, "2023-03-03")] * MAX_ROWS,
]
# Expressions over the adversarial values: divisions by values that can be 0 (and -0.0), remainders, products of
# the extreme integers, comparisons and keys of them.
ADVERSARIAL_SOURCE = Source(
    "adversarial", "visits",
    {"age": "int", "stay": "int", "cost": "float", "score": "float", "cost / score": "float",
     "score / stay": "float", "age / stay": "float", "cost % score": "float", "age % 7": "int",
     "age * stay": "int", "-score": "float", "abs(age - 50)": "int", "age - stay * 3": "int", "sqrt(score)": "float",
     "round(cost)": "float", "sign(score)": "int", "nullif(stay, 0)": "int", "dayofweek(day)": "int",
     "extract(week from day)": "int", "isodow(day)": "int", "extract(yearweek from day)": "int",
     "extract(isoyear from day)": "int",
     "year(day) * 1000000": "int", "extract(doy from day) * 50000000": "int"},
    frozenset({"cost", "cost / score", "cost % score"}),
    ("score / stay < 0", "cost / score > 1", "age % 7", "(age * stay) % 3", "cost % score IS NULL",
     "1 / score > 5", "dept", "region", "round(score)", "sign(cost)", "dayofweek(day)", "region LIKE '%o%'",
     "date_trunc('month', day)", "date_trunc('week', day)", "date_trunc('year', day)", "extract(week from day)",
     "isodow(day)", "extract(yearweek from day)", "extract(isoyear from day)", "extract(quarter from day)"),
    ("1 / score > 5", "cost / score IS NULL", "score / stay < 0", "cost % score > 1", "age * stay > 100",
     "age * age * 3 > 0", "abs(age - 50) < 9 OR dept = 'a'", "(dept = 'a' OR dept = 'b') AND stay > 0",
     "cost IS NULL AND (region = 'north' OR abs(age - 50) < 9)", "age * stay * 2 + 1 > 0",
     "NOT (score > 0 OR cost > 0)", "cost = -cost", "score <> score", "age / stay = age / stay",
     "age * age + age * 2000000000000000000 > 0", "age * stay + 20000000000000000000000000000000000000 > 0",
     "sqrt(cost) > 3", "nullif(score, 0.0) IS NULL", "round(score) = 0", "region LIKE '%\\%'",
     "region LIKE '_' OR region LIKE '%😀%'", "region NOT LIKE 'n%'", "region LIKE '%!%!_%' ESCAPE '!'",
     "date_trunc('quarter', day) > DATE '2021-01-01'", "date_trunc('week', day) = DATE '2020-12-28'",
     "extract(week from day) >= 52", "isodow(day) = 7", "extract(yearweek from day) > 202052",
     "date_trunc('day', day) < DATE '2000-01-01'", "year(day) * 1000000 > 2021000000"),
    "pid")
PARITY_SOURCES = (*SOURCES, ADVERSARIAL_SOURCE, ADVERSARIAL_SOURCE)  # the adversarial source weighs double


def write_adversarial(folder: Path, seed: int, people: int = 300) -> Path:
    """The exactness data (its policy, with a default time limit long enough for Spark local) plus the adversarial
    units; returns the policy's path."""
    folder.mkdir(parents=True, exist_ok=True)
    policy = write_data(folder, seed, people)
    with (folder / "visits.csv").open("a", newline="") as handle:
        csv.writer(handle).writerows([csv_cell(v) for v in row] for unit in ADVERSARIAL for row in unit)
    assert list(VISITS) == ["pid", "dept", "region", "age", "stay", "cost", "score", "smoker", "day"]
    text = policy.read_text().replace("[engine]\n", "[engine]\ntime_limit_seconds = 600\n")
    # Both engines' sessions charge the one ledger: the exactness budget (1,000 queries) would run out.
    policy.write_text(re.sub(r"(?m)^epsilon = .*$", "epsilon = 1e18", text, count=1))
    return policy


@dataclass
class Summary:
    queries: int = 0
    identical: int = 0
    refused_by_both: int = 0
    refused_on_spark: Counter = field(default_factory=Counter)  # reason -> queries
    examples: dict[str, str] = field(default_factory=dict)  # reason -> its first query
    different: list[tuple[str, str]] = field(default_factory=list)  # (query, what differs)
    shapes: Counter = field(default_factory=Counter)

    def lines(self) -> list[str]:
        spark_only = sum(self.refused_on_spark.values())
        lines = [f"{self.queries} queries ({', '.join(f'{n} {s}' for s, n in sorted(self.shapes.items()))}): "
                 f"{self.identical} identical, {self.refused_by_both} refused by both, {spark_only} refused on "
                 f"Spark only (before any charge), {len(self.different)} different"]
        lines += [f"  refused on Spark {n}x: {reason}\n      e.g. {self.examples[reason]}"
                  for reason, n in self.refused_on_spark.most_common(15)]
        lines += [f"  DIFFERENT {sql}\n      {why}" for sql, why in self.different[:20]]
        return lines


def _reason(message: str) -> str:
    """A Spark refusal's reason without the query's own text (so that refusals of one kind count together)."""
    if PUBLIC_REFUSAL in message:
        return PUBLIC_REFUSAL
    reason = message.split(SPARK_REFUSAL + ": ", 1)[-1]
    return reason.split(" (", 1)[0][:90]


class Parity:
    """The two engines' sessions over one policy, compared query by query."""

    def __init__(self, policy: Policy, summary: Summary, epsilon: float | None = None) -> None:
        from dpsql.engines.spark_engine import SparkEngine  # PySpark is optional

        self.summary = summary
        self.epsilon = epsilon  # each query's (None: the policy's query_epsilon)
        spark_policy = dataclasses.replace(policy, engine=SPARK)
        self.duck = PrivateSession(policy, "analyst", engine=DuckDBEngine(policy, bounding_seed=BOUNDING_SEED))
        self.spark = PrivateSession(spark_policy, "analyst",
                                    engine=SparkEngine(spark_policy, bounding_seed=BOUNDING_SEED))

    def close(self) -> None:
        for session in (self.duck, self.spark):
            session.close()
            session.engine.close()

    def compare(self, sql: str, shape: str, noise_seed: int) -> None:
        summary = self.summary
        summary.queries += 1
        summary.shapes[shape] += 1
        duck, duck_refusal = self._release(self.duck, sql, noise_seed, self.epsilon)
        spent = self.spark.spending().epsilon_spent
        spark, spark_refusal = self._release(self.spark, sql, noise_seed, self.epsilon)
        if any(OVERSPENT in (refusal or "") for refusal in (duck_refusal, spark_refusal)):
            # Not a difference of the engines, and it would hide every later comparison as "refused by both".
            raise RuntimeError(f"the comparison ran out of budget at query {summary.queries}: {sql}")
        spark_only = spark_refusal is not None and duck_refusal is None
        if spark_only and (SPARK_REFUSAL in spark_refusal or PUBLIC_REFUSAL in spark_refusal):
            if self.spark.spending().epsilon_spent != spent:
                summary.different.append((sql, f"refused on Spark after a charge: {spark_refusal}"))
            else:
                summary.refused_on_spark[_reason(spark_refusal)] += 1
                summary.examples.setdefault(_reason(spark_refusal), sql)
        elif duck_refusal is not None and spark_refusal is not None:
            summary.refused_by_both += 1
        elif duck_refusal is not None or spark_refusal is not None:
            summary.different.append((sql, f"DuckDB: {duck_refusal or 'answered'}; "
                                           f"Spark: {spark_refusal or 'answered'}"))
        elif duck == spark:
            summary.identical += 1
        else:
            summary.different.append((sql, f"DuckDB released {duck[:400]}\n      Spark released  {spark[:400]}"))

    @staticmethod
    def _release(session: PrivateSession, sql: str, noise_seed: int, epsilon: float | None) -> tuple[str, str | None]:
        """The release as text (repr keeps NaN, -0.0 and each value's type), or the refusal's message."""
        session.rng = seeded(noise_seed)
        try:
            result = session.execute(sql, epsilon=epsilon)
        except Error as exc:
            return "", str(exc).splitlines()[0]
        columns = [(c.name, c.type) for c in result.columns]
        return repr((columns, result.rows, result.intervals)), None


@contextmanager
def parity(folder: Path, seed: int) -> Iterator[Parity]:
    summary = Summary()
    checker = Parity(load_policy(write_adversarial(folder, seed)), summary)
    try:
        yield checker
    finally:
        checker.close()


def generated(checker: Parity, queries: int, seed: int) -> Summary:
    """`queries` generated queries compared; their noise seeds follow from `seed`."""
    generator = Generator(random.Random(seed), PARITY_SOURCES)
    for i in range(queries):
        case = generator.query()
        checker.compare(case.sql, case.shape, seed * 1_000_003 + i)
    return checker.summary


def compare(folder: Path, queries: int, seed: int) -> Summary:
    with parity(folder, seed) as checker:
        return generated(checker, queries, seed)


def workload(folder: Path) -> Summary:
    """The sample analyst workload (benchmarks/analyst_workload.py) on both engines, at its epsilon of 0.5 a
    query (the two sessions share the sample policy's budget of 50)."""
    policy = dataclasses.replace(load_policy(write_hospital(folder)), time_limit=600.0)  # Spark local is slow
    checker = Parity(policy, Summary(), epsilon=0.5)
    try:
        for i, (_, sql) in enumerate(QUESTIONS):
            checker.compare(sql, "analyst workload", 36 + i)
    finally:
        checker.close()
    return checker.summary


def corpus_queries(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return [row["query"] for row in csv.DictReader(handle)]


def corpus(folder: Path, queries: list[str]) -> Summary:
    """SmartNoise's PUMS queries on both engines over the shipped PUMS policy (budget made huge), at a negligible
    noise, the noise seeded alike per query."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("pums.toml", "PUMS_pid.csv"):
        (folder / name).write_bytes((SAMPLE / "pums" / name).read_bytes())
    text = (folder / "pums.toml").read_text().replace("epsilon = 100.0", "epsilon = 1e12", 1)
    (folder / "pums.toml").write_text(text.replace("delta = 1e-6", "delta = 0.1", 1)
                                      + "\n[engine]\ntime_limit_seconds = 600\n")
    checker = Parity(load_policy(create_ledger(folder / "pums.toml")), Summary(), epsilon=NEGLIGIBLE)
    try:
        for i, sql in enumerate(queries):
            checker.compare(sql, "SmartNoise PUMS", 145 + i)
    finally:
        checker.close()
    return checker.summary


def main() -> None:
    args = options(__doc__, queries=1000, seed=34, corpus=str(CORPUS))
    only_corpus = args.queries == 0  # `--queries 0`: the corpus alone, printed, the results file left as it is
    with scratch() as folder:
        lines = [] if only_corpus else compare(folder / "generated", args.queries, args.seed).lines()
        asked = [] if only_corpus else workload(folder / "workload").lines()
        pums = corpus(folder / "pums", corpus_queries(Path(args.corpus))).lines()
    print("\n".join(lines + asked + pums))
    if only_corpus:
        return
    RESULT.write_text(f"# Spark engine against DuckDB engine (python -m benchmarks.spark_parity --queries "
                      f"{args.queries} --seed {args.seed})\n\nSpark local[2] on the 2-core shared machine; the "
                      "exactness data plus the adversarial units (benchmarks/spark_parity.py).\n\n```\n"
                      + "\n".join(lines) + "\n```\n\nThe sample analyst workload (benchmarks/analyst_workload.py) on "
                      "the sample data:\n\n```\n" + "\n".join(asked) + "\n```\n\nSmartNoise's PUMS corpus "
                      f"({len(corpus_queries(Path(args.corpus)))} queries) on the shipped PUMS policy at epsilon "
                      f"{NEGLIGIBLE:g} a query:\n\n```\n" + "\n".join(pums) + "\n```\n")


if __name__ == "__main__":
    main()

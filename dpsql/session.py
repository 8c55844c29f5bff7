"""The pipeline, stage after stage: parse, check, plan, rewrite, dry-run, charge, execute, noise, post-process.

The order is the privacy argument. Everything up to the dry run reads only the SQL, the policy and the schema,
so a rejection costs nothing and says nothing about the data. The charge is committed to the ledger before the
data is touched, so no answer (and no failure that could depend on the data) is ever released unpaid.
"""

from __future__ import annotations

import contextlib
import getpass
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.analysis.check import check
from dpsql.analysis.normalize import normalize
from dpsql.analysis.probes import is_probe
from dpsql.analysis.public_query import public_sql, resolved_sql, vet_query
from dpsql.analysis.qualified_names import unqualified
from dpsql.analysis.released import Split, candidates, reads_private
from dpsql.dp.noise import RandomSource, SecureRandom
from dpsql.engines.base import Engine, ReleasedTable
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.engines.progress import SILENT, Progress
from dpsql.errors import DataError, Error, ExecutionFailed, ProgrammingError, QueryRejected, shown
from dpsql.planning.accuracy import budget_for_accuracy
from dpsql.planning.aggregates import VOCABULARY
from dpsql.planning.plan import Budget, Cost, QueryPlan, plan
from dpsql.policy import MechanismKind, Policy, load_policy
from dpsql.release.cells import release, release_no_groups, with_buckets
from dpsql.release.postprocess import PostProcessor
from dpsql.rewrite.passes import BoundedQuery, rewrite
from dpsql.sql.names import RELEASED
from dpsql.sql.parse import DIALECT, ParsedQuery, parse
from dpsql.store.answers import AnswerStore, StoredAnswer, answer_key
from dpsql.store.ledger import BudgetLedger, Charge, Spending, exact

_PREPARED_CACHE = 256
_UNKNOWN = object()
_MIN_EPSILON = 1e-9  # below this the noise scale of a sum overflows a float, and answers are pure noise anyway


@dataclass(frozen=True)
class OutputColumn:
    name: str
    type: str  # the DuckDB type of the released column
    noisy: bool  # whether it depends on a noisy aggregate


@dataclass(frozen=True)
class PrivateResult:
    columns: tuple[OutputColumn, ...]
    rows: list[tuple[Any, ...]]
    intervals: list[tuple[tuple[float, float] | None, ...]]  # per row and column: the 95% interval, if any
    noise_std: list[tuple[float | None, ...]]  # per row and column: the noise's standard deviation, if any
    cost: Cost
    spending: Spending  # the analyst's budget after this query
    plan: QueryPlan | None  # None for a query of public tables only (no noise, no plan)
    released_groups: int  # groups that passed partition selection, before HAVING, ORDER BY and LIMIT
    cached_at: str | None = None  # when the answer was first released, if this is that answer again (cost 0)


@dataclass(frozen=True)
class _Outer:
    """SQL over a released answer, resolved for the public database, and its columns (name, DuckDB type)."""

    sql: str
    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PreparedQuery:
    plan: QueryPlan
    bounded: BoundedQuery
    key_types: list[str]
    output_types: list[str]  # the DuckDB type of each released column, found by the rehearsal (a wire Describe)
    canonical: str  # the query as parsed, parameters bound, without comments: what the answer cache keys on


class PrivateSession:
    """One analyst's access to the tables of one policy. Not thread-safe: use one per thread."""

    def __init__(self, policy: Policy | str | Path, analyst: str | None = None, *,
                 epsilon: float | None = None, rng: RandomSource | None = None,
                 bounding_seed: int | None = None, threads: int | None = None, create_ledger: bool = False,
                 engine: Engine | None = None, answers: AnswerStore | None = None,
                 quantile_intervals: bool = True, database: str | None = None) -> None:
        self.policy = policy if isinstance(policy, Policy) else load_policy(policy)
        # The database the declared tables are in, as tools qualify them (`<database>.public.visits`): the name a
        # server's client connected with, else the policy file's stem.
        self.database = database if database is not None else self.policy.path.stem
        self.analyst = analyst or _default_analyst()
        self.default_epsilon = epsilon
        # Whether a quantile (MEDIAN, QUANTILE_CONT, MIN, MAX) spends a quarter of its epsilon on its 95% interval
        # (dp/quantile_interval.py) or all of it on the value, its cell then without an interval. The default for
        # each query; a query may say otherwise (the CLI measures one when --ci shows it).
        self.quantile_intervals = quantile_intervals
        self.rng = rng if rng is not None else SecureRandom()
        self.ledger = BudgetLedger(self.policy.budget.ledger, self.policy.budget, create=create_ledger)
        # A server shares one loaded engine between its analysts' sessions (the engine locks itself); the session
        # closes only an engine it made.
        self._owns_engine = engine is None
        self.engine: Engine = engine if engine is not None else build_engine(
            self.policy, bounding_seed=bounding_seed, threads=threads)
        self.post = PostProcessor()
        # Answers already released, returned again at no cost (store/answers.py); None: every query is answered
        # afresh, as the library and the CLI do (a seeded test that repeats a query expects new noise).
        self.answers = answers
        self._prepared: dict[tuple, PreparedQuery] = {}
        self._public: dict[tuple, str | None] = {}
        self._parses: dict[tuple, ParsedQuery] = {}

    def prepare(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, accuracy: float | None = None,
                quantile_intervals: bool | None = None) -> PreparedQuery:
        """Everything short of touching the data: costs nothing.

        A pure function of the SQL, the parameters, the budget and the (fixed) policy and schema, so it is
        cached: asking the same question again skips straight to the charge. With `accuracy` (and no epsilon) the
        epsilon is the smallest that gives every released cell a 95% interval within +/- accuracy
        (planning/accuracy.py), chosen from the plan alone.
        """
        if accuracy is not None and epsilon is not None:
            raise ProgrammingError("ask with an epsilon or with an accuracy, not both")
        budget = self._budget(epsilon, quantile_intervals)
        key = (sql, repr(parameters), budget, accuracy)
        prepared = self._prepared.get(key)
        if prepared is None:
            parsed = self._parsed(sql, parameters)
            canonical = parsed.tree.sql(DIALECT, comments=False)
            facts = self.engine.public_facts()
            checked = check(normalize(parsed, self.policy, facts), self.policy, VOCABULARY, facts)
            if accuracy is not None:
                budget = budget_for_accuracy(checked, accuracy, budget, exact(self.policy.budget.epsilon), plan)
            query_plan = plan(checked, budget)
            bounded = rewrite(query_plan, listed=self.engine.lists_earlier_rows)
            key_types = self.engine.dry_run(bounded.sql)[:bounded.key_count]
            for _, sql in bounded.buckets:
                self.engine.dry_run(sql)
            prepared = PreparedQuery(query_plan, bounded, key_types, self._rehearse(query_plan, key_types), canonical)
            if len(self._prepared) >= _PREPARED_CACHE:
                self._prepared.pop(next(iter(self._prepared)))
            self._prepared[key] = prepared
        return prepared

    def _rehearse(self, query_plan: QueryPlan, key_types: list[str]) -> list[str]:
        """Run the stages after the charge on no groups at all: whatever fails whatever the data (an interval's
        arithmetic, a type error in ORDER BY) fails here, before the charge, and costs nothing. Returns the
        output's column types, which need neither the data nor the budget."""
        return self.post.run(query_plan.query, key_types, release_no_groups(query_plan)).types

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, accuracy: float | None = None,
                quantile_intervals: bool | None = None) -> PrivateResult:
        public = self._public_sql(sql, parameters)
        if public is not None:
            return self._public_answer(public)
        parsed = self._parsed(sql, parameters)
        if self._is_probe(parsed):
            names, types = self.engine.describe_declared(parsed.tree.sql(DIALECT))
            return self._free_answer(names, types, [])
        cost = {"epsilon": epsilon, "accuracy": accuracy, "quantile_intervals": quantile_intervals}
        try:
            prepared = self.prepare(sql, parameters, **cost)
        except QueryRejected as refused:
            split, inner_columns, outer = self._released_split(parsed, refused, cost)
            return self._released_answer(split, inner_columns, outer, cost)
        query_plan = prepared.plan
        key = None
        if self.answers is not None:
            key = answer_key(self.analyst, prepared.canonical, query_plan.budget, self.engine.data_version,
                             query_plan.budget.quantile_intervals)
            stored = self.answers.get(key)
            if stored is not None:
                return self._result(prepared, stored, Cost(Fraction(0), Fraction(0)),
                                    self.ledger.spending(self.analyst))
        if not query_plan.measurements:
            # Public keys and nothing measured: the declared values are the answer; no data, no charge, no entry.
            return self._answer(prepared, self.ledger.spending(self.analyst), read_data=False)
        # Refused or written here, before the data is read; the commit's fsync runs while the data is read, and
        # nothing is released (nor stored) before `wait` says the charge is on disk. A commit that fails raises
        # LedgerError there, and the answer is dropped.
        pending = self.ledger.begin_charge(self.analyst, query_plan.cost, sql)
        # Everything after the charge touched the data, so whether it fails, and how, could depend on one row: any
        # exception (an engine error, the time limit, a conversion, two groups merging, a bug in release or
        # post-processing) becomes the one generic error. It is raised once the exception is suppressed, so that
        # not even its __context__ keeps the original exception, whose message might quote a value.
        result = None
        try:
            with contextlib.suppress(Exception):
                result = self._answer(prepared, pending.spending)
        finally:
            pending.wait()
        if result is None:
            raise ExecutionFailed()
        if key is not None and self.answers is not None:
            with contextlib.suppress(Exception):  # the answer is released and paid for, kept or not
                self.answers.put(key, result.rows, result.intervals, result.noise_std, result.released_groups)
        return result

    def measure(self, prepared: PreparedQuery) -> list[tuple[Any, ...]]:
        """The exact measurements per group: the bounded query's rows, each quantile's counts from its own query
        filled in. Reads the data: only after the charge (or in tests and benchmarks that stand in for it)."""
        rows = self.engine.run(prepared.bounded.sql)
        if not prepared.bounded.buckets:
            return rows
        return with_buckets(prepared.plan, rows, {read_by: self.engine.run(sql)
                                                  for read_by, sql in prepared.bounded.buckets})

    def _answer(self, prepared: PreparedQuery, spending: Spending, read_data: bool = True) -> PrivateResult:
        query_plan = prepared.plan
        rows = self.measure(prepared) if read_data else []
        cells = release(query_plan, rows, self.rng)
        final = self.post.run(query_plan.query, prepared.key_types, cells)
        answer = StoredAnswer(final.rows, final.intervals, final.stds, len(cells.keys), at="")
        return self._result(prepared, answer, query_plan.cost, spending, types=final.types)

    @staticmethod
    def _result(prepared: PreparedQuery, answer: StoredAnswer, cost: Cost, spending: Spending,
                types: list[str] | None = None) -> PrivateResult:
        query = prepared.plan.query
        kinds = types if types is not None else prepared.output_types
        columns = tuple(OutputColumn(name, kind, flag) for name, kind, flag in
                        zip(query.output_names, kinds, query.output_noisy, strict=True))
        return PrivateResult(columns, answer.rows, answer.intervals, answer.noise_std, cost, spending, prepared.plan,
                             answer.released_groups, cached_at=answer.at or None)

    def describe(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                 epsilon: float | None = None, accuracy: float | None = None,
                 quantile_intervals: bool | None = None) -> list[OutputColumn]:
        """The columns a query would release, without the data and without a charge (a wire Describe)."""
        public = self._public_sql(sql, parameters)
        if public is not None:
            names, types = self.engine.describe_public(public)
            return [OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True)]
        parsed = self._parsed(sql, parameters)
        if self._is_probe(parsed):
            names, types = self.engine.describe_declared(parsed.tree.sql(DIALECT))
            return [OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True)]
        cost = {"epsilon": epsilon, "accuracy": accuracy, "quantile_intervals": quantile_intervals}
        try:
            prepared = self.prepare(sql, parameters, **cost)
        except QueryRejected as refused:
            _, _, outer = self._released_split(parsed, refused, cost)
            return [OutputColumn(name, kind, False) for name, kind in outer.columns]
        query = prepared.plan.query
        return [OutputColumn(name, kind, noisy) for name, kind, noisy in
                zip(query.output_names, prepared.output_types, query.output_noisy, strict=True)]

    def reads_public_only(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> bool:
        """Whether `sql` reads public tables only (so costs nothing); False for a query that does not parse, which
        execute() then refuses."""
        try:
            return self._public_sql(sql, parameters) is not None
        except Error:
            return False

    def known_public_only(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> bool | None:
        """reads_public_only() if this text and these parameters were asked or described before, else None: a
        lookup, no parse (a server asks it on its event loop)."""
        found = self._public.get((sql, repr(parameters)), _UNKNOWN)
        return None if found is _UNKNOWN else found is not None

    def _public_sql(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None) -> str | None:
        """The SQL to run if the query reads public tables only (None otherwise), decided once per text: asking
        again skips the parse, as prepare() does."""
        key = (sql, repr(parameters))
        if key not in self._public:
            if len(self._public) >= _PREPARED_CACHE:
                self._public.pop(next(iter(self._public)))
            self._public[key] = public_sql(self._parsed(sql, parameters), self.policy)
        return self._public[key]

    def _parsed(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None) -> ParsedQuery:
        """The query parsed, its parameters bound, and tables named `public.t` or `<database>.public.t` read as the
        declared `t` (analysis/qualified_names.py). Cached per text, as the stages after it are."""
        key = (sql, repr(parameters))
        parsed = self._parses.get(key)
        if parsed is None:
            parsed = parse(sql, parameters)
            tree = unqualified(parsed.tree, self.database)
            parsed = parsed if tree is parsed.tree else replace(parsed, tree=tree)
            if len(self._parses) >= _PREPARED_CACHE:
                self._parses.pop(next(iter(self._parses)))
            self._parses[key] = parsed
        return parsed

    def _is_probe(self, parsed: ParsedQuery) -> bool:
        """A column probe: no row whatever the data (analysis/probes.py), answered on empty tables, for free."""
        return self.engine.answers_probes and is_probe(parsed.tree, self.policy)

    def _free_answer(self, names: Sequence[str], types: Sequence[str], rows: list[tuple[Any, ...]],
                     ) -> PrivateResult:
        columns = tuple(OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True))
        nothing = [(None,) * len(columns) for _ in rows]
        return PrivateResult(columns, rows, nothing, list(nothing), Cost(Fraction(0), Fraction(0)),
                             self.ledger.spending(self.analyst), None, len(rows))

    def _released_split(self, parsed: ParsedQuery, refused: QueryRejected,
                        cost: Mapping[str, Any]) -> tuple[Split, tuple[OutputColumn, ...], _Outer]:
        """The query as SQL over one private query's released answer (analysis/released.py), checked from the
        text before anything is charged: the private query prepares, the outer query reads only that answer and
        public tables, and runs on an empty answer of the same columns. `refused` (the pipeline's reason) if no
        reading works."""
        private_outer = False
        for split in candidates(parsed.tree, self.policy):
            if reads_private(split.outer, self.policy) or not self._reads_known(split.outer):
                private_outer = private_outer or reads_private(split.outer, self.policy)
                continue
            try:
                inner = tuple(self.describe(split.inner, None, **cost))
            except QueryRejected:
                continue
            names = [c.name for c in inner]
            if len(set(names)) != len(names):
                raise QueryRejected(f"the private query in FROM ({split.alias}) has two columns of the same name: "
                                    "name each with AS to read it in an outer query")
            vet_query(split.outer, "SQL over a released answer")
            sql = resolved_sql(split.outer, self.policy, frozenset({RELEASED}))
            empty = ReleasedTable(RELEASED, tuple((c.name, c.type) for c in inner), [])
            outer_names, outer_types, _ = self.engine.run_public(sql, [empty])  # no rows: a type check, free
            return split, inner, _Outer(sql, tuple(zip(outer_names, outer_types, strict=True)))
        if private_outer:
            raise QueryRejected(f"{refused}; nor is it SQL over a released answer: that reads one private query's "
                                "answer and public tables only (ask each private query on its own)") from None
        raise refused

    def _reads_known(self, outer: Any) -> bool:
        """Whether every table the outer query reads is the released answer, its own CTE or a public table."""
        ctes = {cte.alias_or_name.lower() for cte in outer.find_all(exp.CTE)}
        for table in outer.find_all(exp.Table):
            name = table.name
            if name == RELEASED or name.lower() in ctes:
                continue
            declared = self.policy.table(name)
            if declared is None or not declared.public or table.args.get("db") or not isinstance(
                    table.this, exp.Identifier):
                return False
        return True

    def _released_answer(self, split: Split, inner: tuple[OutputColumn, ...], outer: _Outer,
                         cost: Mapping[str, Any]) -> PrivateResult:
        """The private query answered (charged once, as itself), then the outer query over its released rows."""
        released = self.execute(split.inner, None, **cost)
        table = ReleasedTable(RELEASED, tuple((c.name, c.type) for c in inner), released.rows)
        names, types, rows = self.engine.run_public(outer.sql, [table])
        columns = tuple(OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True))
        nothing = [(None,) * len(columns) for _ in rows]
        return PrivateResult(columns, rows, nothing, list(nothing), released.cost, released.spending, released.plan,
                             released.released_groups, cached_at=released.cached_at)

    def _public_answer(self, sql: str) -> PrivateResult:
        """A query of public tables only: run as written, exact, no charge and no ledger entry."""
        return self._free_answer(*self.engine.run_public(sql))

    def spending(self, analyst: str | None = None) -> Spending:
        return self.ledger.spending(analyst)

    def history(self, analyst: str | None = None) -> list[Charge]:
        return self.ledger.history(analyst)

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()
        self.post.close()
        self.ledger.close()

    def _budget(self, epsilon: float | None, quantile_intervals: bool | None = None) -> Budget:
        budget = self.policy.budget
        chosen = epsilon if epsilon is not None else self.default_epsilon
        value = _epsilon(chosen if chosen is not None else budget.query_epsilon)
        if value > exact(budget.epsilon):
            raise ProgrammingError(f"epsilon {float(value):g} is more than the whole budget ({budget.epsilon:g})")
        intervals = self.quantile_intervals if quantile_intervals is None else quantile_intervals
        return Budget(value, exact(budget.query_delta), budget.accounting, budget.mechanism, bool(intervals))


def build_engine(policy: Policy, *, bounding_seed: int | None = None, threads: int | None = None,
                 progress: Progress = SILENT) -> Engine:
    """The engine the policy's `[engine] kind` names, telling `progress` of each long step of its load (the DuckDB
    engine; Spark logs its own). Spark is imported only when asked for: it is optional."""
    if policy.engine.kind == "spark":
        from dpsql.engines.spark_engine import SparkEngine

        return SparkEngine(policy, bounding_seed=bounding_seed)
    return DuckDBEngine(policy, bounding_seed=bounding_seed, threads=threads, progress=progress)


def _epsilon(value: Any) -> Fraction:
    """The core takes numbers only: text is parsed by the front end that read it (the CLI's EpsilonType)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise DataError(f"epsilon must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise DataError(f"epsilon must be a finite number > 0, got {shown(value)}")
    if number < _MIN_EPSILON:
        raise DataError(f"epsilon {shown(value)} is below {_MIN_EPSILON:g}: the noise would drown any answer")
    return exact(value)


def _default_analyst() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "analyst"


__all__ = ["MechanismKind", "OutputColumn", "PreparedQuery", "PrivateResult", "PrivateSession"]

"""The pipeline, stage after stage: parse, check, plan, rewrite, dry-run, charge, execute, noise, post-process.

The order is the privacy argument. Everything up to the dry run reads only the SQL, the policy and the schema,
so a rejection costs nothing and says nothing about the data. The charge is committed to the ledger before the
data is touched, so no answer (and no failure that could depend on the data) is ever released unpaid.
"""

from __future__ import annotations

import contextlib
import getpass
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlglot import exp

from dpsql.analysis.check import check
from dpsql.analysis.normalize import normalize
from dpsql.analysis.plan_once import opaque_positions, parameters_class, shadow_parameters, value_of
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
from dpsql.planning.reuse import Grouping, grouping_of
from dpsql.planning.spending import Choice, Requirement, as_accurate_as, choose, targets_of
from dpsql.planning.targets import accuracy_of, sized_in_two_stages, targets, two_stages
from dpsql.policy import Accounting, MechanismKind, Policy, load_policy
from dpsql.release.cells import MeasuredCells, release, release_combined, release_no_groups, with_buckets
from dpsql.release.postprocess import PostProcessor
from dpsql.rewrite.identity import relation_identity
from dpsql.rewrite.passes import BoundedQuery, rewrite
from dpsql.sql.names import RELEASED
from dpsql.sql.parameter_marks import MARK, MarkedDuckDB, bound_literals, filled, identical, rendered, substituted
from dpsql.sql.parse import DIALECT, PARAMETER_LABEL, ParsedQuery, parameters_text, parse
from dpsql.store.answers import AnswerStore, StoredAnswer, answer_key
from dpsql.store.ledger import BudgetLedger, Charge, Spending, exact
from dpsql.store.measurements import MeasurementStore, NewMeasurement, relation_key

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
    charge: int | None = None  # the ledger entry of this answer (its cost, maybe 0, and its note)
    # What released measurements it was derived from (planning/reuse.py), and its note: "derived from released
    # measurements, no charge", or the reduced charge; empty when it was measured as on its own.
    derived_from: tuple[str, ...] = ()
    note: str | None = None


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
    # With a measurement store: the query's groups and its relation's key (store/measurements.relation_key), when its
    # measurements can be stored and derived (public groups: planning/reuse.grouping_of); None otherwise.
    grouping: Grouping | None = None
    relation: str | None = None
    asked: Mapping[int, float] = field(default_factory=dict)  # with an accuracy: each aggregate's target half-width


@dataclass(frozen=True)
class _Template:
    """A statement planned once for values of given classes (session._learn): its plan for the first values, and its
    bounded SQL and canonical text with each parameter's literal marked (sql/parameter_marks.py)."""

    prepared: PreparedQuery
    sql: str
    buckets: tuple[tuple[tuple[int, ...], str], ...]
    canonical: str
    labels: tuple[str, ...]  # the parameters' labels (sql/parse.PARAMETER_LABEL)

    def prepared_for(self, parameters: Sequence[Any] | Mapping[str, Any],
                     relation: Callable[[QueryPlan], tuple[Grouping | None, str | None]]) -> PreparedQuery:
        """The plan for these values: each one bound as parse binds it, put where the first values stood. The
        relation's key is made again from the plan (its conditions are ordered by their text)."""
        nodes = bound_literals({label: value_of(label, parameters) for label in self.labels})
        texts = rendered(nodes)
        query_plan = substituted(self.prepared.plan, nodes)
        bounded = replace(self.prepared.bounded, sql=filled(self.sql, texts),
                          buckets=tuple((indices, filled(sql, texts)) for indices, sql in self.buckets))
        grouping, key = relation(query_plan)
        return replace(self.prepared, plan=query_plan, bounded=bounded, canonical=filled(self.canonical, texts),
                       grouping=grouping, relation=key)


class PrivateSession:
    """One analyst's access to the tables of one policy. Not thread-safe: use one per thread."""

    def __init__(self, policy: Policy | str | Path, analyst: str | None = None, *,
                 epsilon: float | None = None, rng: RandomSource | None = None,
                 bounding_seed: int | None = None, threads: int | None = None, create_ledger: bool = False,
                 engine: Engine | None = None, answers: AnswerStore | None = None,
                 quantile_intervals: bool = True, database: str | None = None, reuse: bool = False,
                 measurements: MeasurementStore | None = None, share_measurements: bool | None = None,
                 plan_once: bool = True) -> None:
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
        # Released measurements, from which later answers are derived (planning/reuse.py); None: every answer is
        # measured on its own, as the library does unless asked (`reuse=True`: the policy's store, [reuse]
        # measurements; or a store given, as the server shares one). Whose measurements an analyst's answers may
        # use: their own, unless the policy shares them ([reuse] shared).
        self._owns_measurements = measurements is None and reuse
        if self._owns_measurements:
            measurements = measurement_store(self.policy, self.engine)
        self.measurements = measurements
        self.share_measurements = self.policy.share_measurements if share_measurements is None else share_measurements
        self._prepared: dict[tuple, PreparedQuery] = {}
        self._public: dict[tuple, str | None] = {}
        self._parses: dict[tuple, ParsedQuery] = {}
        # Plan once (analysis/plan_once.py): per statement and classes of parameter values, the template its plan
        # for new values is filled in from, or None where the full path runs each time; this analyst's only.
        self.plan_once = plan_once
        self._templates: dict[tuple, _Template | None] = {}
        self._first: dict[tuple, tuple[ParsedQuery, PreparedQuery, Any]] = {}  # the first values, to check with
        self._private_shapes: dict[tuple, None] = {}  # the (SQL, classes) with a template: not public, no probe

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
        asked_accuracy = accuracy_of(accuracy) if accuracy is not None else None
        key = (sql, parameters_text(parameters), budget, str(asked_accuracy) if asked_accuracy is not None else None)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._planned_once(sql, parameters, epsilon, accuracy, quantile_intervals)
        if prepared is None:
            parsed = self._parsed(sql, parameters)
            prepared = self._planned(parsed, budget, asked_accuracy)
            if asked_accuracy is None:
                self._learn(sql, parameters, budget, parsed, prepared)
        if key not in self._prepared:
            _bounded_put(self._prepared, key, prepared)
        return prepared

    def _planned(self, parsed: ParsedQuery, budget: Budget, asked_accuracy: Fraction | None) -> PreparedQuery:
        """The full path: check, plan, rewrite, dry run and rehearsal of the parsed query."""
        canonical = parsed.tree.sql(DIALECT, comments=False)
        facts = self.engine.public_facts()
        checked = check(normalize(parsed, self.policy, facts), self.policy, VOCABULARY, facts)
        asked = targets(checked, asked_accuracy) if asked_accuracy is not None else {}
        if asked_accuracy is not None:
            budget = budget_for_accuracy(checked, asked, budget, exact(self.policy.budget.epsilon), plan)
        query_plan = plan(checked, budget)
        bounded = rewrite(query_plan, listed=self.engine.lists_earlier_rows)
        key_types = self.engine.dry_run(bounded.sql)[:bounded.key_count]
        for _, sql in bounded.buckets:
            self.engine.dry_run(sql)
        grouping, relation = self._relation(query_plan)
        if asked_accuracy is not None:
            canonical += f" -- accuracy {asked_accuracy}"  # another answer than at the epsilon it may share
        return PreparedQuery(query_plan, bounded, key_types, self._rehearse(query_plan, key_types), canonical,
                             grouping, relation, asked)

    def _planned_once(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None,
                      epsilon: float | None = None, accuracy: float | None = None,
                      quantile_intervals: bool | None = None) -> PreparedQuery | None:
        """The statement's plan for these parameters from its template (planned once for values of their classes,
        and checked: `_learn`), if it has one: no parse, check, plan, rewrite nor dry run. None otherwise (the full
        path). Whether there is one depends on the SQL, the classes of the values and the budget only."""
        if not self.plan_once or accuracy is not None:
            return None
        shape = parameters_class(parameters)
        if shape is None or (sql, shape) not in self._private_shapes:
            return None
        template = self._templates.get((sql, shape, self._budget(epsilon, quantile_intervals)))
        if template is None:
            return None
        return template.prepared_for(parameters, self._relation_made)  # type: ignore[arg-type]

    def _relation_made(self, query_plan: QueryPlan) -> tuple[Grouping | None, str | None]:
        """_relation() for a plan filled in. The relation's key is read only to store and derive measurements:
        without a store it is not made (it is rendered SQL, half the work left per query), as for a query whose
        measurements cannot be stored."""
        return self._relation(query_plan) if self.measurements is not None else (grouping_of(query_plan.query), None)

    def _as_planned_once(self, prepared: PreparedQuery) -> PreparedQuery:
        """The full path's plan as plan once makes it (_relation_made): what a template's check compares with."""
        return prepared if self.measurements is not None else replace(prepared, relation=None)

    def _learn(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None, budget: Budget,
               parsed: ParsedQuery, prepared: PreparedQuery) -> None:
        """Make the statement's template for values of these parameters' classes, if it may have one
        (analysis/plan_once.py: numbers, compared with private columns in the WHERE) and if it passes the check.

        The template is made from the first values' plan and checked on the next values of the same classes, once
        the full path has planned them too (to answer them): filled in with either, it must give exactly the full
        path's plan. Every parameter must differ between the two, so that each one's substitution is checked; when
        one is the same, a second value is made up for the check (analysis/plan_once.shadow_parameters) and planned
        on the full path besides. A statement that fails keeps the full path for these classes."""
        shape = parameters_class(parameters) if self.plan_once else None
        key = (sql, shape, budget)
        if shape is None or parameters is None or key in self._templates:
            return
        first = self._first.pop(key, None)
        if first is None:
            if MARK not in sql and self._plain(parsed) and opaque_positions(parsed.tree, self.policy):
                _bounded_put(self._first, key, (parsed, prepared, parameters))
            else:
                _bounded_put(self._templates, key, None)
            return
        first_parsed, first_prepared, first_parameters = first
        template = self._template(first_parsed, first_prepared)
        try:
            second = (parameters, prepared, parsed) if _all_differ(template.labels, first_parameters, parameters) \
                else self._shadow(sql, first_parameters, budget)
            proven = second is not None and self._plain(second[2]) and all(
                identical(template.prepared_for(values, self._relation_made), self._as_planned_once(expected))
                for values, expected in ((first_parameters, first_prepared), second[:2]))
        except Error:  # the shadow value refused: its plan depends on its value
            proven = False
        _bounded_put(self._templates, key, template if proven else None)
        if proven:
            _bounded_put(self._private_shapes, (sql, shape), None)

    def _template(self, parsed: ParsedQuery, prepared: PreparedQuery) -> _Template:
        """The template of a statement's plan: the plan, its bounded SQL and canonical text with the parameters
        marked."""
        marked = rewrite(prepared.plan, dialect=MarkedDuckDB, listed=self.engine.lists_earlier_rows)  # type: ignore
        labels = tuple(dict.fromkeys(node.meta[PARAMETER_LABEL] for node in parsed.tree.walk()
                                     if PARAMETER_LABEL in node.meta))
        return _Template(prepared, marked.sql, marked.buckets, parsed.tree.sql(MarkedDuckDB, comments=False),
                         labels)

    def _shadow(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any], budget: Budget,
                ) -> tuple[Sequence[Any] | Mapping[str, Any], PreparedQuery, ParsedQuery] | None:
        """Other values of the same classes, their plan on the full path, and their parsed query."""
        shadow = shadow_parameters(parameters)
        if shadow is None:
            return None
        parsed = self._parsed(sql, shadow, cache=False)
        return shadow, self._planned(parsed, budget, None), parsed

    def _plain(self, parsed: ParsedQuery) -> bool:
        """A query of private data answered by its plan: not public tables only, not a probe."""
        return public_sql(parsed.tree, self.policy) is None and not self._is_probe(parsed)

    def _relation(self, query_plan: QueryPlan) -> tuple[Grouping | None, str | None]:
        """The query's groups and its relation's key in the measurement store, when its measurements can be stored
        and derived (public groups, no grouping sets)."""
        grouping = grouping_of(query_plan.query)
        if grouping is None:
            return None, None
        identity = relation_identity(query_plan, self.engine.lists_earlier_rows)
        return grouping, relation_key(self.engine.data_version, self.engine.ranking, identity)

    def plan_for(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                 epsilon: float | None = None, accuracy: float | None = None,
                 quantile_intervals: bool | None = None) -> QueryPlan:
        """The plan the query would run now: with released measurements at hand, the way that derives from them
        (its cost maybe reduced or nothing; QueryPlan.combination says how), else the plan as on its own. For
        explain: reads no data and spends nothing."""
        prepared = self.prepare(sql, parameters, epsilon=epsilon, accuracy=accuracy,
                                quantile_intervals=quantile_intervals)
        choice = self._reuse(prepared) if not sized_in_two_stages(prepared.plan.query, prepared.asked) else None
        return choice.plan if choice is not None else prepared.plan

    def _reuse(self, prepared: PreparedQuery, store: MeasurementStore | None = None,
               requirements: Sequence[Requirement] | None = None, ceiling: Fraction | None = None) -> Choice | None:
        """How released measurements can stand in for the query's (planning/spending.py), if that costs less (than
        the query on its own, or `ceiling`)."""
        store = store if store is not None else self.measurements
        if store is None or prepared.relation is None or prepared.grouping is None or not prepared.plan.measurements:
            return None
        stored = store.candidates(prepared.relation, self.analyst, self.share_measurements)
        if not stored:
            return None
        return choose(prepared.plan, stored, prepared.grouping,
                      requirements if requirements is not None else _requirements(prepared.plan, prepared.asked),
                      ceiling)

    def _keep(self, prepared: PreparedQuery, query_plan: QueryPlan, measured: Sequence[MeasuredCells | None],
              charge: int | None, store: MeasurementStore | None = None) -> None:
        """Store the measurements just released (their charge committed), for later answers to derive from."""
        store = store if store is not None else self.measurements
        if store is None or prepared.relation is None or prepared.grouping is None or not measured:
            return
        found = []
        for m, target, cells in zip(query_plan.measurements, targets_of(query_plan), measured, strict=True):
            if cells is not None and target is not None:
                found.append(NewMeasurement(m.spec.label, target, prepared.grouping, m.mechanism, m.spec.step, cells))
        with contextlib.suppress(Exception):  # released and paid for, kept or not
            store.put(prepared.relation, self.analyst, charge, found)

    def _rehearse(self, query_plan: QueryPlan, key_types: list[str]) -> list[str]:
        """Run the stages after the charge on no groups at all: whatever fails whatever the data (an interval's
        arithmetic, a type error in ORDER BY) fails here, before the charge, and costs nothing. Returns the
        output's column types, which need neither the data nor the budget."""
        return self.post.run(query_plan.query, key_types, release_no_groups(query_plan)).types

    def execute(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None, *,
                epsilon: float | None = None, accuracy: float | None = None,
                quantile_intervals: bool | None = None) -> PrivateResult:
        cost = {"epsilon": epsilon, "accuracy": accuracy, "quantile_intervals": quantile_intervals}
        prepared = self._planned_once(sql, parameters, **cost)
        if prepared is None:
            public = self._public_sql(sql, parameters)
            if public is not None:
                return self._public_answer(public)
            parsed = self._parsed(sql, parameters)
            if self._is_probe(parsed):
                names, types = self.engine.describe_declared(parsed.tree.sql(DIALECT))
                return self._free_answer(names, types, [])
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
            return self._answer(prepared, self.ledger.spending(self.analyst), read_data=False)[0]
        if sized_in_two_stages(query_plan.query, prepared.asked):
            result = self._sized(prepared, sql)
        else:
            result = self._charged(prepared, sql, self._reuse(prepared))
        if key is not None and self.answers is not None:
            with contextlib.suppress(Exception):  # the answer is released and paid for, kept or not
                self.answers.put(key, result.rows, result.intervals, result.noise_std, result.released_groups)
        return result

    def _charged(self, prepared: PreparedQuery, sql: str, choice: Choice | None,
                 store: MeasurementStore | None = None, note: str | None = None) -> PrivateResult:
        """Charge, run, release and keep the query: as planned on its own, or as `choice` derives it from released
        measurements (planning/spending.py: decided from the plans and the laws of the released noise, before the
        charge and without the data; what is measured now runs as its own bounded query, dry-run here like any)."""
        run = choice.plan if choice is not None else prepared.plan
        now = None
        if choice is not None and choice.combination.measured:
            now = rewrite(replace(run, measurements=tuple(run.measurements[j] for j in choice.combination.measured)),
                          listed=self.engine.lists_earlier_rows).sql
            self.engine.dry_run(now)
        note = note or _note(choice, prepared.plan)
        # Refused or written here, before the data is read; the commit's fsync runs while the data is read, and
        # nothing is released (nor stored) before `wait` says the charge is on disk. A commit that fails raises
        # LedgerError there, and the answer is dropped.
        pending = self.ledger.begin_charge(self.analyst, run.cost, sql, note=note)
        # Everything after the charge touched the data, so whether it fails, and how, could depend on one row: any
        # exception (an engine error, the time limit, a conversion, two groups merging, a bug in release or
        # post-processing) becomes the one generic error. It is raised once the exception is suppressed, so that
        # not even its __context__ keeps the original exception, whose message might quote a value.
        answered = None
        try:
            with contextlib.suppress(Exception):
                answered = self._answer(prepared, pending.spending, run=run, now=now)
        finally:
            pending.wait()
        if answered is None:
            raise ExecutionFailed()
        result, measured = answered
        self._keep(prepared, run, measured, pending.charge, store)
        derived = tuple(s.name for s in choice.combination.used() if s.stored is not None) if choice else ()
        return replace(result, charge=pending.charge, derived_from=derived, note=note)

    def _sized(self, prepared: PreparedQuery, sql: str) -> PrivateResult:
        """A query with an accuracy for AVG, VAR or STDDEV, in two stages (planning/targets.py): the counts they
        divide by first, measured as a default query would (or estimated from released ones as good), then the
        rest at the least epsilon that meets every target when each count is at its lower 95% bound. Both charged:
        the second stage's epsilon depends on the first's noisy counts, which is post-processing of a release
        already paid for (a privacy filter: the ledger refuses what the budget cannot take)."""
        if prepared.grouping is None or prepared.relation is None:
            raise QueryRejected("an accuracy for AVG, VAR or STDDEV needs declared values for every group key (and no "
                                "grouping sets): the counts of groups chosen by partition selection cannot size it")
        store = self.measurements if self.measurements is not None else \
            MeasurementStore(None, self.engine.data_version)  # the first stage's counts must reach the second
        staged = two_stages(prepared.plan, prepared.asked, replace(prepared.plan.budget, epsilon=_epsilon(
            self.default_epsilon if self.default_epsilon is not None else self.policy.budget.query_epsilon)))
        counts, epsilon = staged.first_stage(store.candidates(prepared.relation, self.analyst,
                                                              self.share_measurements), prepared.grouping)
        costs = []
        if counts:
            first = replace(staged.reference, measurements=tuple(counts[j] for j in sorted(counts)), recipes=(),
                            cost=Cost(epsilon, Fraction(0)), output_weights=(), combination=None)
            costs.append(self._measured_only(prepared, sql, first, store, staged.first_note))
        stored = store.candidates(prepared.relation, self.analyst, self.share_measurements)
        requirements = staged.second_requirements(stored, prepared.grouping)
        left = exact(self.ledger.spending(self.analyst).epsilon_remaining)
        second = self._reuse(prepared, store, requirements, left) if left > 0 else None
        if second is None:
            charged = "the counts' charge stays, and they are kept for reuse" if costs else "nothing was charged"
            raise ProgrammingError(f"{staged.asked_text}: the counts say the smallest group has about "
                                   f"{staged.smallest(stored, prepared.grouping):.4g} rows, too few for that accuracy "
                                   f"within the epsilon left ({float(left):g}); {charged}. Ask with a wider "
                                   "accuracy, of larger groups, or with an epsilon")
        note = staged.second_note if second.cost.epsilon else None
        result = self._charged(prepared, sql, second, store, note)
        costs.append(result.cost)
        notes = [staged.first_note] if len(costs) > 1 else []
        return replace(result, cost=_total(costs, self.policy.budget.accounting),
                       note="; ".join([*notes, result.note or "derived from released measurements, no charge"]))

    def _measured_only(self, prepared: PreparedQuery, sql: str, query_plan: QueryPlan, store: MeasurementStore,
                       note: str) -> Cost:
        """Charge, measure and keep `query_plan`'s measurements, releasing no output (a first stage: its counts
        are stored for the second stage, and any later answer, to derive from)."""
        now = rewrite(query_plan, listed=self.engine.lists_earlier_rows).sql
        self.engine.dry_run(now)
        pending = self.ledger.begin_charge(self.analyst, query_plan.cost, sql, note=note)
        measured = None
        try:
            with contextlib.suppress(Exception):  # after the charge: one generic error whatever happened
                measured = release(query_plan, self.engine.run(now), self.rng, prepared.grouping).measured
        finally:
            pending.wait()
        if measured is None:
            raise ExecutionFailed()
        self._keep(prepared, query_plan, measured, pending.charge, store)
        return query_plan.cost

    def measure(self, prepared: PreparedQuery) -> list[tuple[Any, ...]]:
        """The exact measurements per group: the bounded query's rows, each quantile's counts from its own query
        filled in. Reads the data: only after the charge (or in tests and benchmarks that stand in for it)."""
        rows = self.engine.run(prepared.bounded.sql)
        if not prepared.bounded.buckets:
            return rows
        return with_buckets(prepared.plan, rows, {read_by: self.engine.run(sql)
                                                  for read_by, sql in prepared.bounded.buckets})

    def _answer(self, prepared: PreparedQuery, spending: Spending, read_data: bool = True,
                run: QueryPlan | None = None, now: str | None = None,
                ) -> tuple[PrivateResult, tuple[MeasuredCells | None, ...]]:
        """The answer, and the measurements it released (to store). `run`: the plan to answer with, when it derives
        from released measurements (`now`: the SQL of those measured now, None if none is)."""
        query_plan = run if run is not None else prepared.plan
        if query_plan.combination is not None:
            rows = self.engine.run(now) if now is not None else []
            cells = release_combined(query_plan, query_plan.combination, rows, self.rng, prepared.grouping)
        else:
            rows = self.measure(prepared) if read_data else []
            cells = release(query_plan, rows, self.rng, prepared.grouping)
        final = self.post.run(query_plan.query, prepared.key_types, cells)
        answer = StoredAnswer(final.rows, final.intervals, final.stds, len(cells.keys), at="")
        return self._result(prepared, answer, query_plan.cost, spending, types=final.types), cells.measured

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
        cost = {"epsilon": epsilon, "accuracy": accuracy, "quantile_intervals": quantile_intervals}
        once = self._planned_once(sql, parameters, **cost)
        if once is not None:
            return self._columns(once)
        public = self._public_sql(sql, parameters)
        if public is not None:
            names, types = self.engine.describe_public(public)
            return [OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True)]
        parsed = self._parsed(sql, parameters)
        if self._is_probe(parsed):
            names, types = self.engine.describe_declared(parsed.tree.sql(DIALECT))
            return [OutputColumn(name, kind, False) for name, kind in zip(names, types, strict=True)]
        try:
            prepared = self.prepare(sql, parameters, **cost)
        except QueryRejected as refused:
            _, _, outer = self._released_split(parsed, refused, cost)
            return [OutputColumn(name, kind, False) for name, kind in outer.columns]
        return self._columns(prepared)

    @staticmethod
    def _columns(prepared: PreparedQuery) -> list[OutputColumn]:
        query = prepared.plan.query
        return [OutputColumn(name, kind, noisy) for name, kind, noisy in
                zip(query.output_names, prepared.output_types, query.output_noisy, strict=True)]

    def reads_public_only(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> bool:
        """Whether `sql` reads public tables only (so costs nothing); False for a query that does not parse, which
        execute() then refuses."""
        if self._known_private(sql, parameters):
            return False
        try:
            return self._public_sql(sql, parameters) is not None
        except Error:
            return False

    def known_public_only(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None = None) -> bool | None:
        """reads_public_only() if this text and these parameters were asked or described before, else None: a
        lookup, no parse (a server asks it on its event loop)."""
        if self._known_private(sql, parameters):
            return False
        try:
            found = self._public.get((sql, parameters_text(parameters)), _UNKNOWN)
        except DataError:  # refused when asked
            return None
        return None if found is _UNKNOWN else found is not None

    def _known_private(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None) -> bool:
        """Whether the statement has a template for values of these parameters' classes: it reads private data."""
        if not self._private_shapes:
            return False
        shape = parameters_class(parameters)
        return shape is not None and (sql, shape) in self._private_shapes

    def _public_sql(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None) -> str | None:
        """The SQL to run if the query reads public tables only (None otherwise), decided once per text: asking
        again skips the parse, as prepare() does."""
        key = (sql, parameters_text(parameters))
        if key not in self._public:
            _bounded_put(self._public, key, public_sql(self._parsed(sql, parameters).tree, self.policy))
        return self._public[key]

    def _parsed(self, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None,
                cache: bool = True) -> ParsedQuery:
        """The query parsed, its parameters bound, and tables named `public.t` or `<database>.public.t` read as the
        declared `t` (analysis/qualified_names.py). Cached per text, as the stages after it are."""
        key = (sql, parameters_text(parameters))
        parsed = self._parses.get(key)
        if parsed is None:
            parsed = parse(sql, parameters)
            tree = unqualified(parsed.tree, self.database)
            parsed = parsed if tree is parsed.tree else replace(parsed, tree=tree)
            if not cache:
                return parsed
            _bounded_put(self._parses, key, parsed)
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
        if self._owns_measurements and self.measurements is not None:
            self.measurements.close()
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


def measurement_store(policy: Policy, engine: Engine) -> MeasurementStore | None:
    """The policy's measurement store for answers from this engine ([reuse] measurements): in memory when the engine's
    ranking of each person's rows is its own (a fresh secret salt: no other engine caps the same rows), None when the
    policy keeps none."""
    if policy.measurements is None:
        return None
    return MeasurementStore(policy.measurements if engine.ranking_persistent else None, engine.data_version)


def _bounded_put(cache: dict, key: Any, value: Any) -> None:
    """Put `key` in a cache of the session's, dropping its oldest entry when full."""
    if key not in cache and len(cache) >= _PREPARED_CACHE:
        cache.pop(next(iter(cache)))
    cache[key] = value


def _all_differ(labels: Sequence[str], first: Sequence[Any] | Mapping[str, Any],
                second: Sequence[Any] | Mapping[str, Any]) -> bool:
    """Whether every parameter's literal differs between two sets of values (so a check with both sees each one
    substituted)."""
    one = rendered(bound_literals({label: value_of(label, first) for label in labels}))
    other = rendered(bound_literals({label: value_of(label, second) for label in labels}))
    return all(one[label] != other[label] for label in labels)


def _requirements(query_plan: QueryPlan, asked: Mapping[int, float]) -> list[Requirement]:
    """What each output must reach: the asked half-width, or else what it gets on its own at the query's epsilon."""
    alone = as_accurate_as(query_plan)
    return [Requirement(width=asked[i]) if i in asked else alone[i] for i in range(len(query_plan.recipes))]


def _total(costs: Sequence[Cost], accounting: Accounting) -> Cost:
    """What several charges of one answer cost together: epsilons add (pure), or rho does (zCDP)."""
    delta = sum((c.delta for c in costs), Fraction(0))
    if accounting is Accounting.PURE:
        return Cost(sum((c.epsilon for c in costs), Fraction(0)), delta)
    rho = sum((c.rho for c in costs), Fraction(0))
    return Cost(Fraction(math.sqrt(2 * rho)), delta)


def _note(choice: Choice | None, alone: QueryPlan) -> str | None:
    """The ledger's note of an answer derived from released measurements."""
    if choice is None:
        return None
    if not choice.cost.epsilon:
        return "derived from released measurements, no charge"
    return (f"reusing released measurements: epsilon {float(choice.cost.epsilon):g} instead of "
            f"{float(alone.cost.epsilon):g}")


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

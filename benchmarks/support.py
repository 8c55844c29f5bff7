"""Helpers shared by the tests and the benchmarks: data files, policies, ledgers and seeded sessions.

They live here, not in tests/, because the arrow already points from tests to benchmarks (tests/attacks/ runs
the attack code at CI sizes) and the benchmarks run on their own as `python -m benchmarks...`, where the test
suite is no dependency. One module serves both, so a policy is written the same way everywhere.

Two ways to declare a table: `write_policy` takes plain dicts, as a policy file reads; `write_dataset` takes a
`Table` of dpsql's own ColumnPolicy declarations and writes its rows beside the policy.

The SQL dpsql runs is inspected as a parsed tree (`sql_tree`, `caps_rows`, `clamps`), not as text, so that a
change in how sqlglot prints it breaks no test while a change in what runs does.

Randomness: `seeded(n)` is dpsql's insecure generator for tests, so runs repeat exactly; it protects no one.
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.engines.base import Engine
from dpsql.frontends.server.server import DpsqlServer, ServerConfig
from dpsql.policy import ColumnPolicy, ColumnType, load_policy
from dpsql.session import PrivateSession
from dpsql.sql.parse import DIALECT
from dpsql.store.ledger import BudgetLedger


def seeded(seed: int) -> InsecureSeededRandomForTests:
    return InsecureSeededRandomForTests(seed)


def toml_value(value: Any) -> str:
    """A TOML inline value. Floats go through repr, which round-trips every double and writes inf and nan as TOML
    does; strings through JSON, whose escapes are valid in TOML basic strings (except a raw DEL, escaped here)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value)).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def csv_cell(value: Any) -> Any:
    """How a Python value is written to a data file: NULL as an empty field, booleans as DuckDB spells them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else value  # repr round-trips every double, inf and nan


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows([csv_cell(v) for v in row] for row in rows)
    return path


def write_policy(path: Path, tables: dict[str, dict[str, Any]], budget: dict[str, Any] | None = None) -> Path:
    """A policy TOML: `tables` maps a name to its keys, with `columns` mapping column names to inline tables.
    Its ledger is not created: pass create_ledger=True to the session that acts as the steward, or call
    create_ledger."""
    budget = {"epsilon": 100.0, "delta": 1e-6, "query_epsilon": 1.0, **(budget or {})}
    lines = ["[budget]", *(f"{k} = {toml_value(v)}" for k, v in budget.items())]
    for name, spec in tables.items():
        lines += ["", f"[tables.{name}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in spec.items() if k != "columns"]
        lines += ["", f"[tables.{name}.columns]"]
        lines += [f"{col} = {toml_value(c)}" for col, c in spec["columns"].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def create_ledger(policy: Path) -> Path:
    """The steward's one-time step (`dpsql budget --init`): create the policy's ledger before analysts use it."""
    loaded = load_policy(policy)
    BudgetLedger(loaded.budget.ledger, loaded.budget, create=True).close()
    return policy


def column(name: str, type: str, lower: float | None = None, upper: float | None = None,
           values: tuple[Any, ...] | None = None, nullable: bool = True) -> ColumnPolicy:
    """A column declaration, as dpsql's own ColumnPolicy."""
    return ColumnPolicy(name, ColumnType(type), lower, upper, values, nullable)


def column_keys(column: ColumnPolicy) -> dict[str, Any]:
    """A ColumnPolicy as the keys of its inline table in a policy file."""
    keys: dict[str, Any] = {"type": column.type.value}
    if column.lower is not None:
        keys |= {"lower": column.lower, "upper": column.upper}
    if column.values is not None:
        keys["values"] = list(column.values)
    if not column.nullable:
        keys["nullable"] = False
    return keys


@dataclass(frozen=True)
class Table:
    name: str
    unit: str  # the privacy unit column ("" for a public table)
    columns: tuple[ColumnPolicy, ...]
    max_rows: int = 1
    public: bool = False

    @property
    def header(self) -> list[str]:
        return [c.name for c in self.columns]

    def declaration(self) -> dict[str, Any]:
        """The table's keys in a policy file, its data in `<name>.csv` beside it."""
        columns = {"columns": {c.name: column_keys(c) for c in self.columns}}
        if self.public:
            return {"source": f"{self.name}.csv", "public": True, **columns}
        return {"source": f"{self.name}.csv", "privacy_unit": self.unit, "max_rows_per_unit": self.max_rows, **columns}


@dataclass(frozen=True)
class Budget:
    epsilon: float = 1000.0
    delta: float = 1e-6
    query_epsilon: float = 1.0
    query_delta: float = 1e-8
    accounting: str = "pure"
    mechanism: str = "laplace"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"ledger": "elsewhere/ledger.sqlite"}

    def keys(self) -> dict[str, Any]:
        return {"epsilon": self.epsilon, "delta": self.delta, "query_epsilon": self.query_epsilon,
                "query_delta": self.query_delta, "accounting": self.accounting, "mechanism": self.mechanism,
                **self.extra}


DEFAULT_BUDGET = Budget()
GAUSSIAN = Budget(accounting="zcdp", mechanism="gaussian")


def write_dataset(folder: Path, table: Table, rows: Iterable[Sequence[Any]], budget: Budget = DEFAULT_BUDGET) -> Path:
    """Write `rows` and the policy declaring them into `folder` (created); return the policy's path."""
    return write_datasets(folder, {table: rows}, budget)


def write_datasets(folder: Path, tables: Mapping[Table, Iterable[Sequence[Any]]],
                   budget: Budget = DEFAULT_BUDGET) -> Path:
    """Write each table's rows and one policy declaring them all into `folder` (created); return the policy's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for table, rows in tables.items():
        write_csv(folder / f"{table.name}.csv", table.header, rows)
    return write_policy(folder / "policy.toml", {table.name: table.declaration() for table in tables},
                        budget.keys())


SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
DEPARTMENTS = ("cardiology", "dermatology", "emergency", "general", "neurology", "oncology", "orthopedics",
               "pediatrics")


def write_hospital(folder: Path, seed: int = 36) -> Path:
    """The sample visits data and policy, with two more tables (issue 36's corpus had them): `labs`, a second private
    table of the same unit (a patient's lab tests, dated, at most 4 count), and `staff`, a public table whose key
    `department` is not unique (several staff per department). Returns the policy's path; the ledger is created."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in SAMPLE.iterdir():
        if path.suffix in (".csv", ".toml"):
            (folder / path.name).write_bytes(path.read_bytes())
    r = random.Random(seed)
    with (SAMPLE / "visits.csv").open() as handle:
        visits = list(csv.DictReader(handle))
    labs = [(v["patient_id"], v["visit_date"], r.choice(["hb", "glucose", "ldl"]), round(r.uniform(0, 200), 1))
            for v in visits if r.random() < 0.5]
    write_csv(folder / "labs.csv", ["patient_id", "lab_date", "test", "value"], labs)
    staff = [(d, r.choice(["nurse", "doctor"]), f"{d}{i}") for d in DEPARTMENTS for i in range(r.randint(1, 4))]
    write_csv(folder / "staff.csv", ["department", "role", "name"], staff)
    with (folder / "visits.toml").open("a") as policy:
        policy.write('\n[tables.labs]\nsource = "labs.csv"\nprivacy_unit = "patient_id"\nunit = "patient"\n'
                     'max_rows_per_unit = 4\n\n[tables.labs.columns]\npatient_id = { type = "int" }\n'
                     'lab_date = { type = "date" }\ntest = { type = "text", values = ["hb", "glucose", "ldl"] }\n'
                     'value = { type = "float", lower = 0, upper = 200 }\n\n'
                     '[tables.staff]\nsource = "staff.csv"\npublic = true\n\n[tables.staff.columns]\n'
                     'department = { type = "text" }\nrole = { type = "text" }\nname = { type = "text" }\n')
    return create_ledger(folder / "visits.toml")


def open_session(policy: Path, seed: int, analyst: str = "attacker", *, bounding_seed: int | None = None,
                 **options: Any) -> PrivateSession:
    """A session whose noise comes from dpsql's seeded test generator (repeatable, protects no one) and whose row
    choice is seeded too (by `seed` unless `bounding_seed` is given). Acting as the steward as well, it creates the
    policy's ledger on first use. `options` go to PrivateSession (threads, ...)."""
    row_seed = seed if bounding_seed is None else bounding_seed
    return PrivateSession(policy, analyst, rng=seeded(seed), bounding_seed=row_seed, create_ledger=True, **options)


def sql_tree(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read=DIALECT)


def number(node: exp.Expression) -> float | None:
    """The value of a numeric literal, negated ones included; None for anything else."""
    if isinstance(node, exp.Neg):
        inner = number(node.this)
        return None if inner is None else -inner
    return float(node.this) if isinstance(node, exp.Literal) and not node.is_string else None


def caps_rows(tree: exp.Expression, column: str, limit: int) -> bool:
    """Whether the tree compares `column <= limit` somewhere (how a rank or a row count is capped)."""
    return any(isinstance(n.this, exp.Column) and n.this.name == column and number(n.expression) == limit
               for n in tree.find_all(exp.LTE))


def clamps(tree: exp.Expression, lo: float, hi: float, column: str | None = None) -> bool:
    """Whether the tree holds GREATEST(LEAST(value, hi), lo), of a value reading `column` if one is named."""
    for node in tree.find_all(exp.Greatest):
        inner = node.this
        if not (isinstance(inner, exp.Least) and [number(e) for e in node.expressions] == [lo]
                and [number(e) for e in inner.expressions] == [hi]):
            continue
        if column is None or any(c.name == column for c in inner.this.find_all(exp.Column)):
            return True
    return False


@dataclass
class RunningServer:
    """A DpsqlServer on its own event loop in a thread (the server tests)."""

    policy: Path
    config: ServerConfig
    server: DpsqlServer | None = None
    loop: asyncio.AbstractEventLoop | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _failure: BaseException | None = None
    engine: Engine | None = None  # the server's engine, if not one of its own (tests wrap it to control timing)

    def start(self) -> RunningServer:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            raise self._failure
        return self

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            self.server = DpsqlServer(load_policy(self.policy), self.config, engine=self.engine)
            await self.server.start()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stop.wait()
        await self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def call(self, coroutine):  # run a coroutine on the server's loop, from the test's thread
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        if self.loop is not None and self.server is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()


def start_server(policy: Path, **config) -> RunningServer:
    return RunningServer(policy, ServerConfig(port=0, **config)).start()


"""Small datasets with their policies, written to a folder, and sessions over them.

A dataset is one table: its rows go to a CSV file and its declaration to a TOML policy beside it, with a fresh
budget ledger. TOML inline values are written as JSON, which is valid TOML for strings, numbers, booleans and
arrays.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.policy import ColumnPolicy, ColumnType, load_policy
from dpsql.session import PrivateSession
from dpsql.store.ledger import BudgetLedger


def column(name: str, type: str, lower: float | None = None, upper: float | None = None,
           values: tuple[Any, ...] | None = None, nullable: bool = True) -> ColumnPolicy:
    """A column declaration, as dpsql's own ColumnPolicy."""
    return ColumnPolicy(name, ColumnType(type), lower, upper, values, nullable)


def _column_toml(column: ColumnPolicy) -> str:
    keys: dict[str, Any] = {"type": column.type.value}
    if column.lower is not None:
        keys |= {"lower": column.lower, "upper": column.upper}
    if column.values is not None:
        keys["values"] = list(column.values)
    if not column.nullable:
        keys["nullable"] = False
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()) + " }"


@dataclass(frozen=True)
class Table:
    name: str
    unit: str
    columns: tuple[ColumnPolicy, ...]
    max_rows: int = 1

    @property
    def header(self) -> list[str]:
        return [c.name for c in self.columns]


@dataclass(frozen=True)
class Budget:
    epsilon: float = 1000.0
    delta: float = 1e-6
    query_epsilon: float = 1.0
    query_delta: float = 1e-8
    accounting: str = "pure"
    mechanism: str = "laplace"
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. {"ledger": "elsewhere/ledger.sqlite"}

    def toml(self) -> list[str]:
        keys = {"epsilon": self.epsilon, "delta": self.delta, "query_epsilon": self.query_epsilon,
                "query_delta": self.query_delta, "accounting": self.accounting, "mechanism": self.mechanism,
                **self.extra}
        return ["[budget]", *(f"{k} = {json.dumps(v)}" for k, v in keys.items())]


DEFAULT_BUDGET = Budget()
GAUSSIAN = Budget(accounting="zcdp", mechanism="gaussian")


def write_dataset(folder: Path, table: Table, rows: Iterable[Sequence[Any]], budget: Budget = DEFAULT_BUDGET) -> Path:
    """Write `rows` and the policy declaring them into `folder` (created); return the policy's path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{table.name}.csv"
    with data.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(table.header)
        writer.writerows([_csv(v) for v in row] for row in rows)
    lines = [*budget.toml(), "", f"[tables.{table.name}]", f"source = {json.dumps(data.name)}",
             f"privacy_unit = {json.dumps(table.unit)}", f"max_rows_per_unit = {table.max_rows}", "",
             f"[tables.{table.name}.columns]", *(f"{c.name} = {_column_toml(c)}" for c in table.columns)]
    policy = folder / "policy.toml"
    policy.write_text("\n".join(lines) + "\n")
    return policy


def create_ledger(policy: Path) -> Path:
    """Create the policy's ledger once, as the steward's `dpsql budget --init` does, before analysts use it."""
    loaded = load_policy(policy)
    BudgetLedger(loaded.budget.ledger, loaded.budget, create=True).close()
    return policy


def _csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else value  # repr round-trips every double, inf and nan


def open_session(policy: Path, seed: int, analyst: str = "attacker") -> PrivateSession:
    """A session whose noise comes from dpsql's seeded test generator (repeatable, protects no one). Acting as the
    steward too, it creates the policy's ledger on first use."""
    return PrivateSession(policy, analyst, rng=InsecureSeededRandomForTests(seed), bounding_seed=seed,
                          create_ledger=True)

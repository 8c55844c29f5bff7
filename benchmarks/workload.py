"""The accuracy workload: queries described once, rendered for each system.

A query is a structure (aggregates, an optional GROUP BY key, an optional row filter), not a SQL string, so that
dpsql, plain DuckDB, SmartNoise SQL and OpenDP's Polars API all run exactly the same question. VAR and STDDEV
are the population forms everywhere: SmartNoise computes VAR(x) as E[x^2] - E[x]^2, which is VAR_POP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    COUNT = "count"
    SUM = "sum"
    AVG = "avg"
    VAR = "var"
    STDDEV = "stddev"


# How each kind is spelled: dpsql and DuckDB share the standard names, SmartNoise has its own.
_STANDARD = {Kind.COUNT: "COUNT", Kind.SUM: "SUM", Kind.AVG: "AVG", Kind.VAR: "VAR_POP", Kind.STDDEV: "STDDEV_POP"}
_SMARTNOISE = {**_STANDARD, Kind.VAR: "VAR", Kind.STDDEV: "STDDEV"}


class Dialect(StrEnum):
    STANDARD = "standard"  # dpsql and plain DuckDB
    SMARTNOISE = "smartnoise"


@dataclass(frozen=True)
class Aggregate:
    kind: Kind
    column: str | None = None  # None: COUNT(*)

    @property
    def label(self) -> str:
        return f"{self.kind.value.upper()}({self.column or '*'})"

    def sql(self, dialect: Dialect) -> str:
        names = _SMARTNOISE if dialect is Dialect.SMARTNOISE else _STANDARD
        return f"{names[self.kind]}({self.column or '*'})"


@dataclass(frozen=True)
class Filter:
    column: str
    op: str  # one of = >= <
    value: int | str

    def sql(self) -> str:
        value = f"'{self.value}'" if isinstance(self.value, str) else str(self.value)
        return f"{self.column} {self.op} {value}"


@dataclass(frozen=True)
class Query:
    name: str
    aggregates: tuple[Aggregate, ...]
    group_by: str | None = None
    where: Filter | None = None

    @property
    def grouped(self) -> bool:
        return self.group_by is not None

    @property
    def basic(self) -> bool:
        """COUNT/SUM/AVG only: the workload the issue's "grouped COUNT/SUM/AVG" target is about."""
        return all(a.kind in (Kind.COUNT, Kind.SUM, Kind.AVG) for a in self.aggregates)

    def sql(self, table: str, dialect: Dialect = Dialect.STANDARD) -> str:
        items = ([self.group_by] if self.group_by else []) + [a.sql(dialect) for a in self.aggregates]
        text = f"SELECT {', '.join(items)} FROM {table}"
        if self.where is not None:
            text += f" WHERE {self.where.sql()}"
        if self.group_by:
            text += f" GROUP BY {self.group_by}"
        return text

    def spec(self) -> dict[str, Any]:
        """The JSON form the peer runners read."""
        return asdict(self)


def _agg(kind: Kind, column: str | None = None) -> Aggregate:
    return Aggregate(kind, column)


def basic_aggregates(column: str) -> tuple[Aggregate, ...]:
    return _agg(Kind.COUNT), _agg(Kind.SUM, column), _agg(Kind.AVG, column)


def spread_aggregates(column: str) -> tuple[Aggregate, ...]:
    return _agg(Kind.VAR, column), _agg(Kind.STDDEV, column)


# PUMS: 1,000 people, one row each. educ = 16 holds 1.3% of the rows, age >= 65 17%.
PUMS_QUERIES: tuple[Query, ...] = (
    Query("pums_by_sex", basic_aggregates("income"), group_by="sex"),
    Query("pums_var", spread_aggregates("age")),
    Query("pums_all", basic_aggregates("income")),
    Query("pums_by_educ", basic_aggregates("income"), group_by="educ"),
    Query("pums_old", basic_aggregates("income"), where=Filter("age", ">=", 65)),
    Query("pums_small", basic_aggregates("age"), where=Filter("educ", "=", 16)),
    Query("pums_var_by_married", spread_aggregates("income"), group_by="married"),
    Query("pums_var_small", spread_aggregates("age"), where=Filter("educ", "=", 16)),
)

# Synthetic visits: 1-5 rows per patient. Departments hold ~12% of the rows each, oncology x region ~2%,
# age >= 90 ~2%, age >= 65 by region ~4%.
VISITS_QUERIES: tuple[Query, ...] = (
    Query("visits_by_department", basic_aggregates("cost"), group_by="department"),
    Query("visits_var_by_region", spread_aggregates("cost"), group_by="region"),
    Query("visits_all", basic_aggregates("cost")),
    Query("visits_old_by_region", basic_aggregates("length_of_stay"), group_by="region", where=Filter("age", ">=", 65)),
    Query("visits_oncology_by_region", basic_aggregates("cost"), group_by="region",
          where=Filter("department", "=", "oncology")),
    Query("visits_small", basic_aggregates("cost"), where=Filter("age", ">=", 90)),
    Query("visits_var_small", spread_aggregates("cost"), where=Filter("age", ">=", 90)),
)

# --quick runs the first two of each: one grouped COUNT/SUM/AVG and one VAR/STDDEV query.
QUICK_QUERIES = 2

# The speed benchmark's grouped query (the task: GROUP BY a public column, COUNT/SUM/AVG).
SPEED_QUERY = Query("speed_by_department", basic_aggregates("cost"), group_by="department")

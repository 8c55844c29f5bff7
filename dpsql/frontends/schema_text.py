"""What the policy says of each table and column, in words: the descriptions tools show (psql's `\\d+`, JDBC's
REMARKS, SQLAlchemy's comments). All of it is public, as the threat model says the policy is."""

from __future__ import annotations

from dpsql.policy import ColumnPolicy, TablePolicy


def table_description(table: TablePolicy) -> str:
    if table.public:
        return "public table: read row by row and joined freely, at no cost"
    if table.privacy_unit is None:
        return "private table (row privacy): each row is one person's; ask aggregates"
    unit = table.unit or table.privacy_unit
    rows = f"{table.bound.max_rows} row{'s' if table.bound.max_rows != 1 else ''}"
    return (f"private table: privacy unit {table.privacy_unit} (one {unit}); at most {rows} of one {unit} count "
            "in a query; ask aggregates")


def column_description(table: TablePolicy, column: ColumnPolicy) -> str | None:
    parts = []
    if column.name == table.privacy_unit:
        parts.append("the privacy unit")
    if column.lower is not None and column.upper is not None:
        parts.append(f"bounds [{column.lower:g}, {column.upper:g}]")
    if column.values is not None:
        parts.append("values: " + ", ".join(str(v) for v in column.values))
    if column.per_unit:
        parts.append(f"the same on every row of one {table.unit or 'unit'}")
    return "; ".join(parts) or None

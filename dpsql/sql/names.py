"""Every identifier dpsql reserves for itself, in one place.

The stages talk to each other through SQL: the loader writes a ranked copy of each table, the rewrite reads it,
the checker turns the analyst's SELECT into a query over a table of noisy cells, post-processing runs that query.
The names of those tables and columns are built here and nowhere else. Every one starts with two underscores, and
`is_reserved` is what the policy loader uses to refuse a declared table or column that could be mistaken for one.

A stage that needs to know *which* key or aggregate a column stands for reads it from the node's meta
(`AGGREGATE_INDEX`), set where the column was made, never by parsing its name back; the value there is a `_Mark`,
which no SQL text can forge.
"""

from __future__ import annotations

from sqlglot import exp

RESERVED_PREFIX = "__"

# The post-processing query (release/postprocess.py) reads one table of released cells.
NOISY_TABLE = "__noisy"
CELLS_VIEW = "__cells"  # the released cells as handed to post-processing, before their columns are typed
POSITION = "__position"  # each released row's place in release()'s data-independent order

# Meta key on a column of the outer query that stands for an aggregate: the aggregate's index in
# CheckedQuery.aggregates.
AGGREGATE_INDEX = "dpsql_aggregate_index"

# The loaded, ranked copy of each private table (engines/) and the columns the loader adds.
UNIT = "__dp_unit"  # the privacy unit (or a row number under row privacy)
ROW_KEY = "__dp_key"  # the secret salted hash that orders one unit's rows
RANK = "__dp_rank"  # the row's rank within its unit by ROW_KEY
UNIT_ROWS = "__dp_n"  # how many rows the unit has in all
EARLIER = "__dp_earlier"  # in the later-rows table, while it is built: the earlier rows, as structs
EARLIER_ELEMENT = "__dp_e"  # the filtered cap's lambda variable: one earlier row's value (or values, zipped)
VARIES = "__dp_varies"  # bit mask: which columns hold more than one value among the unit's rows (rewrite/bounding.py)
GROUP_ROW = "__dp_group_row"  # a row's rank within its unit's rows of one group, by ROW_KEY
GROUP_KEY = "__dp_group_key"  # the smallest ROW_KEY of a unit's rows in one group: orders its groups
GROUP_NUMBER = "__dp_group_number"  # a group's rank among its unit's groups, by GROUP_KEY
VALUES_BY_GROUP = "__dp_by_group"  # the subqueries of the per-group cap
TWIN_SCHEMA = "__dp_twin"  # empty copies of the prepared tables, for the dry run
STORE = "__dp_store"  # the prepared store, attached read-only as the default database (engines/store.py)
PREVIOUS_STORE = "__dp_previous"  # the store a build replaces, attached read-only for the rows it keeps
APPENDED = "__dp_appended"  # in a store: what its append-only database tables held (engines/loading.py)
SOURCE_FILE = "__dp_file"  # the file a source row was read from, when the loader names a row it refuses

# The bounded query's own subqueries and one-row placeholder (rewrite/).
BOUNDED = "__dp_bounded"
VALUES = "__dp_values"
INTEGERS = "__dp_integers"
CODED = "__dp_coded"  # the grouped rows whose coded keys are decoded (rewrite/passes.decode_keys)
ONE = "__dp_one"
RELEASED = "__dp_released"  # a released answer, read by SQL over it (post-processing: analysis/released.py)


def key(index: int) -> str:
    """The column of the index-th group key, in the bounded query's result and in the noisy table."""
    return f"__k{index}"


def aggregate(index: int, part: str | None = None) -> str:
    """The noisy table's column for an aggregate's value, or for its interval's ends and noise ("lo", "hi", "sd")."""
    return f"__a{index}" if part is None else f"__a{index}_{part}"


def output(index: int, part: str | None = None) -> str:
    """The post-processing query's index-th output column, or its interval's ends and noise."""
    return f"__o{index}" if part is None else f"__o{index}_{part}"


def measurement(index: int) -> str:
    """The bounded query's column of the index-th measurement (QueryPlan.measurements)."""
    return f"__m{index}"


def row_value(index: int) -> str:
    """The index-th distinct aggregated expression of one kept row, clamped."""
    return f"__v{index}"


def row_integer(index: int) -> str:
    """The same value as a centered fixed-point integer."""
    return f"__q{index}"


def prepared_table(table: str) -> str:
    """The loaded, ranked copy of a policy table that bounded queries read."""
    return f"__dp_{table}"


def member_rank(index: int) -> str:
    """In a join's relation: the rank within its unit of the index-th table's row (rewrite/passes gates filters by
    it, so that no analyst filter runs on a row beyond its table's cap)."""
    return f"__dp_rank{index}"


def later_rows_table(table: str) -> str:
    """The loader's copy of a private table's rows ranked just after its unit's first m, each with the values of
    the rows ranked before it (rewrite/bounding.later_rows). `__dpl_`, never `__dp_` + a table name."""
    return f"__dpl_{table}"


def earlier_column(column: str) -> str:
    """In the later-rows table: the list of a column's values on the unit's rows ranked before the row."""
    return f"__dp_earlier_{column}"


def quantized_column(column: str) -> str:
    """The loader's precomputed fixed-point integer of a bounded column (see dp/fixedpoint.py)."""
    return f"__dp_q_{column}"


def known_column(column: str) -> str:
    """The loader's precomputed flag of a column with declared values: the row's value is one of them."""
    return f"__dp_known_{column}"


def code_column(column: str) -> str:
    """The loader's small integer of a column with declared values: i for the i-th declared value, else NULL."""
    return f"__dp_code_{column}"


def attached_source(table: str) -> str:
    """The name under which a DuckDB-file source is attached while it is copied in."""
    return f"__dp_src_{table}"


def staged_source(table: str) -> str:
    """The table a database source's rows are copied into, as read, before they are prepared (engines/loading.py):
    temporary, but kept in a store for a table with an append key, whose next refresh reads only the newer rows."""
    return f"__dp_staged_{table}"


def is_reserved(name: str) -> bool:
    return name.startswith(RESERVED_PREFIX)


class _Mark:
    """A value only dpsql code can put in a node's meta. sqlglot also fills meta from the analyst's text (a comment
    `/* sqlglot.meta dpsql_aggregate_index=1 */` sets that key to True), so the marks the stages read must be of a
    type no SQL text can produce: `_marked` trusts a key only when it holds one of these."""

    __slots__ = ("index",)

    def __init__(self, index: int | None = None) -> None:
        self.index = index

    def __deepcopy__(self, memo: dict) -> _Mark:  # node.copy() deep-copies meta: keep the mark what it is
        return self


def mark(node: exp.Expression, key: str, index: int | None = None) -> exp.Expression:
    """Record on `node` that dpsql made it for `key` (with an index, for keys and aggregates)."""
    node.meta[key] = _Mark(index)
    return node


def marked(node: exp.Expression, key: str) -> _Mark | None:
    """The mark dpsql put on `node` under `key`, or None: a value forged from the analyst's text is ignored."""
    value = node.meta.get(key)
    return value if isinstance(value, _Mark) else None


def aggregate_column(index: int) -> exp.Column:
    """A column of the noisy table standing for aggregate `index`, carrying the index for later stages."""
    return mark(exp.column(aggregate(index)), AGGREGATE_INDEX, index)


def aggregate_index(node: exp.Expression) -> int | None:
    """The aggregate a column made by `aggregate_column` stands for; None for any other node."""
    found = marked(node, AGGREGATE_INDEX) if isinstance(node, exp.Column) else None
    return found.index if found is not None else None


KEY_INDEX = "dpsql_key_index"


def key_column(index: int) -> exp.Column:
    return mark(exp.column(key(index)), KEY_INDEX, index)


def key_index(node: exp.Expression) -> int | None:
    found = marked(node, KEY_INDEX) if isinstance(node, exp.Column) else None
    return found.index if found is not None else None

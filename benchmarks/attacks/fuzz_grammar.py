"""Random SQL for the fuzzer: a small grammar of the SELECTs dpsql accepts and much that it must refuse, and
token-level mutations of valid queries (dropped, duplicated and swapped tokens, random functions and table
functions, comments, quotes, statement separators, unicode look-alikes, case changes, extreme numbers).

Everything is drawn from a `random.Random`, so a seed repeats a run, and hypothesis can drive it through
`st.randoms()`.
"""

from __future__ import annotations

import random
import re

COLUMNS = {"uid": "int", "g": "text", "h": "text", "x": "float", "k": "int", "flag": "bool", "d": "date",
           "note": "text"}
NUMERIC = ("x", "k", "uid")
VETTED = ("abs", "round", "floor", "ceil", "sqrt", "ln", "exp", "sign", "lower", "upper", "length", "substring",
          "trim", "concat", "left", "right", "replace", "strpos", "year", "month", "day", "coalesce", "nullif",
          "least", "greatest")
UNVETTED = ("random", "now", "current_date", "setseed", "error", "regexp_matches", "regexp_replace", "md5", "hash",
            "getenv", "current_setting", "version", "sleep_ms", "repeat", "printf", "format", "uuid", "nextval",
            "to_json", "string_split", "levenshtein", "chr", "strftime", "list_value", "unnest", "typeof",
            "pg_typeof", "current_user", "txid_current", "bit_count", "epoch_ms", "make_date", "log", "pow", "power")
TABLE_FUNCTIONS = ("read_csv('/etc/passwd')", "read_csv_auto('visits.csv')", "read_parquet('*.parquet')",
                   "glob('/*')", "duckdb_tables()", "duckdb_settings()", "pragma_table_info('f')",
                   "information_schema.tables", "generate_series(1, 3)", "range(10)", "'f.csv'", "sqlite_master",
                   "__dp_f", "__dp_f__empty", "main.f", "f.f", "F", '"f"', "fｘ")
AGGREGATES = ("COUNT", "SUM", "AVG", "VARIANCE", "VAR_POP", "VAR_SAMP", "STDDEV", "STDDEV_POP", "STDDEV_SAMP")
UNSUPPORTED_AGGREGATES = ("MIN", "MAX", "MEDIAN", "MODE", "QUANTILE_CONT", "STRING_AGG", "LIST", "FIRST",
                          "ANY_VALUE", "ARG_MAX", "APPROX_COUNT_DISTINCT", "BOOL_OR", "HISTOGRAM", "VAR", "PRODUCT")
STATEMENTS = ("PRAGMA database_list", "ATTACH 'x.db' AS x", "COPY f TO 'out.csv'", "INSTALL httpfs", "LOAD httpfs",
              "SET enable_external_access = true", "CALL pragma_version()", "EXPORT DATABASE '/tmp/x'",
              "DROP TABLE f", "CREATE TABLE z AS SELECT 1", "INSERT INTO f VALUES (1)", "DESCRIBE f", "SHOW TABLES",
              "SUMMARIZE f", "EXPLAIN SELECT COUNT(*) FROM f", "DETACH x", "CHECKPOINT", "VACUUM", "BEGIN")
LOOKALIKES = {"a": "а", "e": "е", "o": "о", "c": "с", "x": "х", "p": "р", "i": "і", "k": "κ", "u": "υ", "g": "ɡ",
              "S": "Ѕ", "C": "С", "O": "О", "E": "Е", "A": "А", "T": "Т", "M": "М", "(": "（", ")": "）", "*": "∗",
              "'": "’", ",": "‚"}
STRINGS = ("'a'", "'b'", "'c'", "''", "'%a%'", "'it''s'", "'ü'", "'\\'", "'a_%'", "'%'", "'🙂'", "'\u200b'",
           "'NULL'", "'2024-01-01'", "'1e309'", "'--'", "'/*'", "'x'")
NUMBERS = ("0", "1", "-1", "2", "0.5", "-0.0", "1e308", "1e-308", "9223372036854775807", "-9223372036854775808",
           "9223372036854775808", "170141183460469231731687303715884105727", "1e309", "3", "100", "0.1", "1e15",
           "99999999999999999999")
ALIASES = ("a", "b", "total", '"weird name"', "count", '"__o0"', "__k0")
TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|\w+|--[^\n]*|/\*.*?\*/|\S", re.S)


class QueryGenerator:
    """Random SELECTs over the fuzz table `f`; most well formed, many deliberately not."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def pick(self, options):
        return options[self.r.randrange(len(options))]

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    # Row-level expressions -------------------------------------------------------------------------------
    def literal(self) -> str:
        return self.pick((*NUMBERS, *STRINGS, "NULL", "TRUE", "FALSE", "DATE '2024-01-01'", "?"))

    def numeric(self, depth: int = 0) -> str:
        if depth > 2 or self.chance(0.4):
            return self.pick((*NUMERIC, *NUMBERS[:6], "k", "x"))
        choice = self.r.randrange(6)
        if choice == 0:
            op = self.pick(("+", "-", "*", "/", "//", "%", "**"))
            return f"({self.numeric(depth + 1)} {op} {self.numeric(depth + 1)})"
        if choice == 1:
            return f"{self.pick(VETTED[:7])}({self.numeric(depth + 1)})"
        if choice == 2:
            return f"CASE WHEN {self.predicate(depth + 1)} THEN {self.numeric(depth + 1)} ELSE " \
                   f"{self.numeric(depth + 1)} END"
        if choice == 3:
            kind = self.pick(("INTEGER", "DOUBLE", "BIGINT", "TINYINT", "DECIMAL(4, 1)", "HUGEINT", "VARCHAR", "BLOB",
                              "TIMESTAMP", "DATE", "BOOLEAN"))
            return f"{self.pick(('CAST', 'TRY_CAST'))}({self.value(depth + 1)} AS {kind})"
        if choice == 4:
            return f"{self.pick(UNVETTED)}({self.value(depth + 1)})"
        return f"{self.pick(('coalesce', 'least', 'greatest', 'nullif'))}({self.numeric(depth + 1)}, " \
               f"{self.numeric(depth + 1)})"

    def value(self, depth: int = 0) -> str:
        roll = self.r.random()
        if roll < 0.5:
            return self.numeric(depth)
        if roll < 0.7:
            return self.pick(tuple(COLUMNS))
        if roll < 0.85:
            return self.literal()
        second = f", {self.literal()}" if self.chance(0.5) else ""
        return f"{self.pick(VETTED[7:])}({self.pick(('g', 'h', 'note', 'd'))}{second})"

    def predicate(self, depth: int = 0) -> str:
        if depth > 2:
            return f"{self.pick(tuple(COLUMNS))} IS {self.pick(('NULL', 'NOT NULL'))}"
        choice = self.r.randrange(8)
        if choice == 0:
            return f"{self.value(depth + 1)} {self.pick(('=', '<>', '<', '<=', '>', '>=', 'IS DISTINCT FROM'))} " \
                   f"{self.value(depth + 1)}"
        if choice == 1:
            return f"({self.predicate(depth + 1)} {self.pick(('AND', 'OR'))} {self.predicate(depth + 1)})"
        if choice == 2:
            return f"NOT {self.predicate(depth + 1)}"
        if choice == 3:
            items = ", ".join(self.literal() for _ in range(self.r.randint(1, 4)))
            return f"{self.value(depth + 1)} {self.pick(('IN', 'NOT IN'))} ({items})"
        if choice == 4:
            return f"{self.value(depth + 1)} BETWEEN {self.literal()} AND {self.literal()}"
        if choice == 5:
            escape = f" ESCAPE {self.pick(STRINGS)}" if self.chance(0.3) else ""
            return f"{self.pick(('g', 'h', 'note', 'CAST(uid AS TEXT)'))} {self.pick(('LIKE', 'ILIKE', 'NOT LIKE'))} " \
                   f"{self.pick(STRINGS)}{escape}"
        if choice == 6:
            return self.pick(("flag", "NOT flag", "flag IS NULL", "TRUE", "x > 0", "k % 2 = 0"))
        return f"{self.value(depth + 1)} IS {self.pick(('NULL', 'NOT NULL', 'TRUE', 'FALSE'))}"

    # Query structure --------------------------------------------------------------------------------------
    def aggregate(self) -> str:
        roll = self.r.random()
        if roll < 0.2:
            return "COUNT(*)"
        if roll < 0.3:
            return self.pick(("COUNT(DISTINCT uid)", "COUNT(DISTINCT x)", "COUNT(DISTINCT g)"))
        if roll < 0.4:
            return f"{self.pick(UNSUPPORTED_AGGREGATES)}({self.value()})"
        name = self.pick(AGGREGATES)
        inner = self.pick(("x", "k", "flag", "x * k", "x / 2", self.numeric(1), self.value()))
        text = f"{name}({inner})"
        if self.chance(0.05):
            text += f" FILTER (WHERE {self.predicate(1)})"
        if self.chance(0.03):
            text += " OVER ()"
        return text

    def select_item(self, keys: list[str]) -> str:
        roll = self.r.random()
        if keys and roll < 0.25:
            item = self.pick(keys)
        elif roll < 0.35:
            item = f"{self.aggregate()} {self.pick(('+', '-', '*', '/'))} {self.pick((self.aggregate(), '2', '0'))}"
        elif roll < 0.38:
            item = self.pick(("*", "x", "uid", "f.*", "1", "COLUMNS('.*')"))
        else:
            item = self.aggregate()
        return f"{item} AS {self.pick(ALIASES)}" if self.chance(0.3) else item

    def from_clause(self) -> str:
        if self.chance(0.9):
            return self.pick(("f", "f", "f", "f AS t", "F"))
        return self.pick((*TABLE_FUNCTIONS, "f JOIN f USING (uid)", "f, f", "(SELECT * FROM f) s",
                          "f TABLESAMPLE 10%", "f AT (VERSION => 1)", "LATERAL (SELECT 1)"))

    def query(self) -> str:
        keys = [self.pick(("g", "h", "flag", "x > 0", "CASE WHEN k > 50 THEN 'hi' ELSE 'lo' END", "year(d)",
                           "uid", "note", "g || h")) for _ in range(self.r.choice((0, 0, 1, 1, 2)))]
        items = [self.select_item(keys) for _ in range(self.r.randint(1, 3))]
        sql = f"SELECT {', '.join(items)} FROM {self.from_clause()}"
        if self.chance(0.5):
            sql += f" WHERE {self.predicate()}"
        if keys:
            sql += f" GROUP BY {', '.join(keys)}"
            if self.chance(0.3):
                sql += f" HAVING {self.aggregate()} > {self.pick(NUMBERS)}"
        if self.chance(0.3):
            sql += f" ORDER BY {self.pick(('1', '2', 'a', self.aggregate(), 'random()', 'x'))}" \
                   f" {self.pick(('', 'DESC', 'ASC NULLS FIRST'))}"
        if self.chance(0.2):
            sql += f" LIMIT {self.pick(NUMBERS)}"
            if self.chance(0.3):
                sql += f" OFFSET {self.pick(NUMBERS)}"
        return self.wrap(sql)

    def wrap(self, sql: str) -> str:
        roll = self.r.random()
        if roll < 0.03:
            return self.pick(STATEMENTS)
        if roll < 0.05:
            return f"{sql}; {self.pick(STATEMENTS)}"
        if roll < 0.07:
            return f"WITH q AS (SELECT * FROM f) {sql.replace('FROM f', 'FROM q', 1)}"
        if roll < 0.09:
            return f"{sql} UNION ALL {sql}"
        if roll < 0.11:
            return f"/* {self.pick(STRINGS)} */ {sql} -- trailing"
        return sql


def _tokens(sql: str) -> list[str]:
    return TOKEN.findall(sql)


PUNCTUATION = ("/*", "*/", "--", "'", '"', ";", "(", ")", ",", "\n", "\x00", "\\", "$1", ":name", "::", "->", "@",
               "#", "`")
MUTATIONS = ("drop", "duplicate", "insert", "replace", "look-alike", "swap case", "extreme number", "punctuation",
             "repeat in a list")


def _mutate_once(tokens: list[str], i: int, mutation: str, rng: random.Random, vocabulary: tuple[str, ...]) -> None:
    token = tokens[i]
    if mutation == "drop" and len(tokens) > 1:
        tokens.pop(i)
    elif mutation == "duplicate":
        tokens.insert(i, token)
    elif mutation == "insert":
        tokens.insert(i, rng.choice(vocabulary))
    elif mutation == "replace":
        tokens[i] = rng.choice(vocabulary)
    elif mutation == "look-alike":
        tokens[i] = "".join(LOOKALIKES.get(ch, ch) if rng.random() < 0.5 else ch for ch in token)
    elif mutation == "swap case":
        tokens[i] = token.swapcase()
    elif mutation == "extreme number" and token[:1].isdigit():
        tokens[i] = rng.choice(NUMBERS)
    elif mutation == "punctuation":
        tokens.insert(i, rng.choice(PUNCTUATION))
    elif mutation == "repeat in a list" and i:
        tokens[i] = f"{token}, {token}"


def mutate(sql: str, rng: random.Random, vocabulary: tuple[str, ...]) -> str:
    """1 to 3 token-level mutations of a (usually valid) query."""
    tokens = _tokens(sql) or [sql]
    for _ in range(rng.randint(1, 3)):
        _mutate_once(tokens, rng.randrange(len(tokens)), rng.choice(MUTATIONS), rng, vocabulary)
    return " ".join(tokens)


VOCABULARY = (*(f"{f}(" for f in UNVETTED), *TABLE_FUNCTIONS, *AGGREGATES, *UNSUPPORTED_AGGREGATES, "SELECT", "FROM",
              "WHERE", "GROUP", "BY", "HAVING", "ORDER", "LIMIT", "UNION", "JOIN", "AND", "OR", "NOT", "NULL", "CASE",
              "WHEN", "THEN", "ELSE", "END", "IN", "LIKE", "AS", "DISTINCT", "OVER", "FILTER", *COLUMNS, *STRINGS,
              *NUMBERS, "/* comment */", "-- comment\n", "?", ";", "*")

SEEDS = (  # valid queries, the starting points of mutations
    "SELECT COUNT(*) FROM f",
    "SELECT g, COUNT(*), AVG(x) FROM f GROUP BY g",
    "SELECT SUM(k), VARIANCE(x) FROM f WHERE flag AND x > 0",
    "SELECT h, COUNT(DISTINCT uid) FROM f GROUP BY h",
    "SELECT g, SUM(x) / COUNT(*) AS mean FROM f WHERE note LIKE 'a%' GROUP BY g HAVING COUNT(*) > 3 ORDER BY mean "
    "DESC LIMIT 2",
    "SELECT flag, STDDEV(k) FROM f WHERE d >= DATE '2024-01-01' GROUP BY flag",
    "SELECT SUM(CASE WHEN x > 0 THEN k ELSE 0 END) FROM f WHERE g IN ('a', 'b')",
)


def cases(rng: random.Random, n: int) -> list[str]:
    """n queries: half generated, half mutations of valid seeds or of generated queries."""
    generator = QueryGenerator(rng)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append(generator.query())
        else:
            base = rng.choice(SEEDS) if rng.random() < 0.6 else generator.query()
            out.append(mutate(base, rng, VOCABULARY))
    return out

"""What a client sends besides private queries, answered by the server itself without touching data or budget.

Drivers and tools open with SET and SHOW statements, `SELECT version()`, transaction control and pool liveness
checks. They are recognised here by their whole text (nothing else is answered locally, so no query on the data
can slip past the pipeline) and answered from the connection's own settings:

- `SET dpsql.epsilon = 0.5` sets the cost of the connection's next queries (`RESET dpsql.epsilon`: the default);
  `SET dpsql.accuracy = 25` instead charges each query the smallest epsilon that gives every noisy cell a 95%
  interval within +/-25, and `= 'n=25, avg_cost=2%'` asks named columns (planning/targets.py; setting one of
  epsilon and accuracy clears the other);
  `SET dpsql.intervals = on` adds the 95% interval's ends after every noisy column (and has each quantile spend a
  quarter of its epsilon measuring its interval; off, its value has all of it); `SHOW dpsql.budget` shows the
  analyst's spending.
- The parameters the server reports at startup can be shown; those it cannot honour (another time zone or date
  style, another encoding) are refused rather than ignored. Other settings are kept and shown, and change nothing.
- BEGIN, COMMIT and ROLLBACK are accepted and do nothing: queries never write, and a charge is final.
"""

from __future__ import annotations

import math
import re
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dpsql.errors import DataError, ProgrammingError
from dpsql.frontends.server.copy import CopyFormat
from dpsql.planning.targets import Accuracy, accuracy_of
from dpsql.store.ledger import Spending, exact

SERVER_VERSION = "16.0"


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        mine = version("dpsql")
    except PackageNotFoundError:
        mine = "unknown"
    return f"PostgreSQL {SERVER_VERSION} (dpsql {mine}, a differentially private SQL proxy)"


class UnknownSetting(ProgrammingError):
    sqlstate = "42704"  # undefined_object: PostgreSQL's "unrecognized configuration parameter"


class ReadOnlySetting(ProgrammingError):
    sqlstate = "55P02"  # cant_change_runtime_param


class InvalidSettingValue(DataError):
    sqlstate = "22023"


# Reported to the client at startup and whenever they change (PostgreSQL's GUC_REPORT parameters).
REPORTED = ("server_version", "server_encoding", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone",
            "integer_datetimes", "standard_conforming_strings", "application_name", "is_superuser",
            "session_authorization")
_READ_ONLY = {"server_version", "server_encoding", "integer_datetimes", "is_superuser", "session_authorization",
              "server_version_num", "max_identifier_length", "max_index_keys", "block_size", "lc_collate", "lc_ctype"}
EPSILON = "dpsql.epsilon"
ACCURACY = "dpsql.accuracy"
INTERVALS = "dpsql.intervals"
BUDGET = "dpsql.budget"


def _one_of(*accepted: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower().replace("-", "").replace("_", "") not in accepted:
            raise InvalidSettingValue(f"dpsql supports only {accepted[0].upper()} here, not {value!r}")
        return value
    return check


def _datestyle(value: str) -> str:
    if "iso" not in value.lower():
        raise InvalidSettingValue(f"dpsql writes dates in the ISO style only, not {value!r}")
    return value


def _time_zone(value: str) -> str:
    """Any zone the system knows: dpsql releases no value with a time zone (its timestamps are without one), so the
    setting changes no answer; pgcli sets the machine's own zone at start."""
    try:
        zoneinfo.ZoneInfo(value.strip())
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidSettingValue(f'invalid value for parameter "TimeZone": {value!r}') from None
    return value.strip()


_VALIDATORS: dict[str, Callable[[str], str]] = {
    "client_encoding": _one_of("utf8", "unicode"),
    "timezone": _time_zone,
    "datestyle": _datestyle,
    "standard_conforming_strings": _one_of("on", "true"),
    "intervalstyle": _one_of("postgres"),
}


@dataclass
class Settings:
    """One connection's settings: what SHOW returns and what the next queries cost."""

    values: dict[str, tuple[str, str]]  # lower-case name -> (name as spelt, value)
    epsilon: Fraction | None = None
    # instead of epsilon: the 95% half-width asked of every noisy cell, or of named columns (planning/targets.py)
    accuracy: Accuracy | None = None
    intervals: bool = False  # each noisy column followed by <name>_ci_low and <name>_ci_high

    @classmethod
    def initial(cls, user: str, startup: dict[str, str]) -> Settings:
        spelt = {"server_version": SERVER_VERSION, "server_version_num": SERVER_VERSION.replace(".", "00") + "0",
                 "server_encoding": "UTF8", "client_encoding": "UTF8", "DateStyle": "ISO, MDY",
                 "IntervalStyle": "postgres", "TimeZone": "UTC", "integer_datetimes": "on",
                 "standard_conforming_strings": "on", "application_name": startup.get("application_name", ""),
                 "is_superuser": "off", "session_authorization": user, "max_identifier_length": "63",
                 "search_path": '"$user", public', "transaction_isolation": "read committed",
                 # What drivers read from pg_settings (pgjdbc's key metadata: max_index_keys).
                 "max_index_keys": "32", "block_size": "8192", "lc_collate": "C", "lc_ctype": "C"}
        return cls({name.lower(): (name, value) for name, value in spelt.items()})

    def get(self, name: str) -> str:
        if name.lower() == EPSILON:
            return "default" if self.epsilon is None else f"{float(self.epsilon):g}"
        if name.lower() == ACCURACY:
            return "none" if self.accuracy is None else str(self.accuracy)
        if name.lower() == INTERVALS:
            return "on" if self.intervals else "off"
        found = self.values.get(name.lower())
        if found is None:
            raise UnknownSetting(f'unrecognized configuration parameter "{name}"')
        return found[1]

    def set(self, name: str, value: str | None) -> str | None:
        """Change a setting (None: back to its default); the name to report to the client, if it is reported."""
        key = name.lower()
        if key == EPSILON:
            number = None if value is None or value.lower() in ("default", "none") else _positive(key, value)
            self.epsilon, self.accuracy = number, None
            return None
        if key == ACCURACY:
            asked = None if value is None or value.lower() in ("default", "none") else _accuracy(value)
            self.epsilon, self.accuracy = None, asked
            return None
        if key == INTERVALS:
            self.intervals = value is not None and value.lower() != "default" and _switch(INTERVALS, value)
            return None
        if key.startswith("dpsql."):
            raise UnknownSetting(f'unrecognized configuration parameter "{name}"')
        if key in _READ_ONLY:
            raise ReadOnlySetting(f'parameter "{name}" cannot be changed')
        if value is None or value.lower() == "default":
            value = Settings.initial("", {}).values.get(key, (name, ""))[1]
        value = _VALIDATORS.get(key, lambda v: v)(value)
        spelt = self.values.get(key, (name, ""))[0]
        self.values[key] = (spelt, value)
        return spelt if spelt in REPORTED else None


def _switch(name: str, text: str) -> bool:
    """PostgreSQL's spellings of a boolean setting."""
    value = text.strip().lower()
    if value in ("on", "true", "yes", "1"):
        return True
    if value in ("off", "false", "no", "0"):
        return False
    raise InvalidSettingValue(f"{name} must be on or off, not {text!r}")


def _accuracy(text: str) -> Accuracy:
    """`SET dpsql.accuracy = 25`, or `= 'n=25, avg_cost=2%'` (planning/targets.py)."""
    try:
        return accuracy_of(text if "=" in text else _positive(ACCURACY, text))
    except DataError as exc:
        raise InvalidSettingValue(str(exc)) from None


def _positive(name: str, text: str) -> Fraction:
    try:
        number = float(text)
    except ValueError:
        raise InvalidSettingValue(f"{name} must be a number, not {text!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise InvalidSettingValue(f"{name} must be a finite number > 0, not {text!r}")
    return exact(text.strip())


@dataclass(frozen=True)
class Answer:
    """A statement's result as the wire needs it: columns (name, DuckDB type), rows, the command tag."""

    columns: tuple[tuple[str, str], ...]
    rows: list[tuple[Any, ...]]
    tag: str
    notices: tuple[str, ...] = ()
    reported: tuple[str, ...] = ()  # reported parameters that changed
    transaction: str | None = None  # "begin" or "end"
    copy: CopyFormat | None = None  # COPY ... TO STDOUT: the rows travel as CopyData in this format


@dataclass
class Context:
    """What a local command may read: the connection's settings, its analyst, their spending."""

    settings: Settings
    user: str
    spending: Callable[[], Spending]
    database: str = field(default="dpsql")
    parameters: list[Any] = field(default_factory=list)  # the bound parameters, for commands that take them


def _text_row(name: str, value: str) -> tuple[tuple[tuple[str, str], ...], list[tuple[Any, ...]]]:
    return ((name, "VARCHAR"),), [(value,)]


@dataclass(frozen=True)
class LocalCommand:
    """A recognised statement: the columns it returns (known before it runs) and how to answer it."""

    columns: tuple[tuple[str, str], ...]
    run: Callable[[Context], Answer]
    parameters: int = 0  # how many $n parameters it takes (catalog queries; the rest take none)


_BUDGET_COLUMNS = (("analyst", "VARCHAR"), ("epsilon_spent", "DOUBLE"), ("epsilon_remaining", "DOUBLE"),
                   ("epsilon_total", "DOUBLE"), ("delta_spent", "DOUBLE"), ("delta_total", "DOUBLE"),
                   ("queries", "BIGINT"), ("accounting", "VARCHAR"))


def _show_budget(ctx: Context) -> Answer:
    s = ctx.spending()
    row = (ctx.user, s.epsilon_spent, s.epsilon_remaining, s.epsilon_total, s.delta_spent, s.delta_total,
           s.queries, s.accounting.value)
    return Answer(_BUDGET_COLUMNS, [row], "SHOW")


def _show(name: str) -> LocalCommand:
    if name.lower() == BUDGET:
        return LocalCommand(_BUDGET_COLUMNS, _show_budget)
    if name.lower() == "all":
        columns = (("name", "VARCHAR"), ("setting", "VARCHAR"), ("description", "VARCHAR"))

        def show_all(ctx: Context) -> Answer:
            rows = [(spelt, value, "") for spelt, value in sorted(ctx.settings.values.values())]
            rows.append((EPSILON, ctx.settings.get(EPSILON), "the privacy cost of this connection's next queries"))
            return Answer(columns, rows, "SHOW")
        return LocalCommand(columns, show_all)
    column = name.lower().split(".")[-1] if not name.lower().startswith("dpsql.") else name.lower()

    def show_one(ctx: Context) -> Answer:
        columns, rows = _text_row(column, ctx.settings.get(name))
        return Answer(columns, rows, "SHOW")
    return LocalCommand(((column, "VARCHAR"),), show_one)


def _set(name: str, value: str | None) -> LocalCommand:
    def run(ctx: Context) -> Answer:
        reported = ctx.settings.set(name, value)
        return Answer((), [], "RESET" if value is None else "SET", reported=(reported,) if reported else ())
    return LocalCommand((), run)


def _tag(tag: str, transaction: str | None = None) -> LocalCommand:
    return LocalCommand((), lambda ctx: Answer((), [], tag, transaction=transaction))


def _discard_all(ctx: Context) -> Answer:
    """Connection pools reset a connection with DISCARD ALL: the settings go back to those of the login."""
    initial = Settings.initial(ctx.user, {})
    changed = tuple(spelt for key, (spelt, value) in ctx.settings.values.items()
                    if spelt in REPORTED and initial.values.get(key, (spelt, ""))[1] != value)
    ctx.settings.values, ctx.settings.epsilon, ctx.settings.accuracy = initial.values, None, None
    return Answer((), [], "DISCARD ALL", reported=changed)


_NAME = r'(?:"[^"]+"|[a-z_][a-z0-9_$]*)(?:\.(?:"[^"]+"|[a-z_][a-z0-9_$]*))?'
_RULES: list[tuple[str, Callable[[re.Match[str]], LocalCommand]]] = [
    (r"(?:begin|start transaction)(?: (?:work|transaction))?(?: [a-z ,]*)?",
     lambda m: _tag("BEGIN", "begin")),
    (r"(?:commit|end)(?: (?:work|transaction))?", lambda m: _tag("COMMIT", "end")),
    (r"(?:rollback|abort)(?: (?:work|transaction))?", lambda m: _tag("ROLLBACK", "end")),
    # Savepoints (psycopg and SQLAlchemy make them) do nothing either: there is nothing to roll back.
    (rf"savepoint {_NAME}", lambda m: _tag("SAVEPOINT")),
    (rf"release (?:savepoint )?{_NAME}", lambda m: _tag("RELEASE")),
    (rf"rollback (?:work |transaction )?to (?:savepoint )?{_NAME}", lambda m: _tag("ROLLBACK")),
    (rf"set (?:session |local )?({_NAME}) *(?:=| to ) *(.+)",
     lambda m: _set(_unquote_name(m.group(1)), _value(m.group(2)))),
    (r"set (?:session |local )?time zone (.+)", lambda m: _set("TimeZone", _value(m.group(1)))),
    (rf"reset ({_NAME})", lambda m: _set(_unquote_name(m.group(1)), None)),
    (r"show transaction isolation level", lambda m: _show("transaction_isolation")),  # SQLAlchemy asks so
    (r"show time zone", lambda m: _show("TimeZone")),  # pgcli asks so
    (r"set (?:session |local )?transaction .*", lambda m: _tag("SET")),  # isolation levels: nothing ever writes
    (r"set session characteristics as transaction .*", lambda m: _tag("SET")),
    (r"reset all", lambda m: LocalCommand((), _discard_all)),
    (rf"deallocate (?:prepare )?(?:all|{_NAME})", lambda m: _tag("DEALLOCATE")),
    (r"unlisten \*", lambda m: _tag("UNLISTEN")),
    (rf"show ({_NAME})", lambda m: _show(_unquote_name(m.group(1)))),
    (r"discard all", lambda m: LocalCommand((), _discard_all)),
]


# Whole-statement patterns, case-insensitive; values and quoted names keep their case.
_PATTERNS = [(re.compile(pattern, re.IGNORECASE), make) for pattern, make in _RULES]


def local_command(sql: str) -> LocalCommand | None:
    """The local command `sql` is, or None for a query that goes through the private pipeline."""
    text = " ".join(sql.strip().rstrip(";").split())
    for pattern, make in _PATTERNS:
        match = pattern.fullmatch(text)
        if match is not None:
            return make(match)
    return None


def _unquote_name(name: str) -> str:
    return ".".join(part[1:-1] if part.startswith('"') else part for part in re.findall(r'"[^"]+"|[^.]+', name))


def _value(text: str) -> str:
    """A SET value: a quoted string, a number, a word, or a comma-separated list of them, as text."""
    parts = []
    for part in re.findall(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[^,]+", text):
        part = part.strip()
        if len(part) > 1 and part[0] == part[-1] and part[0] in "'\"":
            part = part[1:-1].replace(part[0] * 2, part[0])
        parts.append(part)
    return ", ".join(p for p in parts if p)




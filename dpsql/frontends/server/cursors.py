"""Server-side cursors: `DECLARE name CURSOR FOR query`, `FETCH`, `MOVE`, `CLOSE`.

The query is answered once, when the cursor is declared (a private query is charged then, once, as itself), and
FETCH pages through the released rows: nothing more is computed or charged, however the rows are fetched. A
cursor declared without HOLD lives until its transaction ends, as in PostgreSQL; one WITH HOLD until it is closed.
Cursors only scan forward (NO SCROLL is PostgreSQL's default for most queries; FETCH BACKWARD is refused).
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field

from dpsql.errors import NotSupportedError, ProgrammingError
from dpsql.frontends.server.commands import Answer

_NAME = r'(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)'
_DECLARE = re.compile(rf"declare\s+({_NAME})\s+((?:binary|asensitive|insensitive|no\s+scroll|scroll|\s)*)cursor\s*"
                      r"((?:with|without)\s+hold\s*)?for\s+(.*)", re.IGNORECASE | re.DOTALL)
_FETCH = re.compile(rf"(fetch|move)\s*(?:(next|prior|first|last|all|forward|backward|absolute|relative)\s*"
                    rf"(all|[+-]?\d+)?|([+-]?\d+))?\s*(?:from|in)?\s*({_NAME})", re.IGNORECASE | re.DOTALL)
_CLOSE = re.compile(rf"close\s+(all|{_NAME})", re.IGNORECASE)


class CursorError(ProgrammingError):
    sqlstate = "34000"  # invalid_cursor_name


class CursorState(ProgrammingError):
    sqlstate = "25P01"  # no_active_sql_transaction


@dataclass(frozen=True)
class Declare:
    name: str
    query: str
    hold: bool
    binary: bool
    scroll: bool


@dataclass(frozen=True)
class Fetch:
    name: str
    count: int | None  # None: ALL
    move: bool  # MOVE: position only, no rows


@dataclass(frozen=True)
class Close:
    name: str | None  # None: ALL


def cursor_command(sql: str) -> Declare | Fetch | Close | None:
    text = sql.strip().rstrip(";").strip()
    declared = _DECLARE.fullmatch(text)
    if declared is not None:
        options = " ".join(declared.group(2).lower().split())
        return Declare(_name(declared.group(1)), declared.group(4).strip(),
                       (declared.group(3) or "").lower().startswith("with "), "binary" in options,
                       "scroll" in options and "no scroll" not in options)
    fetched = _FETCH.fullmatch(text)
    if fetched is not None:
        return Fetch(_name(fetched.group(5)), _count(fetched.group(2), fetched.group(3) or fetched.group(4)),
                     fetched.group(1).lower() == "move")
    closed = _CLOSE.fullmatch(text)
    if closed is not None:
        return Close(None if closed.group(1).lower() == "all" else _name(closed.group(1)))
    return None


def _name(text: str) -> str:
    return text[1:-1].replace('""', '"') if text.startswith('"') else text.lower()


def _count(direction: str | None, amount: str | None) -> int | None:
    direction = (direction or "").lower()
    if direction in ("prior", "backward", "first", "last", "absolute", "relative"):
        raise NotSupportedError(f"dpsql cursors only scan forward: FETCH {direction.upper()} is not supported")
    if direction == "all" or (amount or "").lower() == "all":
        return None
    if amount is None:
        return 1
    number = int(amount)
    if number < 0:
        raise NotSupportedError("dpsql cursors only scan forward: a negative count is not supported")
    return number


@dataclass
class Cursor:
    declared: Declare
    answer: Answer
    created: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    position: int = 0


@dataclass
class Cursors:
    """One connection's open cursors."""

    open: dict[str, Cursor] = field(default_factory=dict)

    def add(self, declared: Declare, answer: Answer, in_transaction: bool) -> Answer:
        if declared.name in self.open:
            raise ProgrammingError(f'cursor "{declared.name}" already exists')
        if not declared.hold and not in_transaction:
            raise CursorState("DECLARE CURSOR can only be used in transaction blocks (or declare it WITH HOLD)")
        self.open[declared.name] = Cursor(declared, answer)
        return Answer((), [], "DECLARE CURSOR")

    def find(self, name: str) -> Cursor:
        cursor = self.open.get(name)
        if cursor is None:
            raise CursorError(f'cursor "{name}" does not exist')
        return cursor

    def fetch(self, command: Fetch) -> Answer:
        cursor = self.find(command.name)
        rows = cursor.answer.rows
        stop = len(rows) if command.count is None else min(len(rows), cursor.position + command.count)
        taken = rows[cursor.position:stop]
        cursor.position = stop
        if command.move:
            return Answer((), [], f"MOVE {len(taken)}")
        return Answer(cursor.answer.columns, taken, f"FETCH {len(taken)}")

    def close(self, command: Close) -> Answer:
        if command.name is None:
            self.open.clear()
        elif self.open.pop(command.name, None) is None:
            raise CursorError(f'cursor "{command.name}" does not exist')
        return Answer((), [], "CLOSE CURSOR")

    def end_transaction(self) -> None:
        """COMMIT or ROLLBACK: cursors declared without HOLD close."""
        self.open = {name: c for name, c in self.open.items() if c.declared.hold}

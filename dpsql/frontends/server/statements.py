"""A Query message's text cut into its statements, at the semicolons outside strings, quoted names and comments.

PostgreSQL runs each statement of a simple Query in turn; dpsql's pipeline takes one statement at a time. The cut
uses sqlglot's PostgreSQL tokenizer; text it cannot tokenize is left whole, for the pipeline to refuse with its
own message.
"""

from __future__ import annotations

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

_POSTGRES = Dialect.get_or_raise("postgres")


def split_statements(sql: str) -> list[str]:
    """The statements of `sql`, without their semicolons; empty ones (only blanks or comments) are dropped."""
    try:
        tokens = _POSTGRES.tokenize(sql)
    except (TokenError, ValueError, RecursionError):
        return [sql] if sql.strip() else []
    statements, start, has_tokens = [], 0, False
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            if has_tokens:
                statements.append(sql[start:token.start].strip())
            start, has_tokens = token.end + 1, False
        else:
            has_tokens = True
    if has_tokens:
        statements.append(sql[start:].strip())
    return statements

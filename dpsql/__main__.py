"""`python -m dpsql` is the `dpsql` command."""

from dpsql.cli import main

main()

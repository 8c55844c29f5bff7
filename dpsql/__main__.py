"""`python -m dpsql` is the `dpsql` command."""

from dpsql.frontends.cli import main

main()

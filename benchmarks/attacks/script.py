"""What every attack script shares: its options, declared by their defaults, and a scratch folder."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def options(doc: str | None, **defaults: Any) -> argparse.Namespace:
    """Parse `--some-name VALUE` for each keyword `some_name`; the default's type is the option's type (a list
    default takes several values of its elements' type)."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    for name, default in defaults.items():
        flag = f"--{name.replace('_', '-')}"
        if isinstance(default, list):
            parser.add_argument(flag, type=type(default[0]), nargs="+", default=default)
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return parser.parse_args()


@contextmanager
def scratch() -> Iterator[Path]:
    """A temporary folder for the script's datasets and ledgers, removed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)

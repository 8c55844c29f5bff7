"""The steward's list of analysts who may log in to the server: one SCRAM-SHA-256 verifier per login name.

A JSON file named in the policy (`[server] users`, default `<policy stem>.users.json` beside the ledger), written
atomically with mode 0600. It holds verifiers, never passwords, and the secret from which the fake verifiers of
unknown names are derived, so that they stay the same across restarts, as a real user's salt does. The login name
is the analyst whose budget the queries spend: nobody picks their identity on the wire.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dpsql.errors import PolicyError
from dpsql.frontends.server.scram import DEFAULT_ITERATIONS, Verifier, fake_verifier, make_verifier
from dpsql.policy import Policy

_FORMAT = 1
_MAX_NAME_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: clients may cut longer names


def users_path(policy: Policy) -> Path:
    if policy.users is not None:
        return policy.users
    return policy.budget.ledger.parent / f"{policy.path.stem}.users.json"


def check_name(name: str) -> str:
    if not name or len(name.encode("utf-8")) > _MAX_NAME_BYTES:
        raise PolicyError(f"a user name must have 1 to {_MAX_NAME_BYTES} bytes")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name) or name != name.strip():
        raise PolicyError("a user name cannot hold control characters or begin or end with a space")
    return name


@dataclass
class UserStore:
    path: Path
    secret: bytes
    verifiers: dict[str, Verifier]

    @classmethod
    def load(cls, path: Path, *, create: bool = False) -> UserStore:
        """Read the file; with `create`, a missing file is an empty store with a new secret (saved on `save`)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            if create:
                return cls(path, secrets.token_bytes(32), {})
            raise PolicyError(f"users file {path} does not exist: add a user with `dpsql user add`") from None
        except (OSError, ValueError) as exc:
            raise PolicyError(f"users file {path}: cannot read it ({exc})") from None
        try:
            if raw["format"] != _FORMAT:
                raise ValueError(f"unknown format {raw['format']!r}")
            secret = bytes.fromhex(raw["secret"])
            verifiers = {check_name(name): Verifier.decode(text) for name, text in raw["users"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PolicyError(f"users file {path}: malformed ({exc})") from None
        if len(secret) < 16:
            raise PolicyError(f"users file {path}: malformed (the secret is too short)")
        return cls(path, secret, verifiers)

    def verifier(self, name: str) -> tuple[Verifier, bool]:
        """The user's verifier and True, or a fake one and False: both go through the same exchange."""
        found = self.verifiers.get(name)
        if found is not None:
            return found, True
        return fake_verifier(self.secret, name, DEFAULT_ITERATIONS), False

    def add(self, name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS) -> bool:
        """Set the user's verifier; True if the user is new, False if the password was replaced."""
        if not password:
            raise PolicyError("the password is empty")
        new = check_name(name) not in self.verifiers
        self.verifiers[name] = make_verifier(password, iterations=iterations)
        return new

    def remove(self, name: str) -> None:
        if name not in self.verifiers:
            raise PolicyError(f"no user {name!r} in {self.path}")
        del self.verifiers[name]

    def save(self) -> None:
        """Write the whole file to a temporary file (mode 0600) in the same folder and rename it over the old one,
        so a reader sees the old file or the new one, never half of one."""
        text = json.dumps({"format": _FORMAT, "secret": self.secret.hex(),
                           "users": {name: v.encode() for name, v in sorted(self.verifiers.items())}}, indent=2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.fchmod(handle, 0o600)
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

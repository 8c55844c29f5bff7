"""SCRAM-SHA-256 (RFC 5802, RFC 7677) on the server side, as PostgreSQL speaks it: no I/O, only the messages.

The server keeps a verifier (salt, iterations, StoredKey, ServerKey), never the password. A login proves knowledge
of the password without sending it; the server proves it holds the verifier. Unknown users go through the very same
exchange with a fake verifier derived from a server secret, so the answers (a stable salt, the same iteration
count, the same failure) do not tell which names exist.

Channel binding (SCRAM-SHA-256-PLUS) is not offered: a client that could bind says so with the gs2 flag "y", which
is accepted because the server never advertised the PLUS mechanism (RFC 5802 section 6).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

MECHANISM = "SCRAM-SHA-256"
DEFAULT_ITERATIONS = 4096  # PostgreSQL's default (scram_iterations); RFC 7677 asks for at least 4096
MIN_ITERATIONS = 4096
_SALT_BYTES = 16
_NONCE_BYTES = 18


class ScramError(Exception):
    """The client's message is malformed or its proof is wrong. The text is for the log, never for the client."""


@dataclass(frozen=True)
class Verifier:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def encode(self) -> str:
        """PostgreSQL's text form (as in pg_authid.rolpassword): SCRAM-SHA-256$iter:salt$StoredKey:ServerKey."""
        return (f"{MECHANISM}${self.iterations}:{_b64(self.salt)}$"
                f"{_b64(self.stored_key)}:{_b64(self.server_key)}")

    @classmethod
    def decode(cls, text: str) -> Verifier:
        try:
            mechanism, rest = text.split("$", 1)
            iterations_salt, keys = rest.split("$", 1)
            iterations, salt = iterations_salt.split(":", 1)
            stored, server = keys.split(":", 1)
            verifier = cls(_unb64(salt), int(iterations), _unb64(stored), _unb64(server))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a {MECHANISM} verifier") from exc
        if mechanism != MECHANISM or verifier.iterations < MIN_ITERATIONS or len(verifier.stored_key) != 32 \
                or len(verifier.server_key) != 32 or not verifier.salt:
            raise ValueError(f"not a {MECHANISM} verifier")
        return verifier


def make_verifier(password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> Verifier:
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"SCRAM needs at least {MIN_ITERATIONS} iterations")
    salt = salt if salt is not None else secrets.token_bytes(_SALT_BYTES)
    salted = hashlib.pbkdf2_hmac("sha256", saslprep(password).encode("utf-8"), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return Verifier(salt, iterations, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"))


def fake_verifier(secret: bytes, user: str, iterations: int = DEFAULT_ITERATIONS) -> Verifier:
    """A verifier for a name that has none: stable for a given secret and name (a repeated probe sees the same
    salt, as it would for a real user), and matching no password."""
    def derive(label: bytes) -> bytes:
        return hmac.new(secret, label + b"\0" + user.encode("utf-8"), hashlib.sha256).digest()
    return Verifier(derive(b"salt")[:_SALT_BYTES], iterations, derive(b"stored key"), derive(b"server key"))


def saslprep(password: str) -> str:
    """SASLprep (RFC 4013) as PostgreSQL applies it: map, normalise with NFKC, and fall back to the password as
    given when it holds a prohibited character (so that libpq, which does the same, agrees)."""
    if password.isascii():
        return password
    mapped = "".join(" " if stringprep.in_table_c12(ch) else ch for ch in password
                     if not stringprep.in_table_b1(ch))
    normal = unicodedata.normalize("NFKC", mapped)
    prohibited = (stringprep.in_table_c12, stringprep.in_table_c21_c22, stringprep.in_table_c3,
                  stringprep.in_table_c4, stringprep.in_table_c5, stringprep.in_table_c6, stringprep.in_table_c7,
                  stringprep.in_table_c8, stringprep.in_table_c9, stringprep.in_table_a1)
    if any(test(ch) for ch in normal for test in prohibited):
        return password
    return normal


class ScramExchange:
    """One login's exchange: client-first -> server-first, client-final -> server-final (or ScramError)."""

    def __init__(self, verifier: Verifier, *, server_nonce: str | None = None) -> None:
        self._verifier = verifier
        self._server_nonce = server_nonce  # for tests (RFC 7677's example); otherwise fresh random bytes
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._nonce = ""

    def server_first(self, client_first: bytes) -> bytes:
        text = _text(client_first)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y"):  # "p=...": channel binding, which the server did not offer
            raise ScramError("channel binding was not offered")
        if authzid:
            raise ScramError("an authorization identity is not supported")
        attributes = _attributes(bare)
        client_nonce = attributes.get("r", "")
        if not client_nonce or not _printable(client_nonce) or "m" in attributes:
            raise ScramError("the client-first message has no valid nonce")
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = client_nonce + (self._server_nonce or _b64(secrets.token_bytes(_NONCE_BYTES)))
        self._server_first = f"r={self._nonce},s={_b64(self._verifier.salt)},i={self._verifier.iterations}"
        return self._server_first.encode("ascii")

    def server_final(self, client_final: bytes) -> bytes:
        """The server's signature, once the client's proof checks out; ScramError otherwise."""
        if not self._server_first:
            raise ScramError("client-final before client-first")
        text = _text(client_final)
        without_proof, separator, proof_text = text.rpartition(",p=")
        if not separator:
            raise ScramError("the client-final message has no proof")
        attributes = _attributes(without_proof)
        if attributes.get("c") != _b64(self._gs2_header.encode("ascii")):
            raise ScramError("the channel binding data does not match")
        if attributes.get("r") != self._nonce:
            raise ScramError("the nonce does not match")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise ScramError("the proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = _hmac(self._verifier.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ScramError("the proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self._verifier.stored_key):
            raise ScramError("wrong password")
        return f"v={_b64(_hmac(self._verifier.server_key, auth_message))}".encode("ascii")


def _attributes(text: str) -> dict[str, str]:
    found = {}
    for part in text.split(","):
        key, separator, value = part.partition("=")
        if len(key) != 1 or not separator:
            raise ScramError("malformed SCRAM attribute")
        found.setdefault(key, value)
    return found


def _printable(nonce: str) -> bool:
    return all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in nonce)


def _text(message: bytes) -> str:
    try:
        return message.decode("utf-8")
    except UnicodeDecodeError:
        raise ScramError("the SCRAM message is not UTF-8") from None


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)

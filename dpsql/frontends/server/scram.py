"""SCRAM-SHA-256 (RFC 5802, RFC 7677) on the server side, as PostgreSQL speaks it: no I/O, only the messages.

The server keeps a verifier (salt, iterations, StoredKey, ServerKey), never the password. A login proves knowledge
of the password without sending it; the server proves it holds the verifier. Unknown users go through the very same
exchange with a fake verifier derived from a server secret, so the answers (a stable salt, the same iteration
count, the same failure) do not tell which names exist.

Over TLS, SCRAM-SHA-256-PLUS binds the exchange to the server's certificate (tls-server-end-point, RFC 5929):
a man in the middle who terminates TLS with another certificate cannot relay the proof. When PLUS is offered, a
client that says it could bind but thinks the server cannot (gs2 flag "y") is refused: someone stripped PLUS
from the list (RFC 5802 section 6). Without TLS only SCRAM-SHA-256 is offered, and "y" is accepted.
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
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"
_BINDING_TYPE = "tls-server-end-point"
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

    def __init__(self, verifier: Verifier, *, channel_binding: bytes | None = None,
                 server_nonce: str | None = None) -> None:
        self._verifier = verifier
        self._binding = channel_binding  # the certificate hash when PLUS is offered (over TLS), else None
        self._server_nonce = server_nonce  # for tests (RFC 7677's example); otherwise fresh random bytes
        self._client_first_bare = ""
        self._server_first = ""
        self._gs2_header = ""
        self._bound = b""
        self._nonce = ""

    @property
    def mechanisms(self) -> tuple[str, ...]:
        return (MECHANISM_PLUS, MECHANISM) if self._binding is not None else (MECHANISM,)

    def server_first(self, client_first: bytes, mechanism: str = MECHANISM) -> bytes:
        if mechanism not in self.mechanisms:
            raise ScramError(f"mechanism {mechanism!r} was not offered")
        text = _text(client_first)
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if mechanism == MECHANISM_PLUS:
            if flag != f"p={_BINDING_TYPE}":
                raise ScramError(f"{MECHANISM_PLUS} needs channel binding {_BINDING_TYPE}")
            self._bound = self._binding or b""
        elif flag.startswith("p="):
            raise ScramError(f"channel binding needs {MECHANISM_PLUS}")
        elif flag == "y" and self._binding is not None:
            raise ScramError("the client could bind but believes the server cannot: PLUS was stripped")
        elif flag not in ("n", "y"):
            raise ScramError("malformed gs2 header")
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
        if attributes.get("c") != _b64(self._gs2_header.encode("ascii") + self._bound):
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


def end_point_hash(certificate_der: bytes) -> bytes | None:
    """tls-server-end-point channel binding data (RFC 5929 section 4.1): the certificate hashed with the hash of its
    signature algorithm (SHA-256 for MD5 and SHA-1). None for an algorithm without one (RSASSA-PSS, Ed25519), for
    which PLUS is then not offered."""
    hash_name = _SIGNATURE_HASHES.get(_signature_algorithm(certificate_der))
    return hashlib.new(hash_name, certificate_der).digest() if hash_name else None


_SIGNATURE_HASHES = {
    "1.2.840.113549.1.1.4": "sha256", "1.2.840.113549.1.1.5": "sha256",  # md5, sha1 with RSA: SHA-256
    "1.2.840.113549.1.1.14": "sha224", "1.2.840.113549.1.1.11": "sha256", "1.2.840.113549.1.1.12": "sha384",
    "1.2.840.113549.1.1.13": "sha512", "1.2.840.10045.4.1": "sha256", "1.2.840.10045.4.3.1": "sha224",
    "1.2.840.10045.4.3.2": "sha256", "1.2.840.10045.4.3.3": "sha384", "1.2.840.10045.4.3.4": "sha512",
}


def _signature_algorithm(der: bytes) -> str:
    """The OID of Certificate.signatureAlgorithm: SEQUENCE { tbsCertificate, signatureAlgorithm, signature }."""
    def header(at: int) -> tuple[int, int, int]:  # tag, where the content starts, its length
        tag, first = der[at], der[at + 1]
        if first < 0x80:
            return tag, at + 2, first
        count = first & 0x7F
        return tag, at + 2 + count, int.from_bytes(der[at + 2:at + 2 + count], "big")

    try:
        _, body, _ = header(0)
        _, tbs_start, tbs_length = header(body)
        _, algorithm, _ = header(tbs_start + tbs_length)
        tag, oid_start, oid_length = header(algorithm)
        if tag != 0x06:
            return ""
        oid = der[oid_start:oid_start + oid_length]
        parts, value = [oid[0] // 40, oid[0] % 40], 0
        for byte in oid[1:]:
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                parts.append(value)
                value = 0
        return ".".join(map(str, parts))
    except IndexError:
        return ""

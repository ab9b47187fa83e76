"""Sealing secrets: AES-256-GCM under named keys; the key id is stored beside each ciphertext.

The first key seals, every configured key opens, so keys can be rotated: add a new first key,
re-seal (``bot credentials rotate``), then remove the old one.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from core.errors import VaultError

_NONCE_BYTES = 12


@dataclass(frozen=True)
class Sealed:
    key_id: str
    blob: str  # base64(nonce + ciphertext-with-tag)


class KeyRing:
    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise VaultError("no encryption key configured")
        for key_id, key in keys:
            if len(key) not in (16, 24, 32):
                raise VaultError(f"key {key_id!r} must be 16, 24 or 32 bytes (got {len(key)})")
        ids = [k for k, _ in keys]
        if len(set(ids)) != len(ids):
            raise VaultError(f"key ids must be unique (got {ids})")
        self._keys = dict(keys)
        self.current = keys[0][0]

    @staticmethod
    def parse(spec: str) -> KeyRing:
        """``id:base64key[,id:base64key…]``, first = current."""
        keys: list[tuple[str, bytes]] = []
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            key_id, sep, encoded = part.partition(":")
            if not sep or not key_id or not encoded:
                raise VaultError("each key must look like id:base64key")
            try:
                keys.append((key_id, base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_",
                                                      validate=False)))
            except (binascii.Error, ValueError):
                raise VaultError(f"key {key_id!r} is not valid base64") from None
        return KeyRing(keys)

    @staticmethod
    def generate_spec(key_id: str = "local") -> str:
        return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"

    def derive(self, purpose: str) -> bytes:
        """A separate secret for another use (e.g. signing links), tied to the current key."""
        import hashlib
        import hmac

        return hmac.new(self._keys[self.current], purpose.encode(), hashlib.sha256).digest()

    def seal(self, plaintext: str, context: str) -> Sealed:
        """``context`` (the associated data, e.g. :func:`row_context`) is bound to the ciphertext: the
        blob opens only with the same context, so it cannot be moved to another row."""
        nonce = os.urandom(_NONCE_BYTES)
        data = AESGCM(self._keys[self.current]).encrypt(nonce, plaintext.encode(), context.encode())
        return Sealed(self.current, base64.b64encode(nonce + data).decode())

    def open(self, sealed: Sealed, context: str, *, label: str | None = None) -> str:
        """``label`` names the secret in errors (default: the context); a value is never in them."""
        label = label or context
        key = self._keys.get(sealed.key_id)
        if key is None:
            raise VaultError(f"{label} is sealed with key {sealed.key_id!r}, which is not configured "
                             "(add it to BOT_SECRET_KEYS)")
        try:
            raw = base64.b64decode(sealed.blob, validate=True)
            return AESGCM(key).decrypt(raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], context.encode()).decode()
        except (InvalidTag, ValueError):  # binascii.Error and UnicodeDecodeError are ValueErrors
            raise VaultError(f"{label} cannot be opened with key {sealed.key_id!r}: wrong key or damaged "
                             "data (or a ciphertext moved from another row)") from None


# What the associated data binds, by ``secrets.aad_version``.
LEGACY_AAD = 1  # the name only (sealed before revision 0007)
ROW_AAD = 2  # name, scope, owning agent and row id


def row_context(name: str, scope: str, agent: str, row_id: int) -> str:
    """``v2|name|scope|agent|id``. Unambiguous: names and scopes have no ``|`` and the id is last."""
    return f"v{ROW_AAD}|{name}|{scope}|{agent}|{row_id}"

"""Keys sealed where the controller keeps its state: reading the store yields no key that signs.

A restarted controller must still know the seated learner's key and every replica's push key
(`persistence`), but whoever reads its Redis state (the admin password, a leaked controller user) must not get
them: with the learner's key one pushes weights and resets the timeline; with a push key one acknowledges
pushes as that replica. So a key is stored as `sealed1:<nonce>:<key XOR pad>:<tag>` (hex), the pad being
HMAC-SHA256 of a fresh random nonce under the seal, the tag an HMAC of both. The seal is derived from the
learner secret, which only the controller and the learner hold and which never enters Redis
(`asyncrl.core.wire.learner_secret`); the learner's Redis user cannot read the controller's state. Without a
learner secret (`security.insecure`) the seal is a public constant and protects nothing.

A controller restarted under another learner secret cannot open the keys it finds (`BrokenSeal`): those
registrations are dropped, and their holders register again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

PREFIX = "sealed1:"
NONCE_BYTES = 16
TAG_BYTES = 16


class BrokenSeal(ValueError):
    """A stored key that is not sealed under this controller's seal (another secret, an edit, an old format)."""


class KeySeal:
    def __init__(self, learner_secret: bytes | None):
        self._seal = hmac.new(learner_secret or b"", b"asyncrl controller state seal", hashlib.sha256).digest()

    def seal(self, key: bytes) -> str:
        """The text stored for `key` ("" for no key)."""
        if not key:
            return ""
        nonce = secrets.token_bytes(NONCE_BYTES)
        body = bytes(a ^ b for a, b in zip(key, self._pad(nonce, len(key)), strict=True))
        return f"{PREFIX}{nonce.hex()}:{body.hex()}:{self._tag(nonce, body).hex()}"

    def open(self, text: str) -> bytes:
        """The key `seal` stored as `text` (b"" for ""); `BrokenSeal` saying why when it cannot be opened."""
        if not text:
            return b""
        if not text.startswith(PREFIX):
            raise BrokenSeal("not a sealed key (written before keys were sealed, or by someone else)")
        try:
            nonce, body, tag = (bytes.fromhex(part) for part in text[len(PREFIX):].split(":"))
        except ValueError as e:
            raise BrokenSeal(f"not nonce:body:tag in hex ({e})") from None
        if len(nonce) != NONCE_BYTES or not hmac.compare_digest(tag, self._tag(nonce, body)):
            raise BrokenSeal("its tag does not match: sealed under another learner secret, or altered")
        return bytes(a ^ b for a, b in zip(body, self._pad(nonce, len(body)), strict=True))

    def _pad(self, nonce: bytes, length: int) -> bytes:
        blocks = (hmac.new(self._seal, b"pad\n%d\n" % i + nonce, hashlib.sha256).digest()
                  for i in range(-(-length // 32)))
        return b"".join(blocks)[:length]

    def _tag(self, nonce: bytes, body: bytes) -> bytes:
        return hmac.new(self._seal, b"tag\n" + nonce + body, hashlib.sha256).digest()[:TAG_BYTES]

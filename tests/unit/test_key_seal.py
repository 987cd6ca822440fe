"""Keys sealed in the controller's state (`controller/key_seal.py`): opened only under the same secret."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from asyncrl.controller.key_seal import PREFIX, BrokenSeal, KeySeal


def test_a_sealed_key_opens_under_its_secret_and_never_reads_the_same_twice():
    seal, key = KeySeal(b"learner secret"), bytes(range(32))
    first, second = seal.seal(key), seal.seal(key)
    assert first != second and first.startswith(PREFIX)
    assert key.hex() not in first and seal.open(first) == seal.open(second) == key
    long_key = bytes(range(48))  # more than one pad block
    assert seal.open(seal.seal(long_key)) == long_key
    assert seal.seal(b"") == "" and seal.open("") == b""


def test_the_pad_is_the_hmac_of_the_nonce_under_the_seal():
    """By hand: the seal is HMAC(secret, label), the pad HMAC(seal, "pad\\n0\\n" + nonce), the body key XOR pad."""
    seal, key = KeySeal(b"s"), b"\x01" * 32
    nonce_hex, body_hex, _tag = seal.seal(key)[len(PREFIX):].split(":")
    root = hmac.new(b"s", b"asyncrl controller state seal", hashlib.sha256).digest()
    pad = hmac.new(root, b"pad\n0\n" + bytes.fromhex(nonce_hex), hashlib.sha256).digest()
    assert bytes.fromhex(body_hex) == bytes(a ^ b for a, b in zip(key, pad, strict=True))


def flip_hex(text: str, at: int) -> str:
    return text[:at] + format(int(text[at], 16) ^ 1, "x") + text[at + 1:]


@pytest.mark.parametrize("change, why", [
    (lambda text, key: KeySeal(b"another secret").seal(key), "tag does not match"),
    (lambda text, key: flip_hex(text, len(text) - 1), "tag does not match"),  # the tag
    (lambda text, key: flip_hex(text, text.rindex(":") - 1), "tag does not match"),  # the body
    (lambda text, key: key.hex(), "not a sealed key"),
    (lambda text, key: PREFIX + "zz:00:00", "not nonce:body:tag"),
    (lambda text, key: PREFIX + "00:00:00", "tag does not match"),
])  # fmt: skip
def test_a_key_sealed_elsewhere_or_altered_does_not_open(change, why):
    seal, key = KeySeal(b"learner secret"), bytes(range(32))
    with pytest.raises(BrokenSeal, match=why):
        seal.open(change(seal.seal(key), key))

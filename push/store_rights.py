"""What a push member may do in the learner's store: torch's TCPStore commands, read one by one and judged
against the member's own keys before the store sees them.

The gate (`push.store_gate`) lets in whoever proves a key. The store's own key (`PushOffer.store_key`) is the
learner's and the controller's; a receiver gets, in its signed order, a key of its own (`member_key`): one
per broadcast group and rank. Such a member reads what it likes (the store holds no secret: in-band orders
carry no key), and writes only what its rank writes in a push of its group:

| command                  | key (as the store spells it)          | what it may hold                           |
|--------------------------|----------------------------------------|--------------------------------------------|
| set                      | `/push/<push>//ready/<rank>`           | `ok` or `no-group` (`push.rendezvous`)     |
| set                      | `/push/<push>//ack/<rank>`             | a `PushAck`, at most `MAX_ACK_BYTES`       |
| set                      | `/<group key>/<device>/<rank>`         | gloo's address of its rank                 |
| compare-and-set "" -> `wake` | `/order/<group id>/after/<push>`   | the wake of its own wait (`push.in_band`)  |
| compare-and-set "" -> ""   | `/current_push`                      | a read (`rendezvous.current_push`)         |

`<push>` must be a push the sender opened on the member's group, with `<rank>` in it (`OpenPushes`): a push the
sender has not opened yet (its receivers can hear of it first) holds the member's command until it does, for
at most `DEFER_S`. Anything else (another rank's key, a verdict, the manifest, a delete, a value over its
bound, a command this module does not know) closes the member's connection: the store never sees it.

The protocol is torch's (`TCPStoreLibUvBackend.cpp`): one byte of command type, then little-endian 64-bit
lengths before each key and value; torch's client puts `/` before every key, and a `PrefixStore` joins its
prefix and the key with another `/`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass

from asyncrl.core.checks.validation import MAX_NAME
from asyncrl.push.plan import STORE_KEY_BYTES, PushPlan

DEFER_S = 10.0
"""How long a member's write into a push the sender has not opened yet waits for it to open."""
MAX_KEY_BYTES = 1024
MAX_KEYS = 256
"""Keys in one check, wait or multi-get."""
MAX_ACK_BYTES = 16 << 10
MAX_ADDRESS_BYTES = 4 << 10
MAX_VALUE_BYTES = 64 << 10
"""The largest value a member's command may carry at all (larger ones are refused before they are read)."""
PUSHES_KEPT = 256
"""Pushes the gate remembers the group of (older ones take no member's write any more)."""

_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.:@-]{{0,{MAX_NAME - 1}}}"
"""A push or group id (`validation.check_name`)."""
_RANK = r"[1-9][0-9]{0,6}"
_READY = re.compile(rf"/push/(?P<push>{_NAME})//ready/(?P<rank>{_RANK})")
_ACK = re.compile(rf"/push/(?P<push>{_NAME})//ack/(?P<rank>{_RANK})")
_ORDER = re.compile(rf"/order/(?P<group>{_NAME})/after/(?P<push>{_NAME})")
_READY_STATES = (b"ok", b"no-group")
"""`rendezvous.READY` and `NO_GROUP`, and `in_band.WAKE` below: spelled here, since this module is torch-free
(the controller imports it) and those import torch."""
_WAKE = b"wake"
_CURRENT_PUSH = "/current_push"


class Op(enum.IntEnum):
    """torch's `QueryType` (TCPStoreBackend.hpp), the part a member may send."""

    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13


_READS = {Op.GET, Op.CHECK, Op.WAIT, Op.MULTI_GET}
_PLAIN = {Op.VALIDATE: 4, Op.PING: 4, Op.CANCEL_WAIT: 0, Op.GETNUMKEYS: 0}
"""Commands of a fixed size (bytes after the type) that touch no key."""


class Refused(Exception):
    """A member's command the store must not see; the message names the command and the key."""


@dataclass(frozen=True)
class Command:
    op: Op
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Member:
    """Who proved a member key: rank `rank` of the group whose store prefix is `group_key`."""

    group_key: str
    rank: int

    @property
    def identity(self) -> bytes:
        return f"{self.group_key}\n{self.rank}".encode()

    @classmethod
    def parse(cls, identity: bytes) -> Member:
        try:
            group_key, rank = identity.decode().split("\n")
            member = cls(group_key, int(rank))
        except ValueError:
            raise Refused("an identity that is not '<group key>\\n<rank>'") from None
        if member.rank < 1 or not re.fullmatch(rf"(group/{_NAME}|push/{_NAME}/group)/", group_key):
            raise Refused(f"an identity that names no group and rank: {identity[:80]!r}")
        return member


def member_key(store_key: bytes, member: Member) -> bytes:
    """The key `member` proves at the gate, derived from the store's own: the controller hands it to that
    receiver alone, in its signed order, and the gate derives it again from the identity the member names."""
    return hmac.new(store_key, b"member\n" + member.identity, hashlib.sha256).digest()


class OpenPushes:
    """The pushes the sender opened (the group and size of each), newest last, at most `PUSHES_KEPT`."""

    def __init__(self):
        self._pushes: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def open(self, push_id: str, group_key: str, world_size: int) -> None:
        self._pushes[push_id] = (group_key, world_size)
        self._pushes.move_to_end(push_id)
        while len(self._pushes) > PUSHES_KEPT:
            self._pushes.popitem(last=False)

    def get(self, push_id: str) -> tuple[str, int] | None:
        return self._pushes.get(push_id)


class Deferred(Exception):
    """The command writes into `push_id`, which the sender has not opened yet: judge it again once it has."""

    def __init__(self, push_id: str):
        super().__init__(push_id)
        self.push_id = push_id


def judge(command: Command, member: Member, pushes: OpenPushes) -> None:
    """Return if `member` may send `command`; raise Refused (why) or Deferred (not yet)."""
    if command.op in _PLAIN or command.op in _READS:
        return
    if command.op == Op.SET:
        return _judge_set(command.keys[0], command.values[0], member, pushes)
    if command.op == Op.COMPARE_SET:
        key, expected, desired = command.keys[0], *command.values
        if key == _CURRENT_PUSH and expected == desired == b"":
            return
        if _ORDER.fullmatch(key) and expected == b"" and desired == _WAKE:
            found = _ORDER.fullmatch(key)
            if member.group_key == f"group/{found['group']}/":
                return _judge_push(found["push"], member, pushes)
        raise Refused(f"compare_set of {key!r}: not this member's to write")
    raise Refused(f"{command.op.name.lower()}" + (f" of {command.keys[0]!r}" if command.keys else "")
                  + ": members do not send it")


def _judge_set(key: str, value: bytes, member: Member, pushes: OpenPushes) -> None:
    for pattern, fits, bound in ((_READY, value in _READY_STATES, "ok or no-group"),
                                 (_ACK, len(value) <= MAX_ACK_BYTES, f"at most {MAX_ACK_BYTES} bytes")):
        found = pattern.fullmatch(key)
        if found:
            if int(found["rank"]) != member.rank:
                raise Refused(f"set of {key!r}: rank {member.rank} writes only its own keys")
            if not fits:
                raise Refused(f"set of {key!r}: the value must be {bound}, got {len(value)} bytes")
            return _judge_push(found["push"], member, pushes)
    gloo = re.fullmatch(rf"/{re.escape(member.group_key)}/[0-9]{{1,3}}/(?P<rank>{_RANK})", key)
    if gloo and int(gloo["rank"]) == member.rank:
        if len(value) > MAX_ADDRESS_BYTES:
            raise Refused(f"set of {key!r}: an address of at most {MAX_ADDRESS_BYTES} bytes, got {len(value)}")
        return
    raise Refused(f"set of {key!r}: not this member's to write")


def _judge_push(push_id: str, member: Member, pushes: OpenPushes) -> None:
    """A write of `member`'s into `push_id`: only into a push of its group that has its rank."""
    opened = pushes.get(push_id)
    if opened is None:
        raise Deferred(push_id)
    group_key, world_size = opened
    if group_key != member.group_key:
        raise Refused(f"push {push_id} is not on this member's group")
    if member.rank >= world_size:
        raise Refused(f"push {push_id} has no rank {member.rank}")


class CommandReader:
    """Splits what a member sends into commands (with the bytes of each, to pass on unchanged), refusing a
    size over its bound as soon as its length is read, before its bytes arrive."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[Command, bytes]]:
        self._buffer += data
        commands = []
        while self._buffer:
            parsed = _parse(self._buffer)
            if parsed is None:
                break
            command, size = parsed
            commands.append((command, bytes(self._buffer[:size])))
            del self._buffer[:size]
        return commands


class _Incomplete(Exception):
    pass


def _parse(buffer: bytearray) -> tuple[Command, int] | None:
    """The first command in `buffer` and its size; None until all of it is there."""
    try:
        op = Op(buffer[0])
    except ValueError:
        raise Refused(f"command type {buffer[0]}: not one a member sends") from None
    at = [1]

    def take(n: int) -> bytes:
        if len(buffer) < at[0] + n:
            raise _Incomplete
        chunk = bytes(buffer[at[0]:at[0] + n])
        at[0] += n
        return chunk

    def length(bound: int, what: str) -> int:
        (n,) = struct.unpack("<Q", take(8))
        if n > bound:
            raise Refused(f"{op.name.lower()}: a {what} of {n} bytes (at most {bound})")
        return n

    def key() -> str:
        raw = take(length(MAX_KEY_BYTES, "key"))
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise Refused(f"{op.name.lower()}: a key that is not UTF-8") from None

    def value() -> bytes:
        return take(length(MAX_VALUE_BYTES, "value"))

    try:
        if op in _PLAIN:
            take(_PLAIN[op])
            return Command(op), at[0]
        if op in (Op.CHECK, Op.WAIT, Op.MULTI_GET):
            count = length(MAX_KEYS, "key count")
            return Command(op, tuple(key() for _ in range(count))), at[0]
        if op == Op.MULTI_SET:
            raise Refused("multi_set: members do not send it")
        keys = (key(),)
        if op in (Op.GET, Op.DELETE_KEY):
            return Command(op, keys), at[0]
        if op == Op.ADD:
            take(8)
            return Command(op, keys), at[0]
        values = (value(), value()) if op == Op.COMPARE_SET else (value(),)
        return Command(op, keys, values), at[0]
    except _Incomplete:
        return None


def member_plan(plan: PushPlan, rank: int) -> PushPlan:
    """`plan` as the controller orders it to `rank`: with that rank's member key in place of the store's own."""
    return dataclasses.replace(plan, store_key=member_key(plan.store_key, Member(plan.group_key, rank)))


UNSENT_KEY = bytes(STORE_KEY_BYTES)
"""The store key of a plan the learner publishes in its store (an in-band order): none. Each member puts in
the key it holds for the group, which is what the controller signed for it (`receiver.PushListener`)."""

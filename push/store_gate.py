"""The learner's push store behind a gate: only a caller that proves a key gets a byte through, and a member
only the commands its rank sends.

torch's TCPStore (the join handshake, the broadcast groups' rendezvous, in-band orders and acks, manifests)
takes any command from whoever reaches its port, without credentials and without a size limit: one key
written under a push's prefix called every push off, and a large value grows the learner. So the store
itself listens on loopback only, and the address a plan names is its gate (`StoreGate`), which pipes a
connection through only after this handshake (bounded sizes, at most `HANDSHAKE_S`):

    client -> gate:  MAGIC, client nonce (16 bytes), key id (8), identity length (2), identity
    gate -> client:  KNOWN (one byte; UNKNOWN_KEY and a hang-up for a key it does not hold),
                     gate nonce (16), HMAC(key, "gate\\n" + client nonce + gate nonce)
    client -> gate:  HMAC(key, "member\\n" + client nonce + gate nonce)
    gate -> client:  ACCEPTED (one byte), then the store's own protocol, both ways

The store's own key is 32 random bytes (`new_store_key`), made by the learner and told to the controller
only; whoever proves it (the controller marking a receiver unreachable) is piped through as it is. A
receiver gets a key of its own in its signed order (`store_rights.member_key`: one per group and rank, named
by the identity it sends), and the gate reads each of its commands and passes on only those of its rank
(`push.store_rights`). The key id (`key_id`) says which of the two a caller proves. A fresh nonce on each side
makes every proof good once. The gate reads nothing else from a caller that has not proved a key, and holds
at most `MAX_UNPROVEN` such connections (a new one closes the oldest).

A member's TCPStore client cannot speak the handshake, so it connects to a forwarder of its own on loopback
(`gated_client`): the forwarder makes the authenticated connection first, then accepts exactly one local
connection (the client's, made at once) and pipes the two together. A process on the member's own host could
race the client for it; the member's host is trusted with the key anyway.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import functools
import hashlib
import hmac
import logging
import secrets
import socket
import sys
import threading

from torch.distributed import DistNetworkError, TCPStore

from asyncrl.push.plan import STORE_KEY_BYTES
from asyncrl.push.store_pipes import LoopThread, Relay, pipe, unread
from asyncrl.push.store_rights import (
    DEFER_S,
    CommandReader,
    Deferred,
    Member,
    OpenPushes,
    Refused,
    judge,
    member_key,
)

log = logging.getLogger(__name__)

MAGIC = b"asyncrl-push-store/2\n"
NONCE_BYTES = 16
KEY_ID_BYTES = 8
MAX_IDENTITY_BYTES = 512
MAC_BYTES = 32
ACCEPTED = b"\x01"
KNOWN, UNKNOWN_KEY = b"\x01", b"\x00"
HANDSHAKE_S = 5.0
"""How long a caller has to prove the key before the gate hangs up."""
MAX_UNPROVEN = 64
"""Connections the gate holds at once that have not proved the key yet; a new one closes the oldest."""
MAX_MEMBER_CONNECTIONS = 8
"""Connections one member key holds open at once (a receiver uses two, a third for a moment); more are refused,
so that a member cannot make the learner hold unbounded buffers."""


class SenderGone(ConnectionRefusedError):
    """Nothing listens at the sender's store any more: its process is gone, and so is every push it ordered.
    Raised at once, from the refused connect: a receiver waiting out its time-out instead would hold its one
    push at a time while the pushes of a new sender (a learner restarted elsewhere) time out behind it."""


class StoreRefused(DistNetworkError):
    """The store's gate did not take this key, or what answered at the address is no gate of this key (a
    learner restarted there has a new store). A `DistNetworkError`, as a store that cannot be reached is."""


def new_store_key() -> bytes:
    return secrets.token_bytes(STORE_KEY_BYTES)


def key_id(key: bytes) -> bytes:
    """Which key a caller proves (the store's own, or the member key of the identity it names): a hash that
    gives nothing away about the key."""
    return hashlib.sha256(b"asyncrl-push-store key id\n" + key).digest()[:KEY_ID_BYTES]


def handshake_mac(key: bytes, role: bytes, client_nonce: bytes, gate_nonce: bytes) -> bytes:
    return hmac.new(key, role + b"\n" + client_nonce + gate_nonce, hashlib.sha256).digest()


class _MemberRelay(Relay):
    """The member's end of its pipe: each command it sends reaches the store only once `store_rights.judge`
    allows it; a command refused hangs up on the member (and counts in the gate's `refused_commands`), one
    that writes into a push not opened yet holds the member's stream until it is (at most `DEFER_S`)."""

    def __init__(self, store: asyncio.Transport, done: asyncio.Future, *, own: asyncio.Transport, gate: StoreGate,
                 member: Member):  # fmt: skip
        super().__init__(store, done)
        self.own, self.gate, self.member = own, gate, member
        self.reader = CommandReader()
        self.pending: collections.deque = collections.deque()
        self.holding = False

    def data_received(self, data: bytes) -> None:
        try:
            self.pending.extend(self.reader.feed(data))
        except Refused as err:
            return self._refuse(err)
        self._pass_on()
        if self.holding:  # flow control may have resumed reading meanwhile: nothing more until the push opens
            self.own.pause_reading()

    def _pass_on(self) -> None:
        while self.pending and not self.holding:
            command, raw = self.pending[0]
            try:
                judge(command, self.member, self.gate.pushes)
            except Deferred as later:
                return self._hold(later.push_id)
            except Refused as err:
                return self._refuse(err)
            self.pending.popleft()
            self.other.write(raw)

    def _hold(self, push_id: str) -> None:
        self.holding = True
        self.own.pause_reading()
        asyncio.get_running_loop().create_task(self._until_open(push_id))

    async def _until_open(self, push_id: str) -> None:
        if not await self.gate.opened(push_id, DEFER_S):
            return self._refuse(Refused(f"a write into push {push_id}, which the sender did not open within "
                                        f"{DEFER_S:g} s"))
        self.holding = False
        if not self.own.is_closing():
            self.own.resume_reading()
            self._pass_on()

    def _refuse(self, err: Refused) -> None:
        self.gate.refuse_command(self.member, str(err))
        self.pending.clear()
        self.own.close()
        self.other.close()


class StoreGate:
    """Listens on `listener` (a bound, listening socket) and pipes each connection that proves `key` to the
    store at 127.0.0.1:`store_port`."""

    def __init__(self, listener: socket.socket, store_port: int, key: bytes):
        self.port = listener.getsockname()[1]
        self._store_port, self._key = store_port, key
        self._unproven: dict[asyncio.StreamWriter, None] = {}
        """Connections still to prove the key, oldest first."""
        self._open: set[asyncio.StreamWriter] = set()
        """Every connection's writer (both ends of a pipe), for `close`."""
        self._tasks: set[asyncio.Task] = set()
        self.refused = 0
        """Connections hung up on without the key proved (a bad greeting or proof, too slow, the oldest of too
        many); a bare connect-and-close (a check that the port listens) is not counted."""
        self.refused_commands = 0
        """Members hung up on for a command not theirs to send (`push.store_rights`)."""
        self.pushes = OpenPushes()
        """The pushes the sender opened: a member writes only into those of its group."""
        self._opening: dict[str, list[asyncio.Future]] = {}
        """Members' writes waiting for a push to open, by push id."""
        self._member_connections: collections.Counter[Member] = collections.Counter()
        self._loop = LoopThread(f"push-store-gate-{self.port}")
        self._server = self._loop.run(self._start(listener), timeout_s=10)

    async def _start(self, listener: socket.socket):
        return await asyncio.start_server(self._serve, sock=listener)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.add(asyncio.current_task())
        self._open.add(writer)
        try:
            await self._serve_one(reader, writer)
        finally:
            self._open.discard(writer)
            self._tasks.discard(asyncio.current_task())

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._unproven) >= MAX_UNPROVEN:
            # Hang up on the oldest instead of refusing the newest: idle connections held open by an
            # outsider must not lock the members out (a member proves its key within a millisecond).
            self._refuse(next(iter(self._unproven)), f"the oldest of {MAX_UNPROVEN} that had not proved the key")
        self._unproven[writer] = None
        try:
            proved: bool | None | Member = await asyncio.wait_for(self._handshake(reader, writer), HANDSHAKE_S)
        except asyncio.IncompleteReadError as err:
            # Nothing at all before the close: a check that the port listens (a TCP probe).
            proved = None if not err.partial else False
        except (TimeoutError, ConnectionError, OSError, Refused):
            proved = False
        finally:
            self._unproven.pop(writer, None)
        if not proved:
            if proved is None or writer.is_closing():
                writer.close()
            else:
                self._refuse(writer, "the key was not proved")
            return
        try:
            try:
                _, store = await asyncio.open_connection("127.0.0.1", self._store_port)
            except OSError:
                writer.close()
                return
            self._open.add(store)
            try:
                own = writer.transport
                relay = functools.partial(_MemberRelay, own=own, gate=self, member=proved) \
                    if isinstance(proved, Member) else Relay
                await pipe(own, store.transport, unread(reader), relay)
            finally:
                self._open.discard(store)
        finally:
            if isinstance(proved, Member):
                self._release(proved)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool | Member:
        """True for the store's own key, the member for a member key, False for neither."""
        hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES + KEY_ID_BYTES + 2)
        if not hmac.compare_digest(hello[:len(MAGIC)], MAGIC):
            return False
        client_nonce = hello[len(MAGIC):len(MAGIC) + NONCE_BYTES]
        claimed_id = hello[len(MAGIC) + NONCE_BYTES:-2]
        identity_bytes = int.from_bytes(hello[-2:], "big")
        if identity_bytes > MAX_IDENTITY_BYTES:
            return False
        identity = await reader.readexactly(identity_bytes)
        key, member = self._key, True
        if not hmac.compare_digest(claimed_id, key_id(self._key)):
            try:
                member = Member.parse(identity)
                key = member_key(self._key, member)
            except Refused:
                key = b""
            if not key or not hmac.compare_digest(claimed_id, key_id(key)):
                writer.write(UNKNOWN_KEY)  # a caller with an old key learns it at once (a restarted learner)
                await writer.drain()
                return False
        gate_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(KNOWN + gate_nonce + handshake_mac(key, b"gate", client_nonce, gate_nonce))
        await writer.drain()
        proof = await reader.readexactly(MAC_BYTES)
        if not hmac.compare_digest(proof, handshake_mac(key, b"member", client_nonce, gate_nonce)):
            return False
        if isinstance(member, Member):
            if self._member_connections[member] >= MAX_MEMBER_CONNECTIONS:
                return False
            self._member_connections[member] += 1  # given back when its pipe ends (`_serve_one`)
        try:
            writer.write(ACCEPTED)
            await writer.drain()
        except BaseException:
            if isinstance(member, Member):
                self._release(member)
            raise
        return member

    def _release(self, member: Member) -> None:
        self._member_connections[member] -= 1
        if not self._member_connections[member]:
            del self._member_connections[member]

    def open_push(self, push_id: str, group_key: str, world_size: int) -> None:
        """The sender: `push_id` begins on the group at `group_key` with `world_size` ranks (its members may
        write their keys of it from now on). Any thread."""
        with contextlib.suppress(RuntimeError):  # the gate is closed: nobody writes any more
            self._loop.loop.call_soon_threadsafe(self._opened_now, push_id, group_key, world_size)

    def _opened_now(self, push_id: str, group_key: str, world_size: int) -> None:
        self.pushes.open(push_id, group_key, world_size)
        for waiter in self._opening.pop(push_id, []):
            if not waiter.done():
                waiter.set_result(True)

    async def opened(self, push_id: str, timeout_s: float) -> bool:
        """Whether the sender opens `push_id` within `timeout_s` (at once if it has)."""
        if self.pushes.get(push_id) is not None:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._opening.setdefault(push_id, []).append(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        finally:
            waiters = self._opening.get(push_id, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._opening.pop(push_id, None)

    def refuse_command(self, member: Member, why: str) -> None:
        self.refused_commands += 1
        log.warning("push store gate on port %d: hung up on rank %d of %s: %s (%d members so far)", self.port,
                    member.rank, member.group_key, why, self.refused_commands)

    def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("push store gate on port %d: hung up on a connection (%s; %d so far)", self.port, why,
                        self.refused)
        writer.close()

    def close(self) -> None:
        """Stop listening and hang up every connection (a member's pipe then ends as the store's would). The
        port refuses connections when this returns (so a late member learns at once that the sender is gone),
        unless called on the gate's own thread (by a garbage collection there), where it cannot wait."""
        loop = self._loop.loop
        if loop.is_closed():
            return

        listening_stopped = threading.Event()

        async def shut():
            self._server.close()
            for writer in list(self._open):
                writer.close()
            listening_stopped.set()
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=HANDSHAKE_S)
            loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(shut(), loop)
        except RuntimeError:  # the loop is closing already
            return
        if threading.current_thread() is not self._loop.thread:
            listening_stopped.wait(HANDSHAKE_S)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (port 0: any free one) and listening."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(1024)
    except OSError:
        listener.close()
        raise
    return listener


class GatedStore(TCPStore):
    """The learner's store: a TCPStore on loopback, reached from elsewhere through its gate. `port` is the
    gate's (what plans name), `key` what a member proves there (a fresh one unless given)."""

    def __init__(self, host: str, port: int, timeout_s: float, key: bytes | None = None):
        public = listening_socket(host, port)
        try:
            private = listening_socket("127.0.0.1", 0)
        except OSError:
            public.close()
            raise
        # TCPStore by itself listens on every interface whatever host it is given: it gets the loopback socket.
        private_port = private.getsockname()[1]
        super().__init__("127.0.0.1", private_port, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=private.detach())
        self.key = key or new_store_key()
        self.gate = StoreGate(public, private_port, self.key)

    @property
    def port(self) -> int:
        return self.gate.port

    def __del__(self):
        # The store goes with its last reference (a learner's sender, a test's variable): so does its gate.
        gate = self.__dict__.get("gate")
        if gate is not None and not sys.is_finalizing():  # at exit the daemon thread simply goes
            gate.close()

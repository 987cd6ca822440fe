"""The learner's push store behind a gate: only a caller that proves the store's key gets a byte through.

torch's TCPStore (the join handshake, the broadcast groups' rendezvous, in-band orders and acks, manifests)
takes any command from whoever reaches its port, without credentials and without a size limit: one key
written under a push's prefix called every push off, and a large value grows the learner. So the store
itself listens on loopback only, and the address a plan names is its gate (`StoreGate`), which pipes a
connection through only after this handshake (fixed sizes, at most `HANDSHAKE_S`):

    client -> gate:  MAGIC, client nonce (16 bytes)
    gate -> client:  gate nonce (16), HMAC(key, "gate\\n" + client nonce + gate nonce)
    client -> gate:  HMAC(key, "member\\n" + client nonce + gate nonce)
    gate -> client:  ACCEPTED (one byte), then the store's own protocol, both ways

The key is 32 random bytes per store (`new_store_key`), made by the learner and carried only in the plans
the controller sends each receiver over its authenticated channel (`WeightPushPlan.store_key`), so only the
members of a push reach its store, and a fresh nonce on each side makes every proof good once. The gate reads
nothing else from a caller that has not proved the key, and holds at most `MAX_UNPROVEN` such connections
(a new one closes the oldest).

A member's TCPStore client cannot speak the handshake, so it connects to a forwarder of its own on loopback
(`gated_client`): the forwarder makes the authenticated connection first, then accepts exactly one local
connection (the client's, made at once) and pipes the two together. A process on the member's own host could
race the client for it; the member's host is trusted with the key anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import logging
import secrets
import socket
import sys
import threading

from torch.distributed import DistNetworkError, TCPStore

from asyncrl.push.plan import STORE_KEY_BYTES

log = logging.getLogger(__name__)

MAGIC = b"asyncrl-push-store/1\n"
NONCE_BYTES = 16
MAC_BYTES = 32
ACCEPTED = b"\x01"
HANDSHAKE_S = 5.0
"""How long a caller has to prove the key before the gate hangs up."""
MAX_UNPROVEN = 64
"""Connections the gate holds at once that have not proved the key yet; a new one closes the oldest."""
PIPE_CHUNK = 1 << 16


class SenderGone(ConnectionRefusedError):
    """Nothing listens at the sender's store any more: its process is gone, and so is every push it ordered.
    Raised at once, from the refused connect: a receiver waiting out its time-out instead would hold its one
    push at a time while the pushes of a new sender (a learner restarted elsewhere) time out behind it."""


class StoreRefused(DistNetworkError):
    """The store's gate did not take this key, or what answered at the address is no gate of this key (a
    learner restarted there has a new store). A `DistNetworkError`, as a store that cannot be reached is."""


def new_store_key() -> bytes:
    return secrets.token_bytes(STORE_KEY_BYTES)


def _mac(key: bytes, role: bytes, client_nonce: bytes, gate_nonce: bytes) -> bytes:
    return hmac.new(key, role + b"\n" + client_nonce + gate_nonce, hashlib.sha256).digest()


class _Loop:
    """One asyncio loop on a daemon thread: the gate's, or a process's forwarders'."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_forever()
        self.loop.close()

    def run(self, coroutine, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)


class _Relay(asyncio.Protocol):
    """One end of a pipe: what arrives on this connection is written to `other` (the other connection's
    transport) in the same callback, and `other`'s full write buffer pauses reading here. Cheaper than a pair
    of stream coroutines by a loop round per message: a store command is small, and a push makes a few."""

    def __init__(self, other: asyncio.Transport, done: asyncio.Future):
        self.other, self.done = other, done

    def data_received(self, data: bytes) -> None:
        self.other.write(data)

    def eof_received(self) -> bool:
        self.other.close()
        return False

    def connection_lost(self, exc) -> None:
        self.other.close()
        if not self.done.done():
            self.done.set_result(None)

    def pause_writing(self) -> None:
        self.other.pause_reading()

    def resume_writing(self) -> None:
        self.other.resume_reading()


def _join(a: asyncio.Transport, b: asyncio.Transport, buffered: bytes = b"") -> asyncio.Future:
    """Pipe two open connections both ways from now on (`buffered`: what `a` already delivered, sent to `b`
    first). The future is done when either ends."""
    done = asyncio.get_running_loop().create_future()
    a.set_protocol(_Relay(b, done))
    b.set_protocol(_Relay(a, done))
    if buffered:
        b.write(buffered)
    return done


def _unread(reader: asyncio.StreamReader) -> bytes:
    """What a stream received beyond what was read from it before its pipe was joined: a client may send its
    first bytes at once (the member's TCPStore client on the forwarder; a member right after ACCEPTED)."""
    return bytes(getattr(reader, "_buffer", b""))


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
        self._loop = _Loop(f"push-store-gate-{self.port}")
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
            proved = await asyncio.wait_for(self._handshake(reader, writer), HANDSHAKE_S)
        except asyncio.IncompleteReadError as err:
            # Nothing at all before the close: a check that the port listens (a TCP probe).
            proved = None if not err.partial else False
        except (TimeoutError, ConnectionError, OSError):
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
            _, store = await asyncio.open_connection("127.0.0.1", self._store_port)
        except OSError:
            writer.close()
            return
        self._open.add(store)
        try:
            await _join(writer.transport, store.transport, _unread(reader))
        finally:
            self._open.discard(store)

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        hello = await reader.readexactly(len(MAGIC) + NONCE_BYTES)
        if not hmac.compare_digest(hello[:len(MAGIC)], MAGIC):
            return False
        client_nonce, gate_nonce = hello[len(MAGIC):], secrets.token_bytes(NONCE_BYTES)
        writer.write(gate_nonce + _mac(self._key, b"gate", client_nonce, gate_nonce))
        await writer.drain()
        proof = await reader.readexactly(MAC_BYTES)
        if not hmac.compare_digest(proof, _mac(self._key, b"member", client_nonce, gate_nonce)):
            return False
        writer.write(ACCEPTED)
        await writer.drain()
        return True

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


_FORWARDERS: _Loop | None = None
_FORWARDERS_LOCK = threading.Lock()


def _forwarders() -> _Loop:
    global _FORWARDERS
    with _FORWARDERS_LOCK:
        if _FORWARDERS is None:
            _FORWARDERS = _Loop("push-store-forwarders")
        return _FORWARDERS


async def _prove(host: str, port: int, key: bytes, timeout_s: float) -> tuple:
    """An authenticated connection to the gate at host:port (StoreRefused when it does not take the key)."""
    stream = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    reader, writer = stream
    try:
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(MAGIC + client_nonce)
        await writer.drain()
        answer = await asyncio.wait_for(reader.readexactly(NONCE_BYTES + MAC_BYTES), HANDSHAKE_S)
        gate_nonce, gate_mac = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
        if not hmac.compare_digest(gate_mac, _mac(key, b"gate", client_nonce, gate_nonce)):
            raise StoreRefused(f"the store at {host}:{port} does not hold this plan's store_key")
        writer.write(_mac(key, b"member", client_nonce, gate_nonce))
        await writer.drain()
        if await asyncio.wait_for(reader.read(1), HANDSHAKE_S) != ACCEPTED:
            raise StoreRefused(f"the store at {host}:{port} refused this plan's store_key")
    except (asyncio.IncompleteReadError, TimeoutError) as err:
        writer.close()
        raise StoreRefused(f"no store gate answered at {host}:{port} ({type(err).__name__})") from None
    except BaseException:
        writer.close()
        raise
    return stream


async def _forward(host: str, port: int, key: bytes, timeout_s: float) -> int:
    """A loopback port whose first connection is piped through an authenticated one to the gate."""
    gate = await _prove(host, port, key, timeout_s)
    taken = asyncio.get_running_loop().create_future()

    async def accept(reader, writer):
        if taken.done():
            writer.close()
            return
        taken.set_result(None)
        server.close()
        await _join(writer.transport, gate[1].transport, _unread(reader))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)

    async def expire():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(taken), timeout_s)
        if not taken.done():
            taken.cancel()
            server.close()
            gate[1].close()

    asyncio.get_running_loop().create_task(expire())
    return server.sockets[0].getsockname()[1]


def gated_client(address: str, key: bytes, timeout_s: float) -> TCPStore:
    """A member's client of the store whose gate listens at `address` (host:port), proving `key`;
    SenderGone when nothing listens there, StoreRefused when the gate does not take the key."""
    host, port = address.rsplit(":", 1)
    try:
        local_port = _forwarders().run(_forward(host.strip("[]"), int(port), key, timeout_s),
                                       timeout_s + HANDSHAKE_S)
    except ConnectionRefusedError as err:
        raise SenderGone(f"nothing listens at the sender's store {address}") from err
    except (OSError, TimeoutError) as err:
        raise DistNetworkError(f"cannot reach the store gate at {address}: {err!r}") from err
    return TCPStore("127.0.0.1", local_port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))

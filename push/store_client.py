"""A client of the learner's push store through its gate (`push.store_gate`): the handshake on the client's
side, and a forwarder on loopback that torch's own TCPStore client connects to."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hmac
import secrets
import threading

from torch.distributed import DistNetworkError, TCPStore

from asyncrl.push.store_gate import (
    ACCEPTED,
    HANDSHAKE_S,
    KNOWN,
    MAC_BYTES,
    MAGIC,
    NONCE_BYTES,
    SenderGone,
    StoreRefused,
    handshake_mac,
    key_id,
)
from asyncrl.push.store_pipes import LoopThread, pipe, unread
from asyncrl.push.store_rights import Member

_FORWARDERS: LoopThread | None = None
_FORWARDERS_LOCK = threading.Lock()


def _forwarders() -> LoopThread:
    global _FORWARDERS
    with _FORWARDERS_LOCK:
        if _FORWARDERS is None:
            _FORWARDERS = LoopThread("push-store-forwarders")
        return _FORWARDERS


async def _prove(host: str, port: int, key: bytes, identity: bytes, timeout_s: float) -> tuple:
    """An authenticated connection to the gate at host:port (StoreRefused when it does not take the key)."""
    stream = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    reader, writer = stream
    try:
        client_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(MAGIC + client_nonce + key_id(key) + len(identity).to_bytes(2, "big") + identity)
        await writer.drain()
        if await asyncio.wait_for(reader.readexactly(1), HANDSHAKE_S) != KNOWN:
            raise StoreRefused(f"the store at {host}:{port} does not hold this plan's store_key")
        answer = await asyncio.wait_for(reader.readexactly(NONCE_BYTES + MAC_BYTES), HANDSHAKE_S)
        gate_nonce, gate_mac = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
        if not hmac.compare_digest(gate_mac, handshake_mac(key, b"gate", client_nonce, gate_nonce)):
            raise StoreRefused(f"the store at {host}:{port} does not hold this plan's store_key")
        writer.write(handshake_mac(key, b"member", client_nonce, gate_nonce))
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


async def _forward(host: str, port: int, key: bytes, identity: bytes, timeout_s: float) -> int:
    """A loopback port whose first connection is piped through an authenticated one to the gate."""
    gate = await _prove(host, port, key, identity, timeout_s)
    taken = asyncio.get_running_loop().create_future()

    async def accept(reader, writer):
        if taken.done():
            writer.close()
            return
        taken.set_result(None)
        server.close()
        await pipe(writer.transport, gate[1].transport, unread(reader))

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


def gated_client(address: str, key: bytes, timeout_s: float, member: Member | None = None) -> TCPStore:
    """A client of the store whose gate listens at `address` (host:port), proving `key`: the store's own, or
    `member`'s key (`store_rights.member_key`); SenderGone when nothing listens there, StoreRefused when the
    gate does not take the key."""
    host, port = address.rsplit(":", 1)
    identity = member.identity if member is not None else b""
    try:
        local_port = _forwarders().run(_forward(host.strip("[]"), int(port), key, identity, timeout_s),
                                       timeout_s + HANDSHAKE_S)
    except ConnectionRefusedError as err:
        raise SenderGone(f"nothing listens at the sender's store {address}") from err
    except (OSError, TimeoutError) as err:
        raise DistNetworkError(f"cannot reach the store gate at {address}: {err!r}") from err
    return TCPStore("127.0.0.1", local_port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))

"""The plumbing under the push store's gate and its clients' forwarders: an asyncio loop on a thread of its
own, and pipes that join two connections (`push.store_gate`, `push.store_client`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class LoopThread:
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


class Relay(asyncio.Protocol):
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


def pipe(a: asyncio.Transport, b: asyncio.Transport, buffered: bytes = b"",
         relay: Callable[[asyncio.Transport, asyncio.Future], Relay] = Relay) -> asyncio.Future:  # fmt: skip
    """Pipe two open connections both ways from now on (`buffered`: what `a` already delivered, passed on
    first). What `a` sends goes through `relay(b, done)` (one that checks it, say), what `b` sends straight to
    `a`. The future is done when either ends."""
    done = asyncio.get_running_loop().create_future()
    from_a = relay(b, done)
    a.set_protocol(from_a)
    b.set_protocol(Relay(a, done))
    if buffered:
        from_a.data_received(buffered)
    return done


def unread(reader: asyncio.StreamReader) -> bytes:
    """What a stream received beyond what was read from it before its pipe was joined: a client may send its
    first bytes at once (the member's TCPStore client on the forwarder; a member right after ACCEPTED)."""
    return bytes(getattr(reader, "_buffer", b""))

"""The replica's calls to the controller as its registration's own: `RegisteredReplica` wraps a
`ControllerStub`, keeps the push key each `RegisterReplica` answer gives (by replica id), and signs every call
that moves the run (heartbeat, leases, completions) with `replica_call_mac` under it, so no other caller holding
the token can heartbeat, lease or complete as this replica. It wraps asyncio stubs too (`asyncrl lease-load`)."""

from __future__ import annotations

import inspect

from asyncrl.core.wire.auth import replica_call_mac

REPLICA_CALLS = ("Heartbeat", "AcquireLease", "AcquireLeases", "CompleteLease", "CompleteLeases")


class RegisteredReplica:
    """A `ControllerStub` whose replica calls carry the proof of the registration they name."""

    def __init__(self, stub):
        self._stub = stub
        self._keys: dict[str, bytes] = {}

    def RegisterReplica(self, request, *args, **kwargs):
        answer = self._stub.RegisterReplica(request, *args, **kwargs)
        return self._remembered(answer) if inspect.isawaitable(answer) else self._remember(answer)

    def _remember(self, answer):
        self._keys[answer.replica_id] = answer.push_key
        return answer

    async def _remembered(self, call):
        """An asyncio stub's registration, remembered once it is answered."""
        return self._remember(await call)

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)
        return _Proven(method, self._keys) if name in REPLICA_CALLS else method


class _Proven:
    """One replica method, called directly or as `.future`, with `replica_proof` filled in."""

    def __init__(self, method, keys: dict[str, bytes]):
        self._method, self._keys = method, keys

    def _prove(self, request):
        request.replica_proof = replica_call_mac(self._keys.get(request.replica_id, b""), request.replica_id)
        return request

    def __call__(self, request, *args, **kwargs):
        return self._method(self._prove(request), *args, **kwargs)

    def future(self, request, *args, **kwargs):
        return self._method.future(self._prove(request), *args, **kwargs)

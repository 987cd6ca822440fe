"""The learner gives a dropped group's admission quota back to the controller, and its prompt to generate again
(`Controller.ReturnQuota`, taken once per entry; `learner.stale_groups: drop`, `learner.intake`)."""

from __future__ import annotations

import logging
import time

import grpc

from asyncrl.v1 import controller_pb2

log = logging.getLogger("asyncrl.learner")

PATIENCE_S = 120.0
"""How long a return is retried while the controller is unreachable (it restarts in less)."""
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def return_quota(stub, entry_id: str, trajectories: int, reason: str, prompt: int | None = None,
                 lease_id: str = "") -> None:
    """`prompt`: the stream prompt to generate again (None: not); `lease_id`: the group's lease. Both come from
    the group a replica wrote: when the controller refuses them (INVALID_ARGUMENT: a prompt it never handed
    out, a malformed lease id), the quota is returned without them, so a forged group cannot stop the learner.
    Retried while the controller is unreachable, for up to PATIENCE_S, then the error stands (the entry stays
    pending and is dropped again after the learner's restart; the controller takes it once)."""
    request = controller_pb2.ReturnQuotaRequest(entry_id=entry_id, trajectories=trajectories, reason=reason[:1000],
                                                prompt_index=prompt, lease_id=lease_id)
    deadline = time.monotonic() + PATIENCE_S
    while True:
        try:
            stub.ReturnQuota(request, timeout=30)
            return
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT and (request.HasField("prompt_index") or
                                                                  request.lease_id):
                log.warning("the group of %s names a prompt or lease the controller refuses (%s): its quota is "
                            "returned without them, its prompt not generated again", entry_id, err.details())
                request.ClearField("prompt_index")
                request.lease_id = ""
                continue
            if err.code() not in RETRIED or time.monotonic() >= deadline:
                raise
            log.warning("returning the quota of %s failed (%s), retrying", entry_id, err.code().name)
            time.sleep(1.0)

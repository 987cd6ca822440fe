"""LoRA adapters in a running vLLM engine: each pushed version loaded as an adapter of its own, each batch pinned
to the newest when it starts, the η + 1 newest (and any a running batch uses) kept loaded
(`asyncrl.core.lora.versions`).

A push needs no pause: the worker receives the adapter over the push's group and writes it in peft's format
into a directory of this replica's (`asyncrl.push.vllm_worker.AsyncRLWorkerExtension.asyncrl_receive_adapter`); the engine
then loads it with vLLM's own `add_lora`, and only once vLLM lists it as loaded does the version count as
served. Its checksum is the one the worker computed over the tensors it wrote: what the controller compares
with the learner's. Running requests keep their adapter; the base weights never change, so nothing cached is
stale.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from pathlib import Path

from asyncrl.core.lora.spec import match_adapter
from asyncrl.core.lora.versions import AdapterServing, AdapterVersions, Served
from asyncrl.core.wire.push_contract import PushOrder


def lora_id(version: int) -> int:
    """vLLM's adapter id of a version (ids start at 1)."""
    return version + 1


class VLLMAdapters:
    def __init__(self, llm, serving: AdapterServing, checkpoint_shapes: dict | None, control_lock: threading.Lock):
        self._llm = llm
        self._control = control_lock
        """The engine's lock around every send to vLLM's engine core (its client sockets are not thread-safe)."""
        self.serving = serving
        self._shapes = checkpoint_shapes
        self._versions = AdapterVersions(serving.versions_kept)
        self._lock = threading.Lock()
        self._root = Path(tempfile.mkdtemp(prefix="asyncrl-adapters-"))

    @staticmethod
    def engine_args(serving: AdapterServing) -> dict:
        """`vllm.LLM` arguments: LoRA on, the rank, two adapters per step (a batch on an older version and one
        started after a push), the kept versions in host memory."""
        return {"enable_lora": True, "max_lora_rank": serving.vllm_rank, "max_loras": 2,
                "max_cpu_loras": serving.versions_kept + 1}

    @property
    def checksum(self) -> str:
        with self._lock:
            newest = self._versions.newest
        return "" if newest is None else newest.checksum

    @property
    def loaded(self) -> list[int]:
        with self._lock:
            return self._versions.loaded

    def check(self, plan: PushOrder) -> None:
        """Refuse an adapter that does not fit the model or the rank this engine was set up for (ValueError)."""
        if plan.adapter.rank > self.serving.vllm_rank:
            raise ValueError(f"adapter push {plan.push_id}: rank {plan.adapter.rank} is above the rank "
                             f"{self.serving.vllm_rank} this engine serves (learner.lora.rank)")
        if self._shapes is not None:
            match_adapter(plan.tensors, plan.adapter, self._shapes, where=f"adapter push {plan.push_id}")

    def load(self, plan: PushOrder, rank: int, plan_data: dict) -> tuple[str, dict]:
        """Receive the adapter (worker) and load it (vLLM); returns its checksum and figures. Raises when vLLM
        does not list it afterwards: a push that did not take effect is an error."""
        from vllm.lora.request import LoRARequest

        directory = self._root / f"v{plan.version}"
        started = time.perf_counter()
        with self._control:
            (figures,) = self._llm.collective_rpc("asyncrl_receive_adapter",
                                                  args=(plan_data, rank, str(directory)))
        received = time.perf_counter()
        request = LoRARequest(f"asyncrl-v{plan.version}", lora_id(plan.version), str(directory))
        with self._control:
            self._llm.llm_engine.add_lora(request)
            listed = self._llm.llm_engine.list_loras()
        if lora_id(plan.version) not in listed:
            raise RuntimeError(f"adapter push {plan.push_id}: vLLM does not list adapter version {plan.version} "
                               "as loaded after add_lora")
        with self._lock:
            retired = self._versions.added(Served(plan.version, str(directory), figures["checksum"]))
        self._retire(retired)
        return figures["checksum"], {**figures, "receive_s": received - started,
                                     "add_lora_s": time.perf_counter() - received}

    @contextlib.contextmanager
    def pinned(self):
        """(the LoRARequest a batch starting now runs on, the version it serves), both None before the first
        adapter (the base), held until the batch ends: that version is not retired meanwhile."""
        from vllm.lora.request import LoRARequest

        with self._lock:
            served = self._versions.acquire()
        try:
            if served is None:
                yield None, None
            else:
                yield LoRARequest(f"asyncrl-v{served.version}", lora_id(served.version), served.path), served
        finally:
            with self._lock:
                retired = self._versions.release(served)
            self._retire(retired)

    def _retire(self, retired: list[Served]) -> None:
        for served in retired:
            with self._control:
                self._llm.llm_engine.remove_lora(lora_id(served.version))
            shutil.rmtree(served.path, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

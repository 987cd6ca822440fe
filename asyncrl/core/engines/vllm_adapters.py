"""LoRA adapters in a running vLLM engine: each pushed version loaded as an adapter of its own, each batch pinned
to the newest when it starts, the η + 1 newest (and any a running batch uses) kept loaded
(`asyncrl.core.lora.versions`).

A push needs no pause: the worker receives the adapter over the push's group and writes it in peft's format
into a directory of this replica's (`asyncrl.push.vllm_worker.AsyncRLWorkerExtension.asyncrl_receive_adapter`); the engine
then loads it with vLLM's own `add_lora`, and only once vLLM lists it as loaded does the version count as
served. Its checksum is the one the worker computed over the tensors it wrote: what the controller compares
with the learner's. Running requests keep their adapter; the base weights never change, so nothing cached is
stale. In a replica of several runs (`vllm_runs`) each run has a `VLLMAdapters` of its own over the one
engine: its versions, its directory, its pushes' group in the worker, and vLLM ids drawn from one counter.
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
from asyncrl.core.wire.push_contract import PushOrder, WeightUpdateStats


def lora_id(version: int) -> int:
    """vLLM's adapter id of a version (ids start at 1)."""
    return version + 1


class VLLMAdapters:
    def __init__(self, llm, serving: AdapterServing, checkpoint_shapes: dict | None, control_lock: threading.Lock,
                 run: str = "", ids=lora_id):  # fmt: skip
        self._llm = llm
        self._control = control_lock
        """The engine's lock around every send to vLLM's engine core (its client sockets are not thread-safe)."""
        self.serving = serving
        self._shapes = checkpoint_shapes
        self.run = run
        """The run these adapters are of ("": the replica's only one); it names its group in the worker."""
        self._new_id = ids
        """version -> a vLLM adapter id no other adapter of the engine holds."""
        self._ids: dict[int, int] = {}
        """Loaded version -> its vLLM id."""
        self._versions = AdapterVersions(serving.versions_kept)
        self._lock = threading.Lock()
        self._root = Path(tempfile.mkdtemp(prefix=f"asyncrl-adapters-{run}-" if run else "asyncrl-adapters-"))

    @staticmethod
    def engine_args(serving: AdapterServing) -> dict:
        """`vllm.LLM` arguments: LoRA on, the rank, two adapters per step and run (a batch on an older version
        and one started after a push), every run's kept versions in host memory."""
        return {"enable_lora": True, "max_lora_rank": serving.vllm_rank, "max_loras": 2 * serving.runs,
                "max_cpu_loras": serving.runs * (serving.versions_kept + 1)}

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

    def push(self, plan: PushOrder, rank: int, plan_data: dict) -> WeightUpdateStats:
        """Take the adapter push `plan` as `rank` (`plan_data`: the plan as the worker takes it): checked, received,
        loaded; the stats of `Engine.update_weights`. No pause: running batches keep their adapter."""
        self.check(plan)
        started = time.perf_counter()
        try:
            checksum, figures = self.load(plan, rank, plan_data)
        except Exception as err:  # the worker's error arrives as a bare Exception with its message
            raise RuntimeError(f"adapter push {plan.push_id} (version {plan.version}) failed: {err}") from err
        return WeightUpdateStats(version=plan.version, load_s=time.perf_counter() - started, pause_s=0.0,
                                 bytes_received=figures["bytes"], adapter_checksum=checksum,
                                 extra={**figures, "mode": "adapter"})

    def load(self, plan: PushOrder, rank: int, plan_data: dict) -> tuple[str, dict]:
        """Receive the adapter (worker) and load it (vLLM); returns its checksum and figures. Raises when vLLM
        does not list it afterwards: a push that did not take effect is an error."""
        directory = self._root / f"v{plan.version}"
        started = time.perf_counter()
        with self._control:
            (figures,) = self._llm.collective_rpc("asyncrl_receive_adapter",
                                                  args=(plan_data, rank, str(directory), self.run))
        received = time.perf_counter()
        served = Served(plan.version, str(directory), figures["checksum"])
        vllm_id = self._new_id(plan.version)
        with self._control:
            self._llm.llm_engine.add_lora(self._request(served, vllm_id))
            listed = self._llm.llm_engine.list_loras()
        if vllm_id not in listed:
            raise RuntimeError(f"adapter push {plan.push_id}: vLLM does not list adapter version {plan.version} "
                               "as loaded after add_lora")
        with self._lock:
            self._ids[plan.version] = vllm_id
            retired = self._versions.added(served)
        self._retire(retired)
        return figures["checksum"], {**figures, "receive_s": received - started,
                                     "add_lora_s": time.perf_counter() - received}

    def _request(self, served: Served, vllm_id: int):
        """vLLM's request for `served`; its name is unique in the engine, since vLLM tells requests apart by name."""
        from vllm.lora.request import LoRARequest

        name = f"asyncrl-{self.run}-v{served.version}" if self.run else f"asyncrl-v{served.version}"
        return LoRARequest(name, vllm_id, served.path)

    @contextlib.contextmanager
    def pinned(self):
        """(the LoRARequest a batch starting now runs on, the version it serves), both None before the first
        adapter (the base), held until the batch ends: that version is not retired meanwhile."""
        with self._lock:
            served = self._versions.acquire()
            vllm_id = None if served is None else self._ids[served.version]
        try:
            if served is None:
                yield None, None
            else:
                yield self._request(served, vllm_id), served
        finally:
            with self._lock:
                retired = self._versions.release(served)
            self._retire(retired)

    def _retire(self, retired: list[Served]) -> None:
        for served in retired:
            with self._lock:
                vllm_id = self._ids.pop(served.version)
            with self._control:
                self._llm.llm_engine.remove_lora(vllm_id)
            shutil.rmtree(served.path, ignore_errors=True)

    def unload(self) -> None:
        """Unload every version and delete the files (the run left the replica: no batch of it runs)."""
        with self._lock:
            gone = self._versions.clear()
        self._retire(gone)
        if self.run:
            with self._control:
                self._llm.collective_rpc("asyncrl_leave_run", args=(self.run,))
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

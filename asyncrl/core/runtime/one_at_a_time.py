"""One job on a thread of its own at a time: the learner's background push, checkpoint writes and evaluations
on a replica each keep at most one in flight and take its outcome (or its exception) between steps."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


class OneAtATime:
    def __init__(self, name: str):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._job: Future | None = None

    @property
    def running(self) -> bool:
        """A job was started and its outcome not taken yet."""
        return self._job is not None

    def start(self, fn, *args) -> None:
        if self._job is not None:
            raise RuntimeError("a job is still in flight: take its outcome first")
        self._job = self._pool.submit(fn, *args)

    def poll(self):
        """The outcome of the job if it is over (raising what it raised), else None; never waits."""
        if self._job is None or not self._job.done():
            return None
        return self.wait()

    def wait(self):
        """Wait for the job in flight and take its outcome (raising what it raised); None without one."""
        job, self._job = self._job, None
        return None if job is None else job.result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

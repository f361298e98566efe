"""Packing shards: in this process, or in worker processes that report through typed messages.

A shard is a contiguous range of inputs packed into one HDF5 file under a ``.partial`` name,
flushed, then renamed. The parent hands each worker one :class:`Task` at a time over a pipe; the
worker answers with :class:`Progress` while it packs and one :class:`Done` or :class:`Failed`
per task.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastpipe.pack._errors import CorruptInputError, PackError
from fastpipe.pack._files import fsync
from fastpipe.pack._inputs import Inputs, SkipInput
from fastpipe.pack._write import ShardWriter

# How often a packing shard reports progress, in seconds.
_PROGRESS_SECONDS = 0.2


def shard_name(start: int, stop: int) -> str:
    return f"part-{start:010d}-{stop:010d}.h5"


def shard_ranges(lo: int, hi: int, workers: int, shard_size: int) -> list[tuple[int, int]]:
    """Splits inputs ``[lo, hi)`` into near-equal ranges: at most ``shard_size`` inputs each, at
    least one range per worker, none empty."""
    n = hi - lo
    k = max(1, min(max(workers, math.ceil(n / shard_size)), n))
    edges = [lo + (n * j) // k for j in range(k + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


@dataclass
class Task:
    """One shard to pack: inputs ``[start, stop)`` of the source every worker holds."""

    start: int
    stop: int

    @property
    def name(self) -> str:
        return shard_name(self.start, self.stop)


@dataclass
class Job:
    """What every shard of one pack shares (the inputs, the metadata); sent once to each worker
    process."""

    inputs: Inputs
    meta: dict[str, Any]
    directory: Path
    strict: bool
    resume_hint: str = "run the same command again to resume"


@dataclass
class ShardResult:
    """A packed shard: its sample count and the inputs it skipped (``{"index", "source",
    "reason"}`` dicts)."""

    count: int
    skipped: list[dict[str, Any]]


class Progress(NamedTuple):
    """Worker to parent: ``inputs`` more inputs were handled."""

    inputs: int


class Done(NamedTuple):
    """Worker to parent: the shard starting at ``start`` is packed and renamed."""

    start: int
    result: ShardResult


class Failed(NamedTuple):
    """Worker to parent: the shard starting at ``start`` failed; the parent raises ``error(text)``
    and stops every worker."""

    start: int
    error: type[PackError]
    text: str


def pack_shard(job: Job, task: Task, on_progress: Callable[[int], None]) -> ShardResult:
    """Packs inputs ``[task.start, task.stop)`` into one shard file."""
    partial = job.directory / (task.name + ".partial")
    writer = ShardWriter(partial, job.inputs.schema, task.stop - task.start)
    skipped: list[dict[str, Any]] = []
    pending, last = 0, time.monotonic()
    try:
        for local, index in enumerate(range(task.start, task.stop)):
            name = job.inputs.name(index)
            try:
                rows = _load(job, task, index, local, name)
            except SkipInput as exc:
                if job.strict:
                    raise CorruptInputError(
                        f"{name}: {exc} (strict mode stops at the first bad input; without it "
                        "the input is skipped and listed in the report)") from exc
                skipped.append({"index": index, "source": name, "reason": str(exc)})
            else:
                writer.add(rows, name)
            pending += 1
            now = time.monotonic()
            if now - last >= _PROGRESS_SECONDS:
                on_progress(pending)
                pending, last = 0, now
        writer.finish(dict(job.meta, range=[task.start, task.stop],
                           inputs=task.stop - task.start, skipped=skipped, merge="none",
                           parts=None))
        fsync(partial)
    except BaseException:
        writer.abort()
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, job.directory / task.name)
    on_progress(pending)
    return ShardResult(writer.count, skipped)


def _load(job: Job, task: Task, index: int, local: int, name: str) -> dict[str, np.ndarray]:
    """The stored rows of input ``index`` (the ``local``-th of ``task``), named ``name``."""
    return job.inputs.load(index, name)


def pack_here(job: Job, tasks: list[Task], on_progress: Callable[[int], None]
              ) -> dict[int, ShardResult]:
    """Packs ``tasks`` one after the other in this process; results by task start."""
    return {task.start: pack_shard(job, task, on_progress) for task in tasks}


def _worker_main(conn, job: Job) -> None:
    """A pack worker process: packs the tasks it is sent, one at a time, until it gets None."""
    try:
        while True:
            task = conn.recv()
            if task is None:
                return
            try:
                result = pack_shard(job, task, lambda n: conn.send(Progress(n)))
            except PackError as exc:  # CorruptInputError included
                conn.send(Failed(task.start, type(exc), str(exc)))
                return
            except Exception as exc:  # noqa: BLE001 - forwarded to the parent with its traceback
                conn.send(Failed(task.start, PackError, f"a pack worker failed: "
                                 f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
                return
            conn.send(Done(task.start, result))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the parent is gone or interrupted: stop quietly; the .partial is redone on resume
    finally:
        conn.close()


@dataclass
class _Worker:
    """A worker process, the parent's end of its pipe, and the task it is packing."""

    process: Any
    conn: Any
    task: Task | None = None

    def give(self, pending: list[Task]) -> None:
        """Sends the next pending task, or None (stop) when there is none."""
        self.task = pending.pop() if pending else None
        try:
            self.conn.send(self.task)
        except OSError:  # died between tasks: noticed through its sentinel
            if self.task is not None:
                pending.append(self.task)
                self.task = None

    def receive(self) -> Progress | Done | Failed | None:
        """The next message, or None when there is none (or the pipe is broken)."""
        try:
            return self.conn.recv() if self.conn.poll() else None
        except (EOFError, OSError):
            return None

    def stop(self, terminate: bool) -> None:
        if terminate and self.process.is_alive():
            self.process.terminate()
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def _start_worker(ctx, job: Job, number: int) -> _Worker:
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_worker_main, args=(child, job), name=f"fastpipe-pack-{number}",
                          daemon=True)
    try:
        process.start()
    except Exception as exc:  # noqa: BLE001 - typically pickling the source under spawn
        child.close()
        parent.close()
        raise PackError(
            f"cannot start pack worker processes ({type(exc).__name__}: {exc}); the source must "
            "be picklable for num_workers > 1 (define the dataset class at module level), or use "
            "num_workers=1") from exc
    child.close()
    return _Worker(process, parent)


def pack_in_workers(job: Job, tasks: list[Task], workers: int,
                    on_progress: Callable[[int], None], start_method: str | None
                    ) -> dict[int, ShardResult]:
    """Packs ``tasks`` in up to ``workers`` processes; results by task start.

    The first :class:`Failed` stops every worker and is raised; a worker that dies (killed, out
    of memory) is reported once the others finish, with the shards that finished kept for a
    resume. Every worker has ended when this returns or raises.
    """
    ctx = multiprocessing.get_context(start_method)
    pending = list(reversed(tasks))
    results: dict[int, ShardResult] = {}
    deaths: list[str] = []
    failed: Failed | None = None
    pool: list[_Worker] = []
    finished = False
    try:
        for number in range(min(workers, len(tasks))):
            pool.append(_start_worker(ctx, job, number))
        for worker in pool:
            worker.give(pending)
        live = [w for w in pool if w.task is not None]
        while live and failed is None:
            ready = wait_for([w.conn for w in live] + [w.process.sentinel for w in live],
                             timeout=1.0)
            for worker in list(live):
                exited = worker.process.sentinel in ready
                if worker.conn not in ready and not exited:
                    continue
                message = worker.receive()
                if message is None:
                    if worker.process.is_alive() and not exited:
                        continue
                    worker.process.join(timeout=5)
                    task = worker.task
                    deaths.append(f"the worker packing inputs {task.start}-{task.stop} exited "
                                  f"with code {worker.process.exitcode}")
                    live.remove(worker)
                elif isinstance(message, Progress):
                    on_progress(message.inputs)
                elif isinstance(message, Done):
                    results[message.start] = message.result
                    worker.give(pending)
                    if worker.task is None:
                        live.remove(worker)
                else:
                    failed = message
                    break
        finished = failed is None
    finally:
        for worker in pool:
            worker.stop(terminate=not finished)
        # Every worker has ended: what they left half-written is redone on resume anyway.
        for partial in job.directory.glob("*.partial"):
            partial.unlink(missing_ok=True)
    if failed is not None:
        raise failed.error(failed.text)
    if deaths or pending:
        raise PackError(
            "; ".join(deaths or ["pack workers stopped early"]) + f". {len(results)} shard(s) "
            f"finished in this run and are kept in {job.directory}: {job.resume_hint}")
    return results

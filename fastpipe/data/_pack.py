"""``pack``, ``merge_packs`` and ``verify``: make packed datasets, combine shards, check them.

Packing runs in shards: each covers a contiguous range of inputs and is written by one process
under a ``.partial`` name, flushed and renamed when complete. A rerun of an interrupted command keeps
the finished shards of the same plan and redoes the rest. Shards are then merged into the output: an HDF5 virtual dataset over the
shard files (no copy), one contiguous HDF5 file (copy), or an LMDB file (copy).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import secrets
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data import _pack_format as fmt
from fastpipe.data._pack_format import (
    CorruptInputError,
    PackError,
    PackFormatError,
    Spec,
    open_pack,
)
from fastpipe.data._pack_sources import (
    Listing,
    Processor,
    SkipInput,
    list_source,
    load_input,
    probe_spec,
    source_name,
)
from fastpipe.data._pack_write import ShardWriter, write_lmdb, write_merged_h5

__all__ = ["PackReport", "VerifyReport", "merge_packs", "pack", "verify",
           "PackError", "CorruptInputError", "PackFormatError"]

DEFAULT_SHARD_SIZE = 10_000
_PROGRESS_SECONDS = 0.2


@dataclass
class PackReport:
    """What a pack or merge produced. ``skipped`` lists ``{"index", "source", "reason"}`` dicts."""

    output: Path
    format: str
    storage: str
    merge: str
    inputs: int
    count: int
    skipped: list[dict[str, Any]]
    shards: int
    resumed_shards: int
    seconds: float
    size_bytes: int

    @property
    def files_per_second(self) -> float:
        return self.inputs / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["output"] = str(self.output)
        out["files_per_second"] = round(self.files_per_second, 2)
        return out

    def summary(self) -> str:
        lines = [
            f"packed {self.count} of {self.inputs} inputs into {self.output} ({self.format}, "
            f"{self.storage} storage, {self.shards} shard{'s' if self.shards != 1 else ''}, merge {self.merge}"
            f"{f', {self.resumed_shards} resumed' if self.resumed_shards else ''}) in {self.seconds:.1f} s "
            f"({self.files_per_second:.1f} files/s, {self.size_bytes / 2**20:.1f} MiB)"
        ]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input{'s' if len(self.skipped) != 1 else ''} "
                         "(also listed in the pack's metadata):")
            lines.extend(f"  {s['source']}: {s['reason']}" for s in self.skipped[:50])
            if len(self.skipped) > 50:
                lines.append(f"  ... and {len(self.skipped) - 50} more")
        return "\n".join(lines)


@dataclass
class VerifyReport:
    """The result of :func:`verify`. ``ok`` is True when ``problems`` is empty."""

    path: Path
    format: str = ""
    storage: str = ""
    count: int = 0
    checked: int = 0
    skipped_inputs: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["path"] = str(self.path)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        if not self.storage:  # it did not open as a pack
            return f"{self.path}: not readable as a fastpipe pack:\n" + "\n".join(f"  {p}" for p in self.problems)
        head = (f"{self.path}: {self.format} pack, {self.storage} storage, {self.count} samples, "
                f"{self.checked} checked in {self.seconds:.1f} s"
                + (f", {self.skipped_inputs} inputs were skipped when packing" if self.skipped_inputs else ""))
        if self.ok:
            return head + ": OK"
        lines = [head + f": {len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"]
        lines.extend(f"  {p}" for p in self.problems[:50])
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Arguments


def _parse_shard(shard: Any) -> tuple[int, int] | None:
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError as exc:
            raise ValueError(f"shard must look like 'i/n' (e.g. 0/4), got {shard!r}") from exc
    else:
        try:
            i, n = (int(x) for x in shard)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"shard must be (i, n), got {shard!r}") from exc
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard (i, n) needs 0 <= i < n, got ({i}, {n})")
    return i, n


def _parse_shape(shape: Any) -> tuple[int, int] | None:
    if shape is None:
        return None
    if isinstance(shape, str):
        try:
            h, w = (int(x) for x in shape.lower().split("x"))
        except ValueError as exc:
            raise ValueError(f"shape must look like 'HxW' (e.g. 224x224), got {shape!r}") from exc
    elif isinstance(shape, int):
        h = w = shape
    else:
        try:
            h, w = (int(x) for x in shape)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"shape must be (H, W), got {shape!r}") from exc
    if h < 1 or w < 1:
        raise ValueError(f"shape must be positive, got ({h}, {w})")
    return h, w


def _format_for(output: Path, format: str | None) -> str:
    if format is None:
        return "lmdb" if output.suffix.lower() in (".lmdb", ".mdb") else "hdf5"
    if format not in ("hdf5", "lmdb"):
        raise ValueError(f"format must be 'hdf5' or 'lmdb', got {format!r}")
    return format


def _merge_for(format: str, merge: str | None) -> str:
    if merge is None:
        return "virtual" if format == "hdf5" else "copy"
    if merge not in ("virtual", "copy"):
        raise ValueError(f"merge must be 'virtual' or 'copy', got {merge!r}")
    if merge == "virtual" and format == "lmdb":
        raise ValueError("LMDB has no virtual datasets: use merge='copy' (the default for LMDB)")
    return merge


def _check_output(output: Path, overwrite: bool) -> None:
    if output.exists() and not overwrite:
        raise FileExistsError(f"{output} already exists; pass overwrite=True (--overwrite) or choose another output")
    if not output.parent.exists():
        raise FileNotFoundError(f"the folder of the output, {output.parent}, does not exist")


def _install(tmp: Path, output: Path) -> None:
    if tmp.is_file():
        _fsync(tmp)
    if output.is_dir():
        shutil.rmtree(output)
    os.replace(tmp, output)
    _fsync(output.parent)


def _fsync(path: Path) -> None:
    """Flushes a file (or a folder's entries) to disk, so a rename never installs unwritten data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def _remove_old_shards(root: Path, keep: Path | None) -> None:
    """After the new output is installed: earlier runs' shard folders (and the flat part files of
    older fastpipe versions) in ``root``, which no output uses any more."""
    if not root.is_dir():
        return
    for path in root.iterdir():
        if keep is not None and path == keep:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if keep is None:
        shutil.rmtree(root, ignore_errors=True)


def _size_on_disk(output: Path, meta: dict[str, Any] | None = None) -> int:
    total = output.stat().st_size if output.is_file() else sum(p.stat().st_size for p in output.rglob("*") if p.is_file())
    for file in {p["file"] for p in (meta or {}).get("parts") or []}:
        part = output.parent / file
        if part.exists():
            total += part.stat().st_size
    return total


def _progress_bar(progress: bool, total: int, initial: int, desc: str, unit: str):
    from fastpipe._progress import progress_bar

    return progress_bar(progress, total=total, initial=initial, desc=desc, unit=unit,
                        dynamic_ncols=True, smoothing=0.05, mininterval=0.5)


# ---------------------------------------------------------------------------------------------
# pack


@dataclass
class _Task:
    start: int
    stop: int
    files: list[str] | None = None
    names: list[str] | None = None
    labels: np.ndarray | None = None

    @property
    def name(self) -> str:
        return f"part-{self.start:010d}-{self.stop:010d}.h5"


@dataclass
class _Job:
    """What every shard of one pack shares; sent once to each worker process."""

    listing: Listing
    processor: Processor
    spec: Spec
    meta: dict[str, Any]
    directory: Path
    strict: bool
    resume_hint: str = "run the same command again to resume"


def _shard_ranges(lo: int, hi: int, workers: int, shard_size: int) -> list[tuple[int, int]]:
    n = hi - lo
    k = max(1, min(max(workers, math.ceil(n / shard_size)), n))
    edges = [lo + (n * j) // k for j in range(k + 1)]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _pack_range(job: _Job, task: _Task, on_progress: Callable[[int], None]) -> dict[str, Any]:
    """Packs inputs ``[task.start, task.stop)`` into one shard file; returns its count and skips."""
    partial = job.directory / (task.name + ".partial")
    final = job.directory / task.name
    writer = ShardWriter(partial, job.spec, task.stop - task.start)
    skipped: list[dict[str, Any]] = []
    pending, last = 0, time.monotonic()
    try:
        for local, index in enumerate(range(task.start, task.stop)):
            name = source_name(job.listing, index, task.names, local)
            try:
                value, label = load_input(job.listing, index, local, task.files)
                if task.labels is not None:
                    label = int(task.labels[local])
                sample = job.processor(value, name)
            except SkipInput as exc:
                if job.strict:
                    raise CorruptInputError(
                        f"{name}: {exc} (strict mode stops at the first bad input; without "
                        "--strict it is skipped and listed in the report)") from exc
                skipped.append({"index": index, "source": name, "reason": str(exc)})
            else:
                writer.add(sample, label, name)
            pending += 1
            now = time.monotonic()
            if now - last >= _PROGRESS_SECONDS:
                on_progress(pending)
                pending, last = 0, now
        meta = dict(job.meta, range=[task.start, task.stop], inputs=task.stop - task.start,
                    skipped=skipped, merge="none", parts=None)
        writer.finish(meta)
        _fsync(partial)
    except BaseException:
        writer.abort()
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    on_progress(pending)
    return {"count": writer.count, "skipped": skipped}


def _worker_main(conn, job: _Job) -> None:
    """A pack worker process: packs the shards it is sent, one at a time, until it gets None."""
    try:
        while True:
            task = conn.recv()
            if task is None:
                return
            try:
                result = _pack_range(job, task, lambda n: conn.send(("progress", n)))
            except CorruptInputError as exc:
                conn.send(("error", task.start, "corrupt", str(exc)))
                return
            except PackError as exc:
                conn.send(("error", task.start, "pack", str(exc)))
                return
            except Exception as exc:  # noqa: BLE001 - forwarded to the parent with its traceback
                conn.send(("error", task.start, "crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
                return
            conn.send(("done", task.start, result))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the parent is gone or interrupted: stop quietly; the .partial file is redone on resume
    finally:
        conn.close()


def _run_in_process(job: _Job, tasks: list[_Task], bar) -> dict[int, dict[str, Any]]:
    results = {}
    for task in tasks:
        results[task.start] = _pack_range(job, task, bar.update)
    return results


def _run_workers(job: _Job, tasks: list[_Task], workers: int, bar, start_method: str | None) -> dict[int, dict[str, Any]]:
    ctx = multiprocessing.get_context(start_method)
    worker_job = dataclasses.replace(job, listing=dataclasses.replace(job.listing, files=None, names=None, labels=None))
    pending = list(reversed(tasks))
    results: dict[int, dict[str, Any]] = {}
    failures: list[str] = []
    fatal: tuple[str, str] | None = None
    procs = []
    finished = False
    try:
        for w in range(min(workers, len(tasks))):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(child, worker_job), name=f"fastpipe-pack-{w}", daemon=True)
            try:
                proc.start()
            except Exception as exc:  # noqa: BLE001 - typically pickling the source under spawn
                child.close()
                parent.close()
                raise PackError(
                    f"cannot start pack worker processes ({type(exc).__name__}: {exc}); the source must be "
                    "picklable for workers > 1 (define the dataset class at module level), or use workers=1"
                ) from exc
            child.close()
            procs.append({"proc": proc, "conn": parent, "task": None})
        def assign(slot) -> None:
            slot["task"] = pending.pop() if pending else None
            try:
                slot["conn"].send(slot["task"])
            except OSError:  # died between tasks: noticed through its sentinel below
                if slot["task"] is not None:
                    pending.append(slot["task"])
                    slot["task"] = None

        for slot in procs:
            assign(slot)
        live = [s for s in procs if s["task"] is not None]
        while live and fatal is None:
            ready = wait_for([s["conn"] for s in live] + [s["proc"].sentinel for s in live], timeout=1.0)
            for slot in list(live):
                if slot["conn"] not in ready and slot["proc"].sentinel not in ready:
                    continue
                message = None
                try:
                    if slot["conn"].poll():
                        message = slot["conn"].recv()
                except (EOFError, OSError):
                    message = None
                if message is None:
                    if slot["proc"].is_alive() and slot["proc"].sentinel not in ready:
                        continue
                    slot["proc"].join(timeout=5)
                    task = slot["task"]
                    failures.append(f"the worker packing inputs {task.start}-{task.stop} exited with code "
                                    f"{slot['proc'].exitcode}")
                    live.remove(slot)
                    continue
                kind = message[0]
                if kind == "progress":
                    bar.update(message[1])
                elif kind == "done":
                    results[message[1]] = message[2]
                    assign(slot)
                    if slot["task"] is None:
                        live.remove(slot)
                elif kind == "error":
                    fatal = (message[2], message[3])
                    break
        finished = fatal is None
    finally:
        for slot in procs:
            if not finished and slot["proc"].is_alive():
                slot["proc"].terminate()
            slot["proc"].join(timeout=30)
            if slot["proc"].is_alive():
                slot["proc"].kill()
                slot["proc"].join()
            slot["conn"].close()
        # Every worker has ended: what they left half-written is redone on resume anyway.
        for partial in job.directory.glob("*.partial"):
            partial.unlink(missing_ok=True)
    if fatal is not None:
        kind, text = fatal
        if kind == "corrupt":
            raise CorruptInputError(text)
        if kind == "pack":
            raise PackError(text)
        raise PackError(f"a pack worker failed: {text}")
    if failures or pending:
        raise PackError(
            "; ".join(failures or ["pack workers stopped early"]) + f". {len(results)} shard(s) finished in "
            f"this run and are kept in {job.directory}: {job.resume_hint}")
    return results


def pack(
    source: Any,
    output: str | os.PathLike,
    *,
    storage: str = "bytes",
    workers: int = 1,
    shard: tuple[int, int] | str | None = None,
    merge: str | None = None,
    max_side: int | None = None,
    shape: tuple[int, int] | str | int | None = None,
    strict: bool = False,
    progress: bool = True,
    format: str | None = None,
    quality: int = 90,
    check: bool = True,
    shard_size: int = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    resume: bool | None = None,
    start_method: str | None = None,
) -> PackReport:
    """Packs images (or arrays) into one HDF5 or LMDB file for fast random access.

    Args:
        source: an ImageFolder root (``root/<class>/<image>``), a list file (``path [label]`` per
            line, paths relative to the list file), or a map-style dataset returning ``(array, label)``.
        output: the pack to write. Shards go to ``<output>.shards/<run>/`` first (one folder
            per run; an older run's folder is removed once the new output is installed).
        storage: ``"bytes"`` keeps encoded files (JPEG/PNG) as they are; ``"array"`` stores decoded
            fixed-shape arrays (images as uint8 ``(3, H, W)``).
        workers: processes packing shards in parallel (1 packs in this process).
        shard: ``(i, n)`` or ``"i/n"``: pack only slice ``i`` of ``n`` of the inputs (one machine's
            part); combine the parts later with :func:`merge_packs`.
        merge: ``"virtual"`` (HDF5 default: a virtual dataset over the shard files, no copy; keep
            ``<output>.shards/`` next to the output) or ``"copy"`` (one self-contained contiguous file,
            the fastest to read; LMDB always copies).
        max_side: bytes storage: re-encode images whose shorter side exceeds this so it equals it
            (smaller images keep their original bytes).
        shape: array storage: ``(H, W)`` to which each image is resized (aspect kept) and centre
            cropped. Without it all samples must share the first sample's shape.
        strict: stop at the first unreadable or corrupt input (:class:`CorruptInputError`) instead of
            skipping and listing it.
        progress: show a tqdm progress bar (files/s, ETA) on stderr.
        format: ``"hdf5"`` or ``"lmdb"``; default from the output suffix (``.lmdb`` means LMDB).
        quality: JPEG quality when re-encoding with ``max_side``.
        check: bytes storage: decode every input to catch corrupt files (off: trust the inputs).
        shard_size: inputs per shard at most; smaller shards lose less work on interruption.
        overwrite: replace an existing output. A complete output that is replaced is never
            resumed from: every shard is packed again.
        resume: keep the finished shards of an interrupted run with the same plan (source listing,
            settings) instead of packing them again. Default (None): on for folders and list files,
            whose plan includes every file's name, label, size and mtime; off for datasets, whose
            contents pack cannot see (pass ``resume=True`` when the dataset is unchanged).
        start_method: multiprocessing start method for workers (default: the platform's).

    Returns:
        A :class:`PackReport` with counts, the skipped inputs and their reasons, and timings.
    """
    started = time.perf_counter()
    output = Path(output)
    format = _format_for(output, format)
    merge = _merge_for(format, merge)
    if storage not in ("bytes", "array"):
        raise ValueError(f"storage must be 'bytes' or 'array', got {storage!r}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"shard_size must be an int >= 1, got {shard_size!r}")
    shard = _parse_shard(shard)
    shape = _parse_shape(shape)
    if max_side is not None:
        if storage != "bytes":
            raise ValueError("max_side applies to bytes storage; for array storage pass shape=(H, W)")
        if int(max_side) < 1:
            raise ValueError(f"max_side must be >= 1, got {max_side}")
        max_side = int(max_side)
    if shape is not None and storage != "array":
        raise ValueError("shape applies to array storage; for bytes storage pass max_side=N")
    if not 1 <= int(quality) <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality}")
    fmt.h5py_module()  # shards are HDF5 for both formats
    if format == "lmdb":
        fmt.lmdb_module()
    _check_output(output, overwrite)
    replacing = output.exists()

    listing = list_source(source)
    if listing.count == 0:
        raise PackError(f"the source {listing.description} has no inputs")
    lo, hi = (0, listing.count) if shard is None else (
        shard[0] * listing.count // shard[1], (shard[0] + 1) * listing.count // shard[1])
    # The sample spec comes from the start of the whole source, so every shard i/n agrees on it.
    spec = probe_spec(listing, storage, 0, listing.count, shape)
    options = {"max_side": max_side, "quality": int(quality) if max_side is not None else None,
               "shape": list(shape) if shape is not None else None, "check": bool(check),
               "strict": bool(strict)}  # a skipping run's shards must not satisfy a strict one
    plan = hashlib.sha256(json.dumps([listing.fingerprint, storage, spec.to_json(), options],
                                     sort_keys=True).encode()).hexdigest()[:24]
    from fastpipe import __version__

    base_meta = {
        "format": fmt.FORMAT, "version": fmt.VERSION, **spec.to_json(), "classes": listing.classes,
        "source": listing.to_json(), "options": options, "plan": plan,
        "shard": list(shard) if shard is not None else None,
        "writer": f"fastpipe {__version__}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    # Each run's shards live in their own folder, named by its plan, so a rerun finds them. When a
    # complete output is replaced, its shards may be the ones a virtual output maps: the new run
    # packs into a fresh folder, and the old one goes only after the new output is installed.
    root = output.with_name(output.name + ".shards")
    directory = root / (f"{plan}-{secrets.token_hex(4)}" if replacing else plan)
    directory.mkdir(parents=True, exist_ok=True)
    ranges = _shard_ranges(lo, hi, workers, shard_size)
    if resume is None:
        resume = listing.kind != "dataset"
    # Resume finishes an interrupted run; an existing complete output means the last run finished,
    # so its shards are not reused (the inputs may have changed in ways the plan cannot see).
    kept = _resume(directory, ranges, plan if resume and not replacing else None)
    tasks = []
    for a, b in ranges:
        if (a, b) in kept:
            continue
        if listing.kind == "dataset":
            tasks.append(_Task(a, b))
        else:
            tasks.append(_Task(a, b, listing.files[a:b], listing.names[a:b], listing.labels[a:b]))
    job = _Job(listing, Processor(spec, max_side, shape, int(quality), bool(check)), spec, base_meta,
               directory, bool(strict),
               "run the same command again to resume" if listing.kind != "dataset"
               else "call pack again with resume=True (and the same dataset) to resume")
    done_inputs = sum(b - a for a, b in kept)
    bar = _progress_bar(progress, hi - lo, done_inputs, "pack", "file")
    try:
        if kept and progress:
            bar.write(f"resuming: {len(kept)} of {len(ranges)} shards already packed in {directory}")
        if workers == 1:
            results = _run_in_process(job, tasks, bar)
        else:
            results = _run_workers(job, tasks, workers, bar, start_method) if tasks else {}
    except BaseException:
        if replacing:  # a fresh folder that no rerun resumes from
            shutil.rmtree(directory, ignore_errors=True)
        elif not any(directory.iterdir()):
            directory.rmdir()
        if not any(root.iterdir()):
            root.rmdir()
        raise
    finally:
        bar.close()
    results.update({a: kept[(a, b)] for a, b in kept})

    shard_files = [directory / _Task(a, b).name for a, b in ranges]
    skipped = [s for a, _ in ranges for s in results[a]["skipped"]]
    count = sum(results[a]["count"] for a, _ in ranges)
    final_meta = dict(base_meta, range=[lo, hi], inputs=hi - lo, skipped=skipped)
    tmp = output.with_name(output.name + ".partial")
    single = format == "hdf5" and merge == "virtual" and len(shard_files) == 1
    if single:
        _install(shard_files[0], output)  # one shard is already a complete pack
        _remove_old_shards(root, None)
    else:
        _merge_files(shard_files, tmp, final_meta, format, merge, progress)
        _install(tmp, output)
        _remove_old_shards(root, directory if merge == "virtual" else None)
    with open_pack(output, format) as reader:
        meta = reader.meta
    return PackReport(output, format, storage, "none" if single else merge, hi - lo, count, skipped, len(ranges), len(kept), time.perf_counter() - started,
                      _size_on_disk(output, meta))


def _resume(directory: Path, ranges: list[tuple[int, int]], plan: str | None) -> dict[tuple[int, int], dict[str, Any]]:
    """Finished shards of this plan, kept; partial files and shards of other plans (all, when
    ``plan`` is None), removed."""
    wanted = {_Task(a, b).name: (a, b) for a, b in ranges}
    kept = {}
    for path in sorted(directory.iterdir()):
        if path.name.endswith(".partial"):
            path.unlink()
            continue
        if not (path.name.startswith("part-") and path.name.endswith(".h5")):
            continue
        meta = None
        if plan is not None and path.name in wanted:
            try:
                with fmt.H5PackReader(path) as reader:
                    meta = reader.meta
            except (PackFormatError, OSError):
                meta = None
        a_b = wanted.get(path.name)
        if meta is not None and meta.get("plan") == plan and tuple(meta.get("range", ())) == a_b:
            kept[a_b] = {"count": int(meta["count"]), "skipped": list(meta.get("skipped", []))}
        else:
            path.unlink()  # from an older run with other settings or another split
    return kept


def _merge_files(files: Sequence[Path], tmp: Path, meta: dict[str, Any], format: str, merge: str,
                 progress: bool) -> None:
    readers = [open_pack(f) for f in files]
    try:
        total = sum(r.count for r in readers)
        with _progress_bar(progress and (merge == "copy" or format == "lmdb"), total, 0,
                           f"merge ({'lmdb' if format == 'lmdb' else merge})", "sample") as bar:
            if tmp.exists():
                tmp.unlink()
            if format == "lmdb":
                write_lmdb(readers, tmp, meta, bar.update)
            else:
                write_merged_h5(readers, tmp, meta, merge, bar.update)
    except BaseException:
        for suffix in ("", "-lock"):
            Path(str(tmp) + suffix).unlink(missing_ok=True)
        raise
    finally:
        for r in readers:
            r.close()


# ---------------------------------------------------------------------------------------------
# merge_packs


def merge_packs(
    parts: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    merge: str | None = None,
    format: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PackReport:
    """Combines packs (typically the ``shard=(i, n)`` parts packed on several machines) into one.

    Parts made with ``shard`` are put in shard order and must all come from the same source and
    settings, with none missing. Other packs are concatenated in the order given and must share
    storage, sample shape and classes. ``merge="virtual"`` (HDF5 only) maps the parts without
    copying them: they must stay where they are, relative to the output.
    """
    started = time.perf_counter()
    output = Path(output)
    format = _format_for(output, format)
    merge = _merge_for(format, merge)
    if not parts:
        raise ValueError("merge_packs needs at least one part")
    paths = [Path(p) for p in parts]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such pack: {p}")
    if output.resolve() in {p.resolve() for p in paths}:
        raise ValueError(f"the output {output} is also one of the parts")
    _check_output(output, overwrite)
    metas = []
    for p in paths:
        with open_pack(p) as reader:
            metas.append(reader.meta)
    order = _order_parts(paths, metas)
    paths = [paths[k] for k in order]
    metas = [metas[k] for k in order]
    first = metas[0]
    skipped = [s for m in metas for s in m.get("skipped", [])]
    inputs = sum(int(m.get("inputs", m["count"])) for m in metas)
    meta = dict(first, skipped=skipped, inputs=inputs, shard=None,
                merged_from=[os.path.relpath(p, output.parent) for p in paths],
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if all(m.get("range") for m in metas):
        meta["range"] = [metas[0]["range"][0], metas[-1]["range"][1]]
    tmp = output.with_name(output.name + ".partial")
    _merge_files(paths, tmp, meta, format, merge, progress)
    _install(tmp, output)
    with open_pack(output, format) as reader:
        count, storage, final_meta = reader.count, reader.spec.storage, reader.meta
    return PackReport(output, format, storage, merge, inputs, count, skipped, len(paths), 0,
                      time.perf_counter() - started, _size_on_disk(output, final_meta))


def _order_parts(paths: list[Path], metas: list[dict[str, Any]]) -> list[int]:
    def describe(m: dict[str, Any]) -> tuple:
        return (m["storage"], m["layout"], tuple(m.get("sample_shape") or ()), m.get("dtype"))

    for p, m in zip(paths, metas, strict=True):
        if describe(m) != describe(metas[0]):
            raise PackError(f"{p} holds {describe(m)} samples but {paths[0]} holds {describe(metas[0])}: "
                            "only packs with the same storage and sample shape merge")
        if m["classes"] != metas[0]["classes"]:
            raise PackError(f"{p} and {paths[0]} have different class lists; merged labels would be wrong")
    sharded = [m.get("shard") for m in metas]
    if not any(sharded):
        return list(range(len(paths)))
    if not all(sharded):
        raise PackError("some parts were packed with shard=(i, n) and some were not; merge one kind")
    n = sharded[0][1]
    plans = {m.get("plan") for m in metas}
    if any(s[1] != n for s in sharded) or len(plans) != 1:
        raise PackError("the parts come from different pack runs (other shard counts, sources or settings)")
    seen: dict[int, Path] = {}
    for p, (i, _) in zip(paths, sharded, strict=True):
        if i in seen:
            raise PackError(f"shard {i}/{n} is given twice: {seen[i]} and {p}")
        seen[i] = p
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise PackError(f"shards {', '.join(f'{i}/{n}' for i in missing)} are missing; merge needs all {n}")
    return sorted(range(len(paths)), key=lambda k: sharded[k][0])


# ---------------------------------------------------------------------------------------------
# verify


def verify(path: str | os.PathLike, sample: int | None = None, *, seed: int = 0,
           progress: bool = False, max_problems: int = 1000) -> VerifyReport:
    """Checks a pack: metadata, index arrays, every sample's checksum, and that images decode.

    ``sample=K`` checks K random samples instead of all. Problems are collected, not raised: the
    report's ``ok`` says whether the pack is sound.
    """
    from fastpipe.data._decode import CorruptImageError, decode_rgb

    started = time.perf_counter()
    report = VerifyReport(Path(path))
    try:
        report.format = fmt.sniff_format(path)
        reader = open_pack(path, report.format)
    except (PackFormatError, OSError) as exc:
        report.problems.append(str(exc))
        report.seconds = time.perf_counter() - started
        return report

    def problem(text: str) -> None:
        if len(report.problems) < max_problems:
            report.problems.append(text)

    with reader:
        meta = reader.meta
        report.storage, report.count = reader.spec.storage, reader.count
        report.skipped_inputs = len(meta.get("skipped") or [])
        labels = reader.labels
        if reader.classes:
            bad = np.flatnonzero((labels < 0) | (labels >= len(reader.classes)))
        else:
            bad = np.flatnonzero(labels < -1)
        for i in bad[:20]:
            problem(f"sample {i}: label {labels[i]} is outside the {len(reader.classes)} classes")
        if "inputs" in meta and meta["inputs"] != reader.count + report.skipped_inputs:
            problem(f"metadata says {meta['inputs']} inputs, but {reader.count} samples + "
                    f"{report.skipped_inputs} skipped do not add up")
        if isinstance(reader, fmt.H5PackReader):
            for name, array in (("offsets", getattr(reader, "offsets", None)), ("path_offsets", reader._path_offsets)):
                if array is not None and (array[0] != 0 or np.any(np.diff(array) < 0)):
                    problem(f"'{name}' is not a non-decreasing run from 0; the index is damaged")
        try:
            crcs = reader.crc32()
        except PackFormatError as exc:
            problem(str(exc))
            crcs = None
        if sample is None or sample >= reader.count:
            indices = np.arange(reader.count)
        else:
            indices = np.sort(np.random.default_rng(seed).choice(reader.count, int(sample), replace=False))
        decode = reader.spec.layout == "encoded"
        with _progress_bar(progress, len(indices), 0, "verify", "sample") as bar:
            for i in indices:
                i = int(i)
                try:
                    data = reader.read(i)
                except (PackFormatError, OSError, ValueError) as exc:
                    problem(f"sample {i}: cannot read: {exc}")
                    continue
                finally:
                    bar.update(1)
                report.checked += 1
                if crcs is not None and (zlib_crc32(data) != int(crcs[i])):
                    problem(f"sample {i} ({_safe_source(reader, i)}): checksum mismatch, the stored data is damaged")
                    continue
                if decode:
                    try:
                        decode_rgb(data, f"{path}[{i}]")
                    except CorruptImageError as exc:
                        problem(f"sample {i} ({_safe_source(reader, i)}): {exc}")
    report.seconds = time.perf_counter() - started
    return report


def zlib_crc32(data: np.ndarray) -> int:
    import zlib

    return zlib.crc32(np.ascontiguousarray(data))


def _safe_source(reader, index: int) -> str:
    try:
        return reader.source(index)
    except Exception:  # noqa: BLE001 - the path index may be damaged too
        return "source unknown"

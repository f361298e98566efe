"""``pack``: list the inputs, plan the shards, pack them (resuming), merge, install.

Each step is one function below; :func:`pack` only calls them in order.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpipe._version import __version__
from fastpipe.data.format import layout as fmt
from fastpipe.data.format.fields import Field
from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.sources._hdf5 import h5py_module
from fastpipe.data.sources.lmdb import lmdb_module
from fastpipe.pack._errors import PackError
from fastpipe.pack._files import (
    check_output,
    install,
    progress_bar,
    remove_old_shards,
    size_on_disk,
)
from fastpipe.pack._inputs import FILE_KINDS, Inputs, Shaping, open_inputs
from fastpipe.pack._merge import merge_files
from fastpipe.pack._options import DEFAULT_SHARD_SIZE, PackOptions
from fastpipe.pack._reports import PackReport, storage_of
from fastpipe.pack._workers import (
    Job,
    ShardResult,
    Task,
    pack_here,
    pack_in_workers,
    shard_name,
    shard_ranges,
)
from fastpipe.pack._write import read_meta

_RERUN = "run the same command again to resume"
_RERUN_DATASET = "call pack again with resume=True (and the same dataset) to resume"


def pack(
    source: Any,
    output: str | os.PathLike,
    *,
    storage: str = "bytes",
    num_workers: int = 1,
    part: tuple[int, int] | str | None = None,
    merge: str | None = None,
    max_side: int | None = None,
    size: tuple[int, int] | str | int | None = None,
    strict: bool = False,
    progress: bool = True,
    format: str | None = None,
    quality: int = 90,
    transcode: bool = False,
    check: bool = True,
    shard_size: int = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    resume: bool | None = None,
    start_method: str | None = None,
    fields: Mapping[str, Field] | Sequence[str] | None = None,
) -> PackReport:
    """Packs images (or arrays, or records of named fields) into one HDF5 or LMDB file for fast
    random access.

    Args:
        source: what to pack: an ImageFolder root (``root/<class>/<image>``), a list file
            (``path [label]`` per line, paths relative to the list file; a ``#fields:`` line
            names columns of files per sample), a folder or list of ``.npy``/``.npz`` files,
            WebDataset tar shards, a pack (HDF5 or LMDB), a source of
            :mod:`fastpipe.data.sources`, or a map-style dataset (a Hugging Face dataset
            included) returning ``(image, label)`` or records: a dict of fields, or a tuple other
            than ``(image, int label)`` (e.g. two arrays). An ``(image, label)`` source packs as
            the record ``{"image", "label"}``; records are stored one HDF5 dataset per field
            (docs/your-data.md), each field exactly as the source gives it.
        output: the pack to write. Shards go to ``<output>.shards/<run>/`` first (one folder
            per run; an older run's folder is removed once the new output is installed).
        storage: ``"bytes"`` keeps encoded files (JPEG/PNG) as they are; ``"array"`` stores
            decoded fixed-shape arrays (images as uint8 ``(3, H, W)``).
        num_workers: processes packing shards in parallel (1 packs in this process).
        part: ``(i, n)`` or ``"i/n"``: pack only part ``i`` of ``n`` of the inputs (one
            machine's share of a multi-machine pack); combine the parts later with
            :func:`merge_packs`.
        merge: ``"virtual"`` (HDF5 default: a virtual dataset over the shard files, no copy;
            keep ``<output>.shards/`` next to the output) or ``"copy"`` (one self-contained
            contiguous file, the fastest to read; LMDB always copies).
        max_side: bytes storage: re-encode images whose shorter side exceeds this so it equals
            it (smaller images keep their original bytes).
        size: array storage: ``(H, W)`` (or one int for a square, or ``"HxW"``) to which each
            image is resized (aspect kept) and centre cropped. Without it all samples must
            share the first sample's shape.
        strict: stop at the first unreadable or corrupt input (:class:`CorruptInputError`)
            instead of skipping and listing it.
        progress: show a tqdm progress bar (files/s, ETA) on stderr.
        format: ``"hdf5"`` or ``"lmdb"``; default from the output suffix (``.lmdb`` means LMDB).
        quality: JPEG quality when re-encoding with ``max_side``.
        transcode: bytes storage and image fields of records: rewrite each JPEG and PNG
            losslessly so that a crop decodes only the part of the file around it (see
            docs/packing.md). A JPEG becomes a baseline JPEG with a restart marker after every
            MCU (its DCT coefficients copied, nothing re-quantized; needs ``fastpipe._jpeg``); a
            PNG of 8 or 16 bits per sample becomes a seekable PNG, its rows compressed in
            segments that inflate on their own (needs ``fastpipe._png``). Either is still a
            plain file every decoder reads as the same pixels (checked for each file). A file
            that cannot be rewritten keeps its original bytes; other formats are stored as
            they are.
        check: bytes storage: decode every input to catch corrupt files (off: trust the inputs).
        shard_size: inputs per shard at most; smaller shards lose less work on interruption.
        overwrite: replace an existing output. A complete output that is replaced is never
            resumed from: every shard is packed again.
        resume: keep the finished shards of an interrupted run with the same plan (source
            listing, settings) instead of packing them again. Default (None): on for folders and
            list files, whose plan includes every file's name, label, size and mtime; off for
            datasets, whose contents pack cannot see (pass ``resume=True`` when the dataset is
            unchanged).
        start_method: multiprocessing start method for workers (default: the platform's).
        fields: records: the fields, declared (``{"mix": ArrayField("float32", (4, 16000))}``,
            some or all; the rest are taken from the first sample) or, for tuples, their names
            (``["mix", "zone0"]``). Every sample must fit the fields: a dtype or shape that
            differs is an error naming the sample and the field, never a cast. A variable first
            axis must be declared (``ArrayField("float32", (None, 40))``). For tar shards, packs
            and source objects, whose files say how each field is stored: the names of the
            fields to pack, or fields declared with their role (``{"mask":
            ImageField(role=Mask())}``: the same storage, another role).

    Returns:
        A :class:`PackReport` with counts, the skipped inputs and their reasons, and timings.
    """
    started = time.perf_counter()
    output = Path(output)
    options = PackOptions(
        storage=storage, num_workers=num_workers, part=part, merge=merge, max_side=max_side,
        size=size, strict=strict, progress=progress, format=format, quality=quality,
        transcode=transcode, check=check, shard_size=shard_size, overwrite=overwrite, resume=resume,
        start_method=start_method,
    ).for_output(output)
    h5py_module()  # shards are HDF5 for both formats
    if options.format == "lmdb":
        lmdb_module()
    check_output(output, options.overwrite)
    shaping = Shaping(options.storage, options.max_side, options.size, options.quality,
                      options.check, options.transcode)
    inputs = open_inputs(source, fields, shaping)
    plan = _Plan.make(inputs, output, options)
    results, resumed = _pack_shards(plan)
    return _install_output(plan, results, resumed, started)


@dataclass
class _Plan:
    """Everything decided before packing starts: the inputs to pack, the shard ranges, where
    the shards go, and the metadata they carry."""

    inputs: Inputs
    output: Path
    options: PackOptions
    lo: int  # inputs [lo, hi): the whole source, or this part of it
    hi: int
    job: Job
    ranges: list[tuple[int, int]]
    root: Path  # <output>.shards
    replacing: bool  # a complete output exists and is being replaced

    @classmethod
    def make(cls, inputs: Inputs, output: Path, options: PackOptions) -> _Plan:
        count = inputs.count
        lo, hi = 0, count
        if options.part is not None:
            i, n = options.part
            lo, hi = i * count // n, (i + 1) * count // n
        schema = fmt.schema_meta(inputs.schema.fields, inputs.schema.record,
                                 inputs.schema.classes)
        fingerprint = inputs.fingerprint()
        plan = hashlib.sha256(json.dumps(
            [fingerprint, options.storage, schema, options.plan_json()],
            sort_keys=True).encode()).hexdigest()[:24]
        meta = {
            "format": fmt.FORMAT, "version": fmt.VERSION, **schema,
            "source": dict(inputs.describe(), fingerprint=fingerprint),
            "options": options.plan_json(), "plan": plan,
            "shard": list(options.part) if options.part is not None else None,
            "writer": f"fastpipe {__version__}",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        # Each run's shards live in their own folder, named by its plan, so a rerun finds them.
        # When a complete output is replaced, its shards may be the ones a virtual output maps:
        # the new run packs into a fresh folder, and the old one goes only after the new output
        # is installed.
        replacing = output.exists()
        root = output.with_name(output.name + ".shards")
        directory = root / (f"{plan}-{secrets.token_hex(4)}" if replacing else plan)
        job = Job(inputs, meta, directory, options.strict,
                  _RERUN if inputs.kind in FILE_KINDS else _RERUN_DATASET)
        return cls(inputs, output, options, lo, hi, job,
                   shard_ranges(lo, hi, options.num_workers, options.shard_size), root, replacing)

    @property
    def directory(self) -> Path:
        return self.job.directory

    @property
    def resume(self) -> bool:
        """Whether to keep finished shards. An existing complete output means the last run
        finished, so its shards are not reused (the inputs may have changed in ways the plan
        cannot see)."""
        resume = self.options.resume
        if resume is None:
            resume = self.inputs.kind in FILE_KINDS
        return resume and not self.replacing


def _pack_shards(plan: _Plan) -> tuple[dict[int, ShardResult], int]:
    """Packs the shards an earlier run did not finish; returns the results of all shards by
    start, and how many were kept from that run. On failure, a folder no rerun resumes from is
    removed."""
    plan.directory.mkdir(parents=True, exist_ok=True)
    kept = _resume(plan.directory, plan.ranges, plan.job.meta["plan"] if plan.resume else None)
    tasks = [Task(a, b) for a, b in plan.ranges if (a, b) not in kept]
    options = plan.options
    bar = progress_bar(options.progress, plan.hi - plan.lo, sum(b - a for a, b in kept),
                       "pack", "file")
    try:
        if kept and options.progress:
            bar.write(f"resuming: {len(kept)} of {len(plan.ranges)} shards already packed in "
                      f"{plan.directory}")
        if options.num_workers == 1:
            results = pack_here(plan.job, tasks, bar.update)
        elif tasks:
            results = pack_in_workers(plan.job, tasks, options.num_workers, bar.update,
                                      options.start_method)
        else:
            results = {}
    except BaseException as exc:
        if plan.replacing:  # a fresh folder that no rerun resumes from
            shutil.rmtree(plan.directory, ignore_errors=True)
        elif not any(plan.directory.iterdir()):
            plan.directory.rmdir()
        if not any(plan.root.iterdir()):
            plan.root.rmdir()
        if isinstance(exc, KeyboardInterrupt) and not exc.args:
            # Ctrl-C: say what a rerun will do with the shards this run finished.
            raise KeyboardInterrupt(_interrupted(plan)) from None
        raise
    finally:
        bar.close()
    results.update({a: kept[(a, b)] for a, b in kept})
    return results, len(kept)


def _interrupted(plan: _Plan) -> str:
    """What a rerun of an interrupted pack will do: resume the shards finished so far, or not."""
    total = len(plan.ranges)
    written = ([p for p in plan.directory.iterdir()
                if p.name.startswith("part-") and p.name.endswith(".h5")]
               if plan.directory.is_dir() else [])
    if plan.replacing:
        return (f"the existing {plan.output} is unchanged; a rerun with overwrite=True packs "
                f"all {total} shards again")
    if not written:
        return f"none of the {total} shards was finished; a rerun starts over"
    how = plan.job.resume_hint
    if not plan.resume and plan.inputs.kind in FILE_KINDS:
        how = "call pack again without resume=False to resume"
    return (f"{len(written)} of {total} shards are written in {plan.directory}; "
            f"{how} (the finished shards are kept, the others are packed again)")


def _resume(directory: Path, ranges: list[tuple[int, int]], plan: str | None
            ) -> dict[tuple[int, int], ShardResult]:
    """Finished shards of this plan, kept; partial files and shards of other plans (all, when
    ``plan`` is None), removed."""
    wanted = {shard_name(a, b): (a, b) for a, b in ranges}
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
                meta = read_meta(path)
            except (PackFormatError, OSError):
                meta = None
        a_b = wanted.get(path.name)
        if meta is not None and meta.get("plan") == plan and tuple(meta.get("range", ())) == a_b:
            kept[a_b] = ShardResult(int(meta["count"]), list(meta.get("skipped", [])))
        else:
            path.unlink()  # from an older run with other settings or another split
    return kept


def _install_output(plan: _Plan, results: dict[int, ShardResult], resumed: int,
                    started: float) -> PackReport:
    """Merges the shards into the output (one HDF5 shard with a virtual merge is the output
    itself), installs it, removes shard folders no output uses, and reports."""
    options, output = plan.options, plan.output
    shard_files = [plan.directory / shard_name(a, b) for a, b in plan.ranges]
    skipped = [s for a, _ in plan.ranges for s in results[a].skipped]
    count = sum(results[a].count for a, _ in plan.ranges)
    if count == 0:
        reasons = "; ".join(f"{s['source']}: {s['reason']}" for s in skipped[:3])
        raise PackError(
            f"nothing was packed: all {plan.hi - plan.lo} inputs were skipped ({reasons}"
            f"{' ...' if len(skipped) > 3 else ''}); fix them or point pack at other inputs")
    single = options.format == "hdf5" and options.merge == "virtual" and len(shard_files) == 1
    if single:
        install(shard_files[0], output)  # one shard is already a complete pack
        remove_old_shards(plan.root, None)
    else:
        meta = dict(plan.job.meta, range=[plan.lo, plan.hi], inputs=plan.hi - plan.lo,
                    skipped=skipped)
        tmp = output.with_name(output.name + ".partial")
        merge_files(shard_files, tmp, meta, options.format, options.merge, options.progress,
                    plan.inputs.schema)
        install(tmp, output)
        remove_old_shards(plan.root, plan.directory if options.merge == "virtual" else None)
    return PackReport(output, options.format, storage_of(plan.inputs.schema),
                      "none" if single else options.merge, plan.hi - plan.lo, count, skipped,
                      len(plan.ranges), resumed, time.perf_counter() - started,
                      size_on_disk(output, read_meta(output)))

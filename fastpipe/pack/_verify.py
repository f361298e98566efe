"""``verify``: check a pack's metadata, index, every field's checksums and its images, through the
sources (fastpipe.data.sources), for packs of every format version."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format import layout as fmt
from fastpipe.data.format.fields import FieldError
from fastpipe.data.format.layout import PackFormatError, sniff_format
from fastpipe.data.sources._base import Source
from fastpipe.data.sources._engine import resource_error
from fastpipe.pack._files import progress_bar
from fastpipe.pack._inputs import image_fields
from fastpipe.pack._reports import VerifyReport, storage_of
from fastpipe.pack._write import open_pack, read_meta

# Samples read at once; a batch that fails is read again sample by sample to name the damage.
_BATCH = 64
# What reading a damaged pack may raise by contract; anything else is reported as unexpected.
READ_ERRORS = (PackFormatError, OSError, ValueError)


def verify(path: str | os.PathLike, sample: int | None = None, *, seed: int = 0,
           progress: bool = False, max_problems: int = 1000) -> VerifyReport:
    """Checks a pack: its metadata, index (offsets, labels within their classes, source paths),
    every field's checksum of every sample, and that image fields (roles Image and Mask) decode.

    ``sample=K`` checks K random samples instead of all. Problems are collected, not raised: the
    report's ``ok`` says whether the pack is sound. A limit of the machine (open files, memory)
    is raised, never reported as damage.
    """
    started = time.perf_counter()
    report = VerifyReport(Path(path))
    try:
        report.format = sniff_format(path)
        source = open_pack(Path(path))
    except (PackFormatError, OSError, FieldError) as exc:
        if resource_error(exc):
            raise
        missing, files = missing_parts(Path(path)) if report.format == "hdf5" else (None, [])
        if missing is not None:
            report.problems.append(missing)
        if missing is None or not any(str(f) in str(exc) for f in files):
            report.problems.append(str(exc))  # not (only) the missing part files
        return _done(report, started)

    def problem(text: str) -> None:
        if len(report.problems) < max_problems:
            report.problems.append(text)

    with source:
        try:
            report.count = source.count
            report.storage = storage_of(source.schema)
            report.skipped_inputs = len(source.meta.get("skipped") or [])
            _check_metadata(Path(path), report, problem)
            _check_index(source, report, problem)
            _check_samples(source, _indices(source.count, sample, seed), report, problem,
                           str(path), progress)
        except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
            if resource_error(exc):
                raise
            report.problems.append(unexpected(exc, "checking the pack"))
    return _done(report, started)


def _done(report: VerifyReport, started: float) -> VerifyReport:
    report.seconds = time.perf_counter() - started
    return report


def missing_parts(path: Path) -> tuple[str | None, list[Path]]:
    """What is missing of a virtual pack's part files (the folder when it is gone, the files
    otherwise) and those files; None and [] when nothing is."""
    try:
        meta = read_meta(path)
    except (PackFormatError, OSError):
        return None, []  # the reader says what is wrong with the pack itself
    parts = meta.get("parts") if meta.get("merge") == "virtual" else None
    if not isinstance(parts, list):
        return None, []
    files = [path.parent / p["file"] for p in parts
             if isinstance(p, dict) and isinstance(p.get("file"), str)]
    missing = [f for f in files if not f.exists()]
    if not missing:
        return None, []
    folders = sorted({f.parent for f in missing})
    gone = sorted({_outermost_missing(d, path.parent) for d in folders if not d.exists()})
    # The folder named is the one that is missing, wherever the merge put the parts: a pack's
    # own <pack>.shards, or the .shards folders of the packs merge_packs combined.
    fix = ("put it back at that path (the pack reads its part files where it recorded them, "
           "relative to the pack's own folder), or pack the source again with merge='copy' for "
           "one self-contained file")
    if gone:
        more = f" (and {len(gone) - 1} more folders)" if len(gone) > 1 else ""
        return (f"{path} is a virtual pack whose part files are missing: the folder {gone[0]} "
                f"is gone{more}, and with it {len(missing)} of the pack's {len(files)} part "
                f"files; {fix}", missing)
    shown = ", ".join(f.name for f in missing[:3]) + (" ..." if len(missing) > 3 else "")
    return (f"{path} is a virtual pack whose part files are missing: {shown} ({len(missing)} "
            f"of {len(files)}) are not in the folder {folders[0]}; "
            + fix.replace("put it back", "put them back"), missing)


def _outermost_missing(folder: Path, base: Path) -> Path:
    """The outermost missing folder on the way from ``base`` to ``folder`` (the .shards folder,
    when it is gone as a whole)."""
    while folder.parent != base and not folder.parent.exists():
        folder = folder.parent
    return folder


def unexpected(exc: BaseException, doing: str) -> str:
    """A problem line for an error no reader documents (a defect of fastpipe's to report)."""
    return f"unexpected {type(exc).__name__} while {doing}: {exc} (please report this)"


def _indices(count: int, sample: int | None, seed: int) -> np.ndarray:
    if sample is None or sample >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, int(sample), replace=False))


def _check_metadata(path: Path, report: VerifyReport, problem) -> None:
    """The metadata against the checksum stored with it (its types and ranges were checked when
    the pack opened); a pack written before the checksum is noted as unchecked."""
    try:
        meta = read_meta(path)
    except (PackFormatError, OSError) as exc:
        if resource_error(exc):
            raise
        problem(str(exc))
        return
    reason = fmt.unsealed_reason(meta, str(path))
    if reason is not None:
        problem(reason)
    elif not fmt.has_checksum(meta):
        report.notes.append(
            f"the metadata has no checksum (format version {meta['version']}"
            f"{', written before fastpipe stored one' if meta['version'] == fmt.VERSION else ''}"
            "): its values were checked for type and range only, not against what fastpipe "
            "wrote; fastpipe pack --upgrade OLD NEW (fastpipe.pack.upgrade) rewrites the pack "
            "with one")


def _check_index(source: Source, report: VerifyReport, problem) -> None:
    """Counts that add up, the source paths' index. (Offsets and labels are checked when the
    pack opens: a damaged one is an error then, reported above.)"""
    meta = source.meta
    if "inputs" in meta and meta["inputs"] != source.count + report.skipped_inputs:
        problem(f"metadata says {meta['inputs']} inputs, but {source.count} samples + "
                f"{report.skipped_inputs} skipped do not add up")
    try:  # the path index is read, and checked, on first use
        source.paths(0, 0)
    except READ_ERRORS as exc:
        if resource_error(exc):
            raise
        problem(str(exc))


def _check_samples(source: Source, indices: np.ndarray, report: VerifyReport, problem,
                   path: str, progress: bool) -> None:
    """Each field of each sample reads and matches its checksum; image fields decode."""
    names = source.schema.names
    pair = source.schema.record == "pair"
    images = set(image_fields(source.schema))
    crcs: dict[str, Any] = {}
    for name in names:
        try:
            stored = source.crc32(name)
        except READ_ERRORS as exc:
            if resource_error(exc):
                raise
            problem(str(exc))
            continue
        if stored is not None:
            crcs[name] = stored

    def where(i: int, name: str) -> str:
        field = "" if pair and name == names[0] else f", field {name!r}"
        return f"sample {i} ({_safe_source(source, i)}){field}"

    with progress_bar(progress, len(indices), 0, "verify", "sample") as bar:
        for start in range(0, len(indices), _BATCH):
            batch = indices[start:start + _BATCH].tolist()
            for i, record in zip(batch, _read(source, batch, names, problem), strict=True):
                bar.update(1)
                report.checked += 1
                for name in names:
                    if name not in record:
                        continue  # not readable: reported
                    data = np.ascontiguousarray(record[name])
                    if name in crcs and zlib.crc32(data) != int(crcs[name][i]):
                        problem(f"{where(i, name)}: checksum mismatch, the stored data is "
                                "damaged")
                        continue
                    if name in images:
                        _decodes(data, f"{path}[{i}]" if pair else f"{path}[{i}][{name!r}]",
                                 where(i, name), problem)


def _read(source: Source, batch: list[int], names: list[str], problem) -> list[dict[str, Any]]:
    """The stored fields of samples ``batch``; a batch that does not read is read again field by
    field, sample by sample, to name what is damaged (left out of its record)."""
    try:
        return source.read_batch(batch, names=names)
    except Exception as exc:  # noqa: BLE001 - sorted out below, sample by sample
        if resource_error(exc):
            raise
    out = []
    for i in batch:
        record = {}
        for name in names:
            try:
                record[name] = source.read(i, [name])[name]
            except READ_ERRORS as exc:
                if resource_error(exc):
                    raise
                problem(f"sample {i}, field {name!r}: cannot read: {exc}")
            except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
                problem(unexpected(exc, f"reading field {name!r} of sample {i}"))
        out.append(record)
    return out


def _decodes(data: np.ndarray, name: str, where: str, problem) -> None:
    from fastpipe.data.decode.budget import CorruptImageError
    from fastpipe.data.decode.image import decode_rgb

    try:
        decode_rgb(data, name)
    except CorruptImageError as exc:
        problem(f"{where}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
        problem(unexpected(exc, f"decoding {where}"))


def _safe_source(source: Source, index: int) -> str:
    try:
        return source.paths(index, index + 1)[0]
    except Exception:  # noqa: BLE001 - the path index may be damaged too
        return "source unknown"


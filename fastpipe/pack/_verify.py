"""``verify``: check a pack's metadata, index arrays, checksums and images."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import numpy as np

from fastpipe.data._format import PackFormatError, is_record_reader, open_pack, sniff_format
from fastpipe.data.h5 import H5PackReader, H5RecordReader
from fastpipe.pack._files import progress_bar
from fastpipe.pack._reports import VerifyReport


def verify(path: str | os.PathLike, sample: int | None = None, *, seed: int = 0,
           progress: bool = False, max_problems: int = 1000) -> VerifyReport:
    """Checks a pack: metadata, index arrays, every sample's checksum, and that images decode.

    ``sample=K`` checks K random samples instead of all. Problems are collected, not raised: the
    report's ``ok`` says whether the pack is sound.
    """
    started = time.perf_counter()
    report = VerifyReport(Path(path))
    try:
        report.format = sniff_format(path)
        reader = open_pack(path, report.format)
    except (PackFormatError, OSError) as exc:
        report.problems.append(str(exc))
        report.seconds = time.perf_counter() - started
        return report

    def problem(text: str) -> None:
        if len(report.problems) < max_problems:
            report.problems.append(text)

    with reader:
        try:
            report.count = reader.count
            report.skipped_inputs = len(reader.meta.get("skipped") or [])
            indices = _indices(reader.count, sample, seed)
            if is_record_reader(reader):
                report.storage = "fields"
                _check_records(reader, indices, report, problem, path, progress)
            else:
                report.storage = reader.spec.storage
                _check_index(reader, report, problem)
                _check_samples(reader, indices, report, problem, path, progress)
        except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
            report.problems.append(unexpected(exc, "checking the pack"))
    report.seconds = time.perf_counter() - started
    return report


# What reading a damaged pack may raise by contract; anything else is reported as unexpected.
READ_ERRORS = (PackFormatError, OSError, ValueError)


def unexpected(exc: BaseException, doing: str) -> str:
    """A problem line for an error no reader documents (a defect of fastpipe's to report)."""
    return f"unexpected {type(exc).__name__} while {doing}: {exc} (please report this)"


def _indices(count: int, sample: int | None, seed: int) -> np.ndarray:
    if sample is None or sample >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, int(sample), replace=False))


def _check_index(reader, report: VerifyReport, problem) -> None:
    """Labels in range, counts that add up, offsets that run forward from 0."""
    meta, labels = reader.meta, reader.labels
    if reader.classes:
        bad = np.flatnonzero((labels < 0) | (labels >= len(reader.classes)))
    else:
        bad = np.flatnonzero(labels < -1)
    for i in bad[:20]:
        problem(f"sample {i}: label {labels[i]} is outside the {len(reader.classes)} classes")
    if "inputs" in meta and meta["inputs"] != reader.count + report.skipped_inputs:
        problem(f"metadata says {meta['inputs']} inputs, but {reader.count} samples + "
                f"{report.skipped_inputs} skipped do not add up")
    if isinstance(reader, H5PackReader):
        try:  # the path index is loaded, and checked, on first use
            reader.sources(0, 0)
        except READ_ERRORS as exc:
            problem(str(exc))


def _check_samples(reader, indices: np.ndarray, report: VerifyReport, problem, path,
                   progress: bool) -> None:
    """Each sample reads, matches its checksum and (encoded images) decodes."""
    from fastpipe.data._decode import CorruptImageError, decode_rgb

    try:
        crcs = reader.crc32()
    except READ_ERRORS as exc:
        problem(str(exc))
        crcs = None
    decode = reader.spec.layout == "encoded"
    with progress_bar(progress, len(indices), 0, "verify", "sample") as bar:
        for i in indices:
            i = int(i)
            try:
                data = reader.read(i)
            except READ_ERRORS as exc:
                problem(f"sample {i}: cannot read: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
                problem(unexpected(exc, f"reading sample {i}"))
                continue
            finally:
                bar.update(1)
            report.checked += 1
            if crcs is not None and zlib.crc32(np.ascontiguousarray(data)) != int(crcs[i]):
                problem(f"sample {i} ({_safe_source(reader, i)}): checksum mismatch, the stored "
                        "data is damaged")
                continue
            if decode:
                try:
                    decode_rgb(data, f"{path}[{i}]")
                except CorruptImageError as exc:
                    problem(f"sample {i} ({_safe_source(reader, i)}): {exc}")
                except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
                    problem(unexpected(exc, f"decoding sample {i}"))


def _check_records(reader: H5RecordReader, indices: np.ndarray, report: VerifyReport, problem,
                   path, progress: bool) -> None:
    """Each field of each sample reads and matches its checksum; image fields decode; the
    offsets of variable fields run forward from 0."""
    from fastpipe.data._decode import CorruptImageError, decode_rgb

    if "inputs" in reader.meta and reader.meta["inputs"] != reader.count + report.skipped_inputs:
        problem(f"metadata says {reader.meta['inputs']} inputs, but {reader.count} samples + "
                f"{report.skipped_inputs} skipped do not add up")
    crcs = {}
    for name in reader.order:
        offsets = reader.offsets(name)
        if offsets is not None and (offsets[0] != 0 or np.any(np.diff(offsets) < 0)):
            problem(f"field {name!r}: its offsets are not a non-decreasing run from 0; the index "
                    "is damaged")
        try:
            crcs[name] = reader.crc32(name)
        except READ_ERRORS as exc:
            problem(str(exc))
    with progress_bar(progress, len(indices), 0, "verify", "sample") as bar:
        for i in indices:
            i = int(i)
            bar.update(1)
            report.checked += 1
            for name in reader.order:
                try:
                    data = reader.read(i, name)
                except READ_ERRORS as exc:
                    problem(f"sample {i}, field {name!r}: cannot read: {exc}")
                    continue
                except Exception as exc:  # noqa: BLE001 - a damaged pack must never crash verify
                    problem(unexpected(exc, f"reading field {name!r} of sample {i}"))
                    continue
                if name in crcs and zlib.crc32(np.ascontiguousarray(data)) != int(crcs[name][i]):
                    problem(f"sample {i} ({_safe_source(reader, i)}), field {name!r}: checksum "
                            "mismatch, the stored data is damaged")
                    continue
                if reader.fields[name].kind == "image":
                    try:
                        decode_rgb(data, f"{path}[{i}][{name!r}]")
                    except CorruptImageError as exc:
                        problem(f"sample {i} ({_safe_source(reader, i)}), field {name!r}: {exc}")
                    except Exception as exc:  # noqa: BLE001 - never crash verify
                        problem(unexpected(exc, f"decoding field {name!r} of sample {i}"))


def _safe_source(reader, index: int) -> str:
    try:
        return reader.source(index)
    except Exception:  # noqa: BLE001 - the path index may be damaged too
        return "source unknown"

"""``merge_packs``: combine packs (the parts of a multi-machine pack, or any compatible packs)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastpipe.data._format import is_record_reader, open_pack
from fastpipe.pack._errors import PackError
from fastpipe.pack._files import check_output, install, progress_bar, size_on_disk
from fastpipe.pack._options import default_merge, format_for
from fastpipe.pack._records import write_merged_records, write_records_lmdb
from fastpipe.pack._reports import PackReport
from fastpipe.pack._write import write_lmdb, write_merged_h5


def merge_packs(
    parts: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    merge: str | None = None,
    format: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PackReport:
    """Combines packs (typically the ``part=(i, n)`` packs made on several machines) into one.

    Packs made with ``part`` are put in part order and must all come from the same source and
    settings, with none missing. Other packs are concatenated in the order given and must share
    storage, sample shape and classes. ``merge="virtual"`` (HDF5 only) maps the parts without
    copying them: they must stay where they are, relative to the output.
    """
    started = time.perf_counter()
    output = Path(output)
    format = format_for(output, format)
    merge = default_merge(format, merge)
    if not parts:
        raise ValueError("merge_packs needs at least one part")
    paths = [Path(p) for p in parts]
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such pack: {p}")
    if output.resolve() in {p.resolve() for p in paths}:
        raise ValueError(f"the output {output} is also one of the parts")
    check_output(output, overwrite)
    metas = []
    for p in paths:
        with open_pack(p) as reader:
            metas.append(reader.meta)
    order = _order_parts(paths, metas)
    paths = [paths[k] for k in order]
    metas = [metas[k] for k in order]
    skipped = [s for m in metas for s in m.get("skipped", [])]
    inputs = sum(int(m.get("inputs", m["count"])) for m in metas)
    meta = dict(metas[0], skipped=skipped, inputs=inputs, shard=None,
                merged_from=[os.path.relpath(p, output.parent) for p in paths],
                created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if all(m.get("range") for m in metas):
        meta["range"] = [metas[0]["range"][0], metas[-1]["range"][1]]
    tmp = output.with_name(output.name + ".partial")
    merge_files(paths, tmp, meta, format, merge, progress)
    install(tmp, output)
    with open_pack(output, format) as reader:
        count, final_meta = reader.count, reader.meta
        storage = reader.spec.storage if hasattr(reader, "spec") else "fields"
    return PackReport(output, format, storage, merge, inputs, count, skipped, len(paths), 0,
                      time.perf_counter() - started, size_on_disk(output, final_meta))


def merge_files(files: Sequence[Path], tmp: Path, meta: dict[str, Any], format: str,
                merge: str, progress: bool) -> None:
    """Writes the packs ``files`` as one pack at ``tmp`` (removed again when this fails)."""
    readers = [open_pack(f) for f in files]
    try:
        total = sum(r.count for r in readers)
        with progress_bar(progress and (merge == "copy" or format == "lmdb"), total, 0,
                          f"merge ({'lmdb' if format == 'lmdb' else merge})", "sample") as bar:
            if tmp.exists():
                tmp.unlink()
            if is_record_reader(readers[0]):
                if format == "lmdb":
                    write_records_lmdb(readers, tmp, meta, bar.update)
                else:
                    write_merged_records(readers, tmp, meta, merge, bar.update)
            elif any(is_record_reader(r) for r in readers):
                raise PackError("records packs and (image, label) packs do not merge together")
            elif format == "lmdb":
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


def _order_parts(paths: list[Path], metas: list[dict[str, Any]]) -> list[int]:
    """The order to merge in: part order for the parts of one run, else as given. Refuses packs
    that do not belong together."""

    def describe(m: dict[str, Any]) -> tuple:
        if "fields" in m:
            return ("fields", str(m["fields"]), tuple(m["order"]))
        return (m["storage"], m["layout"], tuple(m.get("sample_shape") or ()), m.get("dtype"))

    for p, m in zip(paths, metas, strict=True):
        if describe(m) != describe(metas[0]):
            raise PackError(f"{p} holds {describe(m)} samples but {paths[0]} holds "
                            f"{describe(metas[0])}: only packs with the same storage and sample "
                            "shape merge")
        if m["classes"] != metas[0]["classes"]:
            raise PackError(f"{p} and {paths[0]} have different class lists; merged labels "
                            "would be wrong")
    # The metadata key keeps its name from the format's first version: "shard" is the part.
    numbered = [m.get("shard") for m in metas]
    if not any(numbered):
        return list(range(len(paths)))
    if not all(numbered):
        raise PackError("some packs were made with part=(i, n) and some were not; merge one kind")
    n = numbered[0][1]
    plans = {m.get("plan") for m in metas}
    if any(s[1] != n for s in numbered) or len(plans) != 1:
        raise PackError("the parts come from different pack runs (other part counts, sources or "
                        "settings)")
    seen: dict[int, Path] = {}
    for p, (i, _) in zip(paths, numbered, strict=True):
        if i in seen:
            raise PackError(f"part {i}/{n} is given twice: {seen[i]} and {p}")
        seen[i] = p
    missing = sorted(set(range(n)) - set(seen))
    if missing:
        raise PackError(f"parts {', '.join(f'{i}/{n}' for i in missing)} are missing; merge "
                        f"needs all {n}")
    return sorted(range(len(paths)), key=lambda k: numbered[k][0])

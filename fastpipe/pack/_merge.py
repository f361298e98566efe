"""``merge_packs``: combine packs (the parts of a multi-machine pack, or any compatible packs);
``upgrade``: rewrite a pack of an earlier format version as the current one.

Parts are read through the sources (fastpipe.data.sources), one at a time, so parts of any
format version merge by copy and a thousand parts never hold a thousand files open; the output is
always of the current format (fastpipe.pack._write).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastpipe.data.format import layout as fmt
from fastpipe.data.sources._base import Schema
from fastpipe.pack._errors import PackError
from fastpipe.pack._files import check_output, install, progress_bar, size_on_disk
from fastpipe.pack._options import default_merge, format_for
from fastpipe.pack._reports import PackReport, storage_of
from fastpipe.pack._write import merge_hdf5, open_pack, read_meta, write_lmdb

# Metadata keys a merge or an upgrade writes anew: the schema (version 1 described it in other
# keys), the count, what was merged and how.
_REWRITTEN = ("format", "version", "count", "fields", "order", "record", "classes", "merge",
              "parts", *fmt.IMAGE_KEYS)


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
    settings, with none missing. Other packs are concatenated in the order given and must hold
    the same fields (and classes). ``merge="virtual"`` (HDF5 only) maps the parts without copying
    them: they must stay where they are, relative to the output, and be of format version 2 or
    later (merge older ones with ``merge="copy"``, which reads packs of every version). The output
    is of the current format version.
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
    for p in paths:
        _check_sealed(p, "merge_packs")
    described = [_describe(p) for p in paths]
    order = _order_parts(paths, described)
    paths = [paths[k] for k in order]
    metas = [described[k][0] for k in order]
    schema = described[order[0]][1]
    skipped = [s for m in metas for s in m.get("skipped", [])]
    inputs = sum(int(m.get("inputs", m["count"])) for m in metas)
    meta = output_meta(metas[0], schema, skipped=skipped, inputs=inputs, shard=None,
                       merged_from=[os.path.relpath(p, output.parent) for p in paths],
                       created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if all(m.get("range") for m in metas):
        meta["range"] = [metas[0]["range"][0], metas[-1]["range"][1]]
    tmp = output.with_name(output.name + ".partial")
    merge_files(paths, tmp, meta, format, merge, progress, schema)
    install(tmp, output)
    final = read_meta(output)
    return PackReport(output, format, storage_of(schema), merge, inputs, int(final["count"]),
                      skipped, len(paths), 0, time.perf_counter() - started,
                      size_on_disk(output, final))


def upgrade(old: str | os.PathLike, new: str | os.PathLike, *, format: str | None = None,
            overwrite: bool = False, progress: bool = True) -> PackReport:
    """Rewrites the pack ``old`` (of any format version, HDF5 or LMDB, virtual or not) as a pack
    of the current format at ``new`` (LMDB for a ``.lmdb`` name or ``format="lmdb"``): the same
    samples bit for bit (each field's stored bytes, labels, source paths, checksums), its
    metadata (plan, source, options, skipped inputs, part) kept, one self-contained copy. Read
    the new pack, then replace the old one with it."""
    started = time.perf_counter()
    old, new = Path(old), Path(new)
    format = format_for(new, format)
    if not old.exists():
        raise FileNotFoundError(f"no such pack: {old}")
    if new.exists() and new.resolve() == old.resolve():
        raise ValueError(f"upgrade writes a new pack: give another path than {old} (then "
                         "replace the old pack with it)")
    check_output(new, overwrite)
    sealed = _check_sealed(old, "upgrade")
    meta, schema = _describe(old)
    final = output_meta(meta, schema, upgraded_from=int(meta["version"]))
    tmp = new.with_name(new.name + ".partial")
    merge_files([old], tmp, final, format, "copy", progress, schema)
    install(tmp, new)
    written = read_meta(new)
    inputs = int(meta.get("inputs", meta["count"]))
    report = PackReport(new, format, storage_of(schema), "copy", inputs, int(written["count"]),
                        list(meta.get("skipped") or []), 1, 0, time.perf_counter() - started,
                        size_on_disk(new, written))
    if not sealed:
        report.notes.append(
            f"{old} had no metadata checksum: the one {new} now stores covers its metadata as "
            "it stood at the upgrade, unchecked until then (a value edited or damaged before "
            "it is now sealed as it reads); fastpipe verify NEW checks the samples against "
            "their checksums, not the metadata against what fastpipe first wrote")
    return report


def _check_sealed(path: Path, doing: str) -> bool:
    """Refuses a pack whose metadata fails its checksum: written again, it would be sealed with
    a new one, and verify would call the edited metadata sound. Whether it has one."""
    meta = read_meta(path)
    reason = fmt.unsealed_reason(meta, str(path))
    if reason is not None:
        raise PackError(f"{reason}. {doing} refuses it: it would store the metadata as it now "
                        "reads under a new checksum")
    return fmt.has_checksum(meta)


def output_meta(meta: dict[str, Any], schema: Schema, **updates: Any) -> dict[str, Any]:
    """The metadata of a pack written from packs whose first has ``meta`` and whose records are
    ``schema``: the current format's schema keys, the rest (plan, source, options, skipped
    inputs, ...) kept, then ``updates``."""
    kept = {k: v for k, v in meta.items() if k not in _REWRITTEN}
    return {"format": fmt.FORMAT, "version": fmt.VERSION, **kept,
            **fmt.schema_meta(schema.fields, schema.record, schema.classes), **updates}


def merge_files(files: Sequence[Path], tmp: Path, meta: dict[str, Any], format: str,
                merge: str, progress: bool, schema: Schema | None = None) -> None:
    """Writes the packs ``files`` as one pack at ``tmp`` (removed again when this fails), with
    the records ``schema`` (the first file's by default)."""
    if schema is None:
        schema = _describe(files[0])[1]
    try:
        total = sum(int(read_meta(f)["count"]) for f in files)
        with progress_bar(progress and (merge == "copy" or format == "lmdb"), total, 0,
                          f"merge ({'lmdb' if format == 'lmdb' else merge})", "sample") as bar:
            for suffix in ("", "-lock"):
                Path(str(tmp) + suffix).unlink(missing_ok=True)
            if format == "lmdb":
                write_lmdb(files, tmp, meta, schema, bar.update)
            else:
                merge_hdf5(files, tmp, meta, schema, merge, bar.update)
    except BaseException:
        for suffix in ("", "-lock"):
            Path(str(tmp) + suffix).unlink(missing_ok=True)
        raise


def _describe(path: Path) -> tuple[dict[str, Any], Schema]:
    """A pack's metadata and records, from its source (opened on its own, then closed)."""
    with open_pack(path) as source:
        return source.meta, source.schema


def _order_parts(paths: list[Path], described: list[tuple[dict[str, Any], Schema]]) -> list[int]:
    """The order to merge in: part order for the parts of one run, else as given. Refuses packs
    that do not belong together."""
    metas = [m for m, _ in described]
    first = described[0][1]

    def shape(schema: Schema) -> tuple:
        return (schema.record, {n: f.to_json() for n, f in schema.fields.items()})

    for p, (_, schema) in zip(paths, described, strict=True):
        if shape(schema) != shape(first):
            raise PackError(f"{p} holds {_fields_of(schema)} but {paths[0]} holds "
                            f"{_fields_of(first)}: only packs of the same fields (the same "
                            "storage and sample shape) merge")
        if schema.classes != first.classes:
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


def _fields_of(schema: Schema) -> str:
    if schema.record == "pair":
        image = next(iter(schema.fields.values()))
        return f"(image, label) samples of {image!r}"
    return f"the fields {', '.join(f'{n}: {f!r}' for n, f in schema.fields.items())}"

"""Pack-reader targets of the fuzz driver (fuzz/harness.py): damaged packs, opened and read.

Small pristine packs of the corpus' images are made once per process (HDF5 copy, virtual and
array packs, an HDF5 records pack merged virtually, LMDB image and records packs). Each execution
copies one, damages it at random (flipped bytes in the stored arrays of an HDF5 pack, and with
``FUZZ_STRUCTURE=1`` anywhere, HDF5 and LMDB structures included; a metadata value replaced by
another type or range; an element of an offsets, labels or checksum array; parts of a virtual
merge swapped, truncated or removed; LMDB keys removed, cut short or replaced; a sample's bytes
replaced by the mutated input), then opens it, reads every sample and runs ``verify``.

What a damaged pack may give: :class:`~fastpipe.data.PackFormatError` (at open or at a read),
:class:`~fastpipe.data.CorruptImageError` (a sample that does not decode) or
:class:`~fastpipe.data.format.fields.FieldError`. A finding is any other exception, ``verify``
raising or reporting an ``unexpected`` error, samples read without an error that differ from the
pristine pack's while ``verify`` calls the pack sound (silently wrong data), or metadata that
reads other than the pristine pack's while ``verify`` calls the pack sound without noting its
metadata unchecked (the metadata's checksum, which every pack written now carries, catches an
edit; with the checksum's own key removed, verify says the metadata is unchecked).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# The images the pristine packs hold: small seeds of the corpus, so that reads and verify's
# decodes take milliseconds.
SEEDS_PER_PACK = 6


class Finding(Exception):
    """A damaged pack read silently wrong, or an error outside the readers' contract."""


class _Images:
    """(encoded image, label) samples of the given seeds, three classes."""

    classes = ["a", "b", "c"]

    def __init__(self, seeds: list[bytes]) -> None:
        self.seeds = seeds

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self.seeds):
            raise IndexError(i)
        return self.seeds[i], i % 3


class _Arrays:
    classes = ["a", "b"]

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        if not 0 <= i < 6:
            raise IndexError(i)
        return np.random.default_rng(i).integers(0, 256, (5, 7, 3), dtype=np.uint8), i % 2


class _Records:
    classes = ["x", "y", "z"]

    def __init__(self, seeds: list[bytes]) -> None:
        self.seeds = seeds

    def __len__(self) -> int:
        return len(self.seeds)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self.seeds):
            raise IndexError(i)
        return {"image": self.seeds[i], "frames": np.arange(i % 4 + 1, dtype=np.int64) * i,
                "score": np.float32(i) / 3, "label": i % 3}


class Workspace:
    """The pristine packs and what they read as, made on first use."""

    def __init__(self, seeds: list[bytes]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fastpipe-fuzz-packs-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        self.pristine: dict[str, Path] = {}
        self.expected: dict[str, list[Any]] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        self._make(seeds)

    def _make(self, seeds: list[bytes]) -> None:
        from fastpipe.data.format.fields import ArrayField
        from fastpipe.pack import pack

        images = _Images(_decodable(seeds))
        records = _Records(images.seeds)
        made = self.root / "pristine"
        made.mkdir()
        specs = {
            "h5_copy": (images, {"merge": "copy"}),
            "h5_virtual": (images, {"merge": "virtual", "shard_size": 2}),
            "h5_array": (_Arrays(), {"merge": "copy", "storage": "array"}),
            "h5_records": (records, {"merge": "virtual", "shard_size": 2,
                                     "fields": {"frames": ArrayField("int64", (None,))}}),
            "lmdb": (images, {"format": "lmdb"}),
            "lmdb_records": (records, {"format": "lmdb",
                                       "fields": {"frames": ArrayField("int64", (None,))}}),
        }
        for name, (source, options) in specs.items():
            suffix = ".lmdb" if options.get("format") == "lmdb" else ".h5"
            path = made / (name + suffix)
            pack(source, path, progress=False, **options)
            self.pristine[name] = path
            self.expected[name] = read_all(path)
            self.meta[name] = _meta(path)

    def copy(self, name: str, into: Path) -> Path:
        if into.exists():
            shutil.rmtree(into)
        into.mkdir(parents=True)
        source = self.pristine[name]
        shards = source.with_name(source.name + ".shards")
        if shards.exists():
            shutil.copytree(shards, into / shards.name)
        shutil.copy(source, into / source.name)
        return into / source.name


def _decodable(seeds: list[bytes]) -> list[bytes]:
    from fastpipe.data import decode_rgb

    out = []
    for data in sorted(seeds, key=len):
        try:
            decode_rgb(data)
        except Exception:  # noqa: BLE001 - only seeds that decode go into the pristine packs
            continue
        out.append(data)
        if len(out) == SEEDS_PER_PACK:
            break
    if len(out) < 3:
        raise SystemExit("the corpus has fewer than 3 decodable seeds for the pack targets")
    return out


def _open(path: Path):
    from fastpipe.data import H5Dataset, LMDBDataset

    return (LMDBDataset if path.suffix == ".lmdb" else H5Dataset)(path)


def _stored(ds, i: int) -> Any:
    """Sample ``i`` as stored (no decode), for comparing with the pristine pack."""
    if getattr(ds, "fields", None):
        value = ds[i]
        items = value.items() if isinstance(value, dict) else enumerate(value)
        return {k: np.asarray(v).tobytes() for k, v in items}
    if ds.storage == "bytes":
        data, label = ds.encoded(i)
        return bytes(np.asarray(data)), int(label)
    image, label = ds[i]
    return np.asarray(image).tobytes(), int(label)


def _meta(path: Path) -> dict[str, Any] | None:
    """The pack's checked metadata, or None where it does not read."""
    from fastpipe.data import PackFormatError
    from fastpipe.pack._write import read_meta

    try:
        return read_meta(path)
    except (PackFormatError, OSError):
        return None


def read_all(path: Path) -> list[Any]:
    ds = _open(path)
    try:
        return [_stored(ds, i) for i in range(len(ds))]
    finally:
        ds.close()


# --- damage ---------------------------------------------------------------------------------

INTERESTING = [0, 1, -1, 2, 7, 255, 256, 2**31 - 1, 2**31, 2**32, 2**62, -2**62, 2**63 - 1]
ODD_VALUES = [None, 7, -1, 0, "x", "", [], {}, [1, "a"], [-3], 2**62, 1.5, True, {"a": 1},
              ["a", "b"], [[1]]]


def _interesting(rng: np.random.Generator, around: int) -> int:
    if rng.integers(2):
        return int(rng.choice(INTERESTING))
    return int(around + rng.integers(-300, 301))


def _flip_bytes(path: Path, rng: np.random.Generator, structure: int, within: bool) -> str:
    """A few bytes changed: with ``within``, mostly in the first ``structure`` bytes, else
    anywhere; without, only in the stored bytes of contiguous HDF5 datasets (samples and index
    arrays), never in an HDF5 object header or B-tree."""
    ranges = [(0, path.stat().st_size)] if within else _stored_ranges(path)
    if not ranges:
        return "no stored bytes to flip"
    data = bytearray(path.read_bytes())
    where = []
    for _ in range(int(rng.integers(1, 5))):
        if within and rng.integers(3):
            at = int(rng.integers(min(len(data), structure)))
        else:
            start, size = ranges[int(rng.integers(len(ranges)))]
            at = start + int(rng.integers(size))
        data[at] = int(rng.choice([data[at] ^ (1 << int(rng.integers(8))), 0, 0xFF,
                                   int(rng.integers(256))]))
        where.append(at)
    path.write_bytes(bytes(data))
    return f"bytes changed at {where}"


def _stored_ranges(path: Path) -> list[tuple[int, int]]:
    """(file offset, size) of each contiguous, allocated numeric dataset of an HDF5 file."""
    import h5py

    out = []

    def visit(_name, obj) -> None:
        # Numeric data only: a variable-length string dataset (the metadata) stores references
        # into HDF5's global heap, which are structure (see STRUCTURE_DAMAGE).
        if (isinstance(obj, h5py.Dataset) and obj.chunks is None and not obj.is_virtual
                and obj.dtype.kind in "biuf"):
            offset, size = obj.id.get_offset(), obj.id.get_storage_size()
            if offset is not None and size:
                out.append((int(offset), int(size)))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def _mutate_meta(meta: Any, rng: np.random.Generator) -> tuple[Any, str]:
    if not isinstance(meta, dict) or not meta:
        return {"format": "fastpipe-pack"}, "metadata replaced"
    key = list(meta)[int(rng.integers(len(meta)))]
    value = meta[key]
    pick = int(rng.integers(5))
    if pick == 0:
        del meta[key]
        return meta, f"metadata key {key!r} removed"
    if pick == 1 and isinstance(value, int) and not isinstance(value, bool):
        meta[key] = _interesting(rng, value)
    elif pick == 2 and isinstance(value, list) and value:
        k = int(rng.integers(len(value)))
        inner, _ = (_mutate_meta(value[k], rng) if isinstance(value[k], dict)
                    else (ODD_VALUES[int(rng.integers(len(ODD_VALUES)))], ""))
        value[k] = inner
    elif pick == 3 and isinstance(value, dict) and value:
        meta[key], _ = _mutate_meta(value, rng)
    else:
        meta[key] = ODD_VALUES[int(rng.integers(len(ODD_VALUES)))]
    return meta, f"metadata {key!r} changed to {json.dumps(meta.get(key))[:80]}"


def _h5_meta(path: Path, rng: np.random.Generator) -> str:
    import h5py

    with h5py.File(path, "r+") as f:
        name = "_fastpipe/meta" if "_fastpipe" in f else "meta"
        meta, what = _mutate_meta(json.loads(f[name][()]), rng)
        del f[name]
        f.create_dataset(name, data=json.dumps(meta), dtype=h5py.string_dtype("utf-8"))
    return what


def _h5_index(path: Path, rng: np.random.Generator) -> str:
    import h5py

    with h5py.File(path, "r+") as f:
        names = []
        # fastpipe's index arrays: under _fastpipe/ (version 2 and up; the fields at the root are
        # samples), or version 1's at the root.
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset)
                     and o.ndim == 1 and o.dtype.kind in "iu" and o.shape[0]
                     and not o.is_virtual and "data" not in n.split("/")[-1]
                     and (n.startswith("_fastpipe/")
                          or n in ("labels", "offsets", "crc32", "path_offsets")) else None)
        if not names:
            return "no index array"
        name = names[int(rng.integers(len(names)))]
        ds = f[name]
        at = int(rng.integers(ds.shape[0]))
        value = _interesting(rng, int(ds[at]))
        info = np.iinfo(ds.dtype)
        ds[at] = min(max(value, info.min), info.max)
    return f"{name}[{at}] set to {value}"


def _h5_sample(path: Path, data: bytes, rng: np.random.Generator) -> str:
    """The input's bytes over a sample's stored bytes (same length: a wrong sample, not a
    damaged index)."""
    import h5py

    # Version 3 stores an (image, label) pack's encoded images as the field "image", its offsets
    # beside fastpipe's other datasets.
    with h5py.File(path, "r") as f:
        if ("_fastpipe/offsets/image" not in f or f["image"].is_virtual
                or f["image"].chunks is not None):
            return "no contiguous data"
        offsets = f["_fastpipe/offsets/image"][()]
        base = f["image"].id.get_offset()
    i = int(rng.integers(len(offsets) - 1))
    a, b = int(offsets[i]), int(offsets[i + 1])
    piece = (data * (1 + (b - a) // max(len(data), 1)))[:b - a]
    with open(path, "r+b") as out:
        out.seek(base + a)
        out.write(piece)
    return f"sample {i} overwritten with the input"


def _parts(path: Path, rng: np.random.Generator) -> str:
    files = sorted(path.with_name(path.name + ".shards").rglob("*.h5"))
    if len(files) < 2:
        return "no parts"
    a, b = rng.choice(len(files), 2, replace=False)
    pick = int(rng.integers(4))
    if pick == 0:
        tmp = files[a].with_name("swap")
        files[a].rename(tmp)
        files[b].rename(files[a])
        tmp.rename(files[b])
        return f"parts {files[a].name} and {files[b].name} swapped"
    if pick == 1:
        files[a].unlink()
        return f"part {files[a].name} removed"
    if pick == 2:
        size = files[a].stat().st_size
        with open(files[a], "r+b") as f:
            f.truncate(int(rng.integers(size)))
        return f"part {files[a].name} truncated"
    return f"part {files[a].name}: " + _flip_bytes(files[a], rng, HDF5_STRUCTURE,
                                                   STRUCTURE_DAMAGE)


def _truncate(path: Path, rng: np.random.Generator) -> str:
    size = path.stat().st_size
    keep = int(rng.integers(size))
    with open(path, "r+b") as f:
        f.truncate(keep)
    return f"truncated to {keep} of {size} bytes"


def _lmdb_edit(path: Path, data: bytes, rng: np.random.Generator) -> str:
    import lmdb

    env = lmdb.open(str(path), subdir=False, lock=False)
    try:
        with env.begin(write=True) as txn:
            keys = [bytes(k) for k in txn.cursor().iternext(keys=True, values=False)]
            key = keys[int(rng.integers(len(keys)))]
            value = bytes(txn.get(key))
            pick = int(rng.integers(5))
            if pick == 0:
                txn.delete(key)
                return f"key {key!r} removed"
            if pick == 1 and key == b"__meta__":
                try:
                    meta = json.loads(value)
                except ValueError:  # an earlier edit of this execution damaged it already
                    meta = {}
                meta, what = _mutate_meta(meta, rng)
                txn.put(key, json.dumps(meta).encode())
                return what
            if pick == 2:
                txn.put(key, value[:int(rng.integers(len(value) + 1))])
                return f"key {key!r} cut short"
            if pick == 3:
                txn.put(key, data)
                return f"key {key!r} set to the input"
            txn.put(key, value + bytes(rng.integers(0, 256, int(rng.integers(1, 9)),
                                                    dtype=np.uint8)))
            return f"key {key!r} lengthened"
    finally:
        env.close()


def _damage_h5(path: Path, data: bytes, rng: np.random.Generator) -> str:
    pick = int(rng.integers(7))
    if pick == 0:
        return _flip_bytes(path, rng, HDF5_STRUCTURE, STRUCTURE_DAMAGE)
    if pick == 1:
        return _h5_meta(path, rng)
    if pick in (2, 3):
        return _h5_index(path, rng)
    if pick == 4:
        return _h5_sample(path, data, rng)
    if pick == 5:
        return _parts(path, rng)
    return _truncate(path, rng)


# The file formats' own structures (HDF5 object headers and B-trees, LMDB's meta and B-tree
# pages) are parsed by libhdf5 and liblmdb, which crash on some damage there: libhdf5 2.0.0
# (h5py 3.16) segfaults opening a virtual dataset whose object header has one flipped byte, and
# liblmdb, which trusts its pages, ends with SIGBUS on a flipped key size or page number. No
# check of a reader can prevent that short of parsing the files itself, so these flips are off
# in CI (a crash there would fail the lane at random) and on with FUZZ_STRUCTURE=1, where each
# is found within a few minutes. Flips past the structures (index arrays, samples) always run.
STRUCTURE_DAMAGE = os.environ.get("FUZZ_STRUCTURE") == "1"
HDF5_STRUCTURE = 4096  # bytes at the start of a small HDF5 pack holding its structure
LMDB_STRUCTURE = 16384  # LMDB's two meta pages and the first B-tree pages


def _damage_lmdb(path: Path, data: bytes, rng: np.random.Generator) -> str:
    if STRUCTURE_DAMAGE and rng.integers(4) == 0:
        return _flip_bytes(path, rng, LMDB_STRUCTURE, within=True)
    return "; ".join(_lmdb_edit(path, data, rng) for _ in range(int(rng.integers(1, 3))))


# --- targets --------------------------------------------------------------------------------

_workspace: Workspace | None = None
_corpus: list[bytes] = []


def set_corpus(corpus: list[bytes]) -> None:
    """Makes the pristine packs of the corpus' seeds, before any execution is timed."""
    global _workspace
    _corpus[:] = corpus
    _workspace = Workspace(corpus)


def _run(name: str, damage: Callable[[Path, bytes, np.random.Generator], str], data: bytes,
         rng: np.random.Generator) -> None:
    global _workspace
    from fastpipe.data import CorruptImageError, PackFormatError
    from fastpipe.data.format.fields import FieldError
    from fastpipe.pack import verify

    if _workspace is None:
        _workspace = Workspace(_corpus or [data])
    path = _workspace.copy(name, _workspace.root / "work")
    what = damage(path, data, rng)
    read: list[Any] | None
    try:
        read = read_all(path)
    except (PackFormatError, CorruptImageError, FieldError):
        read = None
    except Exception as exc:  # noqa: BLE001 - the finding
        raise Finding(f"{name}, {what}: reading raised {type(exc).__name__}: {exc}") from exc
    try:
        report = verify(path)
    except Exception as exc:  # noqa: BLE001 - verify must never raise
        raise Finding(f"{name}, {what}: verify raised {type(exc).__name__}: {exc}") from exc
    if unexpected := [p for p in report.problems if p.startswith("unexpected")]:
        raise Finding(f"{name}, {what}: verify: {unexpected[0]}")
    if read is not None and _payload(read) != _payload(_workspace.expected[name]) and report.ok:
        raise Finding(f"{name}, {what}: the damaged pack reads other samples than the pristine "
                      "one, and verify calls it sound")
    meta = _meta(path)
    if meta is not None and meta != _workspace.meta[name] and report.ok and not report.notes:
        raise Finding(f"{name}, {what}: the metadata reads other than the pristine pack's, and "
                      "verify calls it sound without a note that it is unchecked")


def _payload(samples: list[Any]) -> list[Any]:
    """What verify can vouch for: an (image, label) pack's labels have no checksum in format
    version 1 (an in-range label changed reads and verifies), so only its samples' bytes count;
    a records pack checksums every field, labels included."""
    return [s[0] if isinstance(s, tuple) else s for s in samples]


def _h5(name: str):
    return lambda data, rng: _run(name, _damage_h5, data, rng)


TARGETS: dict[str, Callable[[bytes, np.random.Generator], None]] = {
    "pack_h5": lambda data, rng: _run(["h5_copy", "h5_array"][int(rng.integers(2))], _damage_h5,
                                      data, rng),
    "pack_h5_virtual": _h5("h5_virtual"),
    "pack_h5_records": _h5("h5_records"),
    "pack_lmdb": lambda data, rng: _run("lmdb", _damage_lmdb, data, rng),
    "pack_lmdb_records": lambda data, rng: _run("lmdb_records", _damage_lmdb, data, rng),
}

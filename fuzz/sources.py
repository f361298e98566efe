"""Source targets of the fuzz driver (fuzz/harness.py): WebDataset tar shards and their cached
indexes, and users' plain HDF5 files, read through fastpipe.data.sources against the reference
readers of the same bytes (Python's tarfile, h5py).

``tar_shard``: each execution takes a tar seed of the corpus (fuzz/corpus.py: GNU with long
names, pax, ustar with a name prefix, a shard without its end blocks), mutated by the driver
(bytes changed, inserted, deleted, spliced, cut; header checksums fixed up two times in three
so that damage reaches the fields behind them), damages it further at random (a member's size
set to an extreme octal or negative base-256 number, its type changed to sparse, a link, a
directory or a pax header, its name changed, bytes appended), then reads it in one of three
ways: scanned afresh; with the index cached from the seed and the damaged bytes written over
the shard with its size and mtime kept (``cp -p``); or with a forged cached index (arrays
permuted, dropped, shifted, set to extreme values). What it may give: PackFormatError (and
FieldError for a member that is not its field's kind), else every sample exactly as tarfile
reads the same file (the same keys, fields and bytes). A finding is any other exception, a
sample that differs from tarfile's, or samples from a file tarfile cannot read whole; and where
the headers are read without tarfile (fastpipe/data/sources/tarheaders.py takes the shard as
plain), an index or an error other than the one tarfile's reading of the headers makes.

``hdf5_plain``: each execution writes a small plain HDF5 file of a layout drawn at random
(contiguous, chunked with unallocated chunks and partial edge chunks, gzip-compressed,
variable-length, fixed-length strings, an external link to a second file, a virtual dataset over two
source files, each mapped whole or as a hyperslab of its rows), with the mutated input as the
bytes of one dataset, damages it at random (stored bytes changed, which both readers must then
read alike; the linked file or a virtual source removed, cut short or replaced by another of
other content), then reads every row through H5Source (one by one and as a batch) and with h5py.
Undamaged and byte-changed files must read, and equal h5py's rows; damaged ones may give
PackFormatError (FieldError, FileNotFoundError for a missing file), else h5py's rows; a virtual
dataset whose source no longer holds what it maps (missing, cut short, or replaced by a file of
another size, or too small for the hyperslab: h5py reads HDF5's fill value or other rows there)
must be refused. HDF5's own structures are not damaged here, as in fuzz/packs.py (libhdf5
crashes on some of that damage).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


class Finding(Exception):
    """A source read silently wrong, or an error outside its contract."""


_root: Path | None = None


def _work(name: str) -> Path:
    """An empty folder of this process for one execution of target ``name``."""
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="fastpipe-fuzz-sources-"))
        atexit.register(shutil.rmtree, _root, ignore_errors=True)
    folder = _root / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    return folder


# --- tar shards -----------------------------------------------------------------------------

def is_tar(data: bytes) -> bool:
    """A tar seed: a header's magic at its place (ustar or GNU)."""
    return len(data) >= 512 and data[257:262] == b"ustar"


def fix_checksums(data: bytearray) -> bytearray:
    """Each 512-byte block that looks like a header (its magic in place) gets its checksum
    recomputed, so that a mutation reaches the fields the checksum guards."""
    for at in range(0, len(data) - 511, 512):
        if data[at + 257:at + 262] == b"ustar":
            block = data[at:at + 512]
            block[148:156] = b" " * 8
            data[at + 148:at + 156] = b"%06o\0 " % sum(block)
    return data


_SIZES = [b"%011o\0" % v for v in (0, 1, 511, 512, 513, 1 << 20, 8**11 - 1)]
_SIZES += [b"\xff" * 12, b"\x80" + b"\0" * 10 + b"\x01", b"\xff" + b"\xff" * 10 + b"\xfe",
           b"\x80" + b"\x7f" * 11, b"99999999999\0", b" " * 12]
# Sizes int(..., 8) takes that tarfile refuses or reads otherwise (a negative one moves back).
_SIZES += [b"-1000".ljust(12, b"\0"), b"\t-2000".ljust(12, b"\0"), b"+1617".ljust(12, b"\0"),
           b"0o17".ljust(12, b"\0")]


def _damage_tar(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    out = bytearray(data)
    headers = [at for at in range(0, len(out) - 511, 512) if out[at + 257:at + 262] == b"ustar"]
    what = []
    for _ in range(int(rng.integers(0, 3))):
        pick = int(rng.integers(5))
        if pick == 4:
            out += bytes(rng.choice([b"\0" * 512, b"junk" * 64, bytes(1024)]))
            what.append("bytes appended")
            continue
        if not headers:
            break
        at = headers[int(rng.integers(len(headers)))]
        if pick == 0:
            out[at + 124:at + 136] = _SIZES[int(rng.integers(len(_SIZES)))]
            what.append(f"size at {at}")
        elif pick == 1:
            out[at + 156] = int(rng.choice(list(b"S12345LKxgV0")))
            what.append(f"type {chr(out[at + 156])} at {at}")
        elif pick == 2:
            name = rng.choice([b"../x.bin", b"a.b.c", b"noext", b"000001.bin", b"", b".hidden",
                               b"x/y/000000.cls"])
            out[at:at + 100] = bytes(name).ljust(100, b"\0")
            what.append(f"name {bytes(name)!r} at {at}")
        else:
            out[at + 345:at + 500] = bytes(155) if rng.integers(2) else b"p" * 155
            what.append(f"prefix at {at}")
    if rng.integers(3):
        out = fix_checksums(out)
    return bytes(out), "; ".join(what) or "no tar-specific damage"


def _tarfile_view(path: Path) -> list[tuple[str, dict[str, bytes | None]]] | None:
    """The shard's samples as tarfile reads them (consecutive members sharing a key), or None
    when tarfile cannot read it whole (an error, or a damaged header it stops quietly at: bytes
    after the last member that are not the end of the archive) or it holds what fastpipe
    refuses by design (sparse members). A field a sample has several members of is None:
    fastpipe refuses the shard where it reads that field, and reads it where it does not."""
    samples: list[tuple[str, dict[str, bytes | None]]] = []
    size = path.stat().st_size
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if member.issparse() or member.size < 0:
                    return None
                if not member.isfile():
                    continue
                directory, _, base = member.name.rpartition("/")
                if "." not in base or base.startswith("."):
                    continue
                stem, extension = base.split(".", 1)
                key = f"{directory}/{stem}" if directory else stem
                data = tar.extractfile(member).read()
                if len(data) != member.size:
                    return None
                if not samples or samples[-1][0] != key:
                    samples.append((key, {}))
                fields = samples[-1][1]
                fields[extension] = None if extension in fields else data
            after = tar.offset
    except (tarfile.TarError, OSError, ValueError, EOFError, UnicodeError, OverflowError,
            MemoryError):
        return None
    with open(path, "rb") as f:
        f.seek(after)
        if f.read(size - after).strip(b"\0"):
            return None
    return samples


# The index arrays its check ties to the shard's bytes (where each header chain lies, its
# CRC-32, where tarfile stopped, where each member's data begins): forged with the index's digest
# recomputed half the time, as a deliberate forger would, so that the check against the shard
# must refuse them. The others (keys, fields, samples, a size within its last block) are the
# digest's to vouch for: forged without it.
_TIED = ("offset", "chain", "chain_start", "chain_len", "chain_crc", "end")
_FORGED = ("size", "sample", "field", "keys", *_TIED)


def _forge(index: dict[str, np.ndarray], rng: np.random.Generator) -> str:
    name = _FORGED[int(rng.integers(len(_FORGED)))]
    what = _forge_array(index, name, rng)
    if name in _TIED and rng.integers(2):
        from fastpipe.data.sources.tar import _digest

        index["digest"] = np.array(_digest(index))
        what += ", its digest recomputed"
    return what


def _forge_array(index: dict[str, np.ndarray], name: str, rng: np.random.Generator) -> str:
    values = index[name]
    if not len(values):
        return f"{name}: empty"
    pick = int(rng.integers(5))
    if pick == 0:
        index[name] = values[rng.permutation(len(values))]
    elif pick == 1:
        index[name] = np.delete(values, int(rng.integers(len(values))))
    elif pick == 2 and values.dtype.kind == "i":
        values = values.copy()
        values[int(rng.integers(len(values)))] += int(rng.choice([-512, -1, 1, 512, 1024]))
        index[name] = values
    elif pick == 3 and values.dtype.kind == "i":
        values = values.copy()
        values[int(rng.integers(len(values)))] = int(rng.choice([0, -1, 2**62, 2**31, 512]))
        index[name] = values
    else:
        k, j = rng.integers(len(values), size=2)
        values = values.copy()
        values[[k, j]] = values[[j, k]]
        index[name] = values
    return f"index {name!r} forged ({pick})"


def _read_tar(path: Path) -> list[dict[str, Any]]:
    from fastpipe.data.sources.tar import TarSource

    with TarSource(path) as source:
        one = [source.read(i) for i in range(len(source))]
        if len(source):
            batch = source.read_batch(list(range(len(source)))[::-1])[::-1]
            for a, b in zip(one, batch, strict=True):
                if {k: _tar_value(v) for k, v in a.items()} != {
                        k: _tar_value(v) for k, v in b.items()}:
                    raise Finding("read and read_batch give other values of one sample")
        keys = [source.describe(i) for i in range(len(source))]
    return [dict(r, __key__=k) for r, k in zip(one, keys, strict=True)]


def _tar_value(value: Any) -> Any:
    array = np.asarray(value)
    return int(array) if array.dtype.kind == "i" and array.ndim == 0 else array.tobytes()


def tar_shard(data: bytes, rng: np.random.Generator) -> None:
    from fastpipe.data import PackFormatError
    from fastpipe.data.format.fields import FieldError
    from fastpipe.data.sources.tar import INDEX_SUFFIX

    folder = _work("tar")
    shard = folder / "s.tar"
    damaged, what = _damage_tar(data, rng)
    way = int(rng.integers(3))
    if way == 0 or not is_tar(data):
        shard.write_bytes(damaged)
        way = 0
    else:
        shard.write_bytes(data)  # the input as the driver gave it: its index cached
        try:
            _read_tar(shard)
        except (PackFormatError, FieldError):
            shard.write_bytes(damaged)
            way = 0
        if way == 1:  # the damaged bytes over it, size and mtime kept (cp -p, rsync -t)
            stat = shard.stat()
            shard.write_bytes(damaged[:stat.st_size].ljust(stat.st_size, b"\0"))
            os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            what += "; written over the indexed shard, size and mtime kept"
        elif way == 2:
            cache = shard.with_name(shard.name + INDEX_SUFFIX)
            with np.load(cache) as saved:
                index = {k: saved[k] for k in saved.files}
            what += "; " + _forge(index, rng)
            with open(cache, "wb") as f:
                np.savez(f, **index)
    _check_plain_headers(shard, what)
    expected = _tarfile_view(shard)
    try:
        read = _read_tar(shard)
    except (PackFormatError, FieldError):
        return
    except Finding:
        raise
    except Exception as exc:  # noqa: BLE001 - the finding
        raise Finding(f"tar ({what}): reading raised {type(exc).__name__}: {exc}") from exc
    wrong = _mismatch(read, expected)
    if wrong is not None:
        raise Finding(f"tar ({what}): {wrong}")


def _check_plain_headers(shard: Path, what: str) -> None:
    """Where the headers read without tarfile (tarheaders.py) take the shard as plain, the index
    made of them (or the error refusing it) must be the one tarfile's reading makes."""
    from fastpipe.data import PackFormatError
    from fastpipe.data.sources.tar import _plain_index, _tarfile_index
    from fastpipe.data.sources.tarheaders import plain_headers

    end = shard.stat().st_size
    plain = plain_headers(str(shard), end)
    if plain is None:
        return
    outcomes = []
    for make in (lambda: _plain_index(shard, plain, end, "s.tar"),
                 lambda: _tarfile_index(shard, end, "s.tar")):
        try:
            outcomes.append(make())
        except PackFormatError as exc:
            outcomes.append(str(exc))
    got, want = outcomes
    if isinstance(got, str) or isinstance(want, str):
        if got != want:
            raise Finding(f"tar ({what}): read as plain headers: {str(got)[:300]}; as tarfile "
                          f"reads it: {str(want)[:300]}")
        return
    for key, expected in want.items():
        if got[key].dtype != expected.dtype or not np.array_equal(got[key], expected):
            raise Finding(f"tar ({what}): the plain headers' index {key!r} is {got[key][:8]}, "
                          f"tarfile's {expected[:8]}")


def _mismatch(read: list[dict[str, Any]], expected: list | None) -> str | None:
    """How fastpipe's samples differ from tarfile's, or None."""
    if expected is None:
        return f"{len(read)} samples read from a shard tarfile cannot read whole"
    if len(read) != len(expected):
        return f"{len(read)} samples, tarfile reads {len(expected)}"
    for i, (record, (key, members)) in enumerate(zip(read, expected, strict=True)):
        fields = {k: v for k, v in record.items() if k != "__key__"}
        if not record["__key__"].endswith(f":{key}") or set(fields) - set(members):
            return (f"sample {i} is {record['__key__']} with fields {sorted(fields)}, tarfile's "
                    f"is {key!r} with {sorted(members)}")
        for name, value in fields.items():
            got, want = _tar_value(value), members[name]
            if want is None:
                return (f"sample {i} ({key!r}) field {name!r} read from a sample that has "
                        "several members of it")
            if isinstance(got, int):
                try:
                    same = got == int(want)
                except ValueError:
                    same = False
            else:
                same = got == want
            if not same:
                return f"sample {i} ({key!r}) field {name!r} differs from tarfile's bytes"
    return None


# --- users' plain HDF5 files ----------------------------------------------------------------

LAYOUTS = ("contiguous", "chunked", "gzip", "vlen", "strings", "external", "virtual")


def _write_h5(folder: Path, layout: str, data: bytes, rng: np.random.Generator) -> tuple[
        list[str], list[Path], dict[Path, tuple[int | None, int, int]]]:
    """The file ``folder/main.h5`` of ``layout``: its fields, the other files it reads, and for
    each virtual source what it maps: ``(first, rows, width)`` of a hyperslab of the source's
    rows, ``(None, rows, width)`` for a source mapped whole."""
    import h5py

    rows = int(rng.integers(1, 9))
    payload = np.frombuffer((data or b"\0") * (1 + rows * 48 // max(len(data), 1)), np.uint8)
    dtype = np.dtype(str(rng.choice(["uint8", "int16", ">i4", "<f8", "float32", "int64"])))
    width = int(rng.integers(1, 6))
    values = np.resize(payload, rows * width * dtype.itemsize).view(dtype).reshape(rows, width)
    if dtype.kind == "f":
        values = np.nan_to_num(values, nan=0.5, posinf=1.0, neginf=-1.0)
    others: list[Path] = []
    mapped: dict[Path, tuple[int | None, int, int]] = {}
    names = ["x", "label"]
    with h5py.File(folder / "main.h5", "w") as f:
        f["pad"] = np.zeros(int(rng.integers(0, 3000)), np.uint8)  # offsets differ per file
        f["label"] = np.arange(rows, dtype=np.int64)
        if layout == "contiguous":
            f["x"] = values
        elif layout in ("chunked", "gzip"):
            total = rows + int(rng.integers(0, 5))
            ds = f.create_dataset("x", shape=(total, width), dtype=dtype,
                                  chunks=(int(rng.integers(1, min(total, 3) + 1)), width),
                                  compression="gzip" if layout == "gzip" else None)
            ds[:rows] = values  # rows past them: unallocated chunks, read as the fill value
            del f["label"]
            f["label"] = np.arange(ds.shape[0], dtype=np.int64)
        elif layout == "vlen":
            ds = f.create_dataset("x", (rows,), dtype=h5py.vlen_dtype(np.dtype("int32")))
            for i in range(rows):
                ds[i] = np.resize(values.view(np.uint8)[i], int(rng.integers(0, 7))).astype(
                    np.int32)
        elif layout == "strings":
            f.create_dataset("x", data=np.array([payload[i:i + 9].tobytes().replace(b"\0", b"-")
                                                 for i in range(rows)], dtype="S9"))
        elif layout == "external":
            with h5py.File(folder / "linked.h5", "w") as g:
                g["pad"] = np.ones(int(rng.integers(0, 3000)), np.uint8)
                g["x"] = values
            f["x"] = h5py.ExternalLink("linked.h5", "x")
            others.append(folder / "linked.h5")
        else:
            half = max(1, rows // 2)
            vlayout = h5py.VirtualLayout(shape=(rows, width), dtype=dtype)
            for k, (a, b) in enumerate(((0, half), (half, rows))):
                if a == b:
                    continue
                first = int(rng.integers(0, 3)) if rng.integers(2) else None
                held = values[a:b] if first is None else np.concatenate(
                    [np.zeros((first, width), dtype), values[a:b], np.zeros((1, width), dtype)])
                with h5py.File(folder / f"part{k}.h5", "w") as g:
                    g["x"] = held
                source = h5py.VirtualSource(f"part{k}.h5", "x", shape=held.shape)
                # A source mapped whole, or a hyperslab of its rows (rows before and after).
                vlayout[a:b] = source if first is None else source[first:first + b - a]
                others.append(folder / f"part{k}.h5")
                mapped[folder / f"part{k}.h5"] = (first, b - a, width)
            f.create_virtual_dataset("x", vlayout, fillvalue=0)
    return names, others, mapped


def _unheld(mapped: dict[Path, tuple[int | None, int, int]]) -> str | None:
    """The first virtual source whose file no longer holds what the dataset maps from it (HDF5
    reads the fill value or other values there), or None: a source mapped whole must hold as
    many values, a hyperslab's rows must lie inside a dataset of two dimensions as wide."""
    import h5py

    for path, (first, rows, width) in mapped.items():
        try:
            with h5py.File(path, "r") as f:
                shape = f["x"].shape
        except Exception:  # noqa: BLE001 - gone, cut short, no dataset 'x'
            return path.name
        if (int(np.prod(shape)) != rows * width if first is None
                else len(shape) != 2 or shape[0] < first + rows or shape[1] < width):
            return f"{path.name} {shape}"
    return None


def _flip_stored(path: Path, rng: np.random.Generator) -> str:
    from fuzz.packs import _stored_ranges

    ranges = _stored_ranges(path)
    if not ranges:
        return "no stored bytes"
    data = bytearray(path.read_bytes())
    start, size = ranges[int(rng.integers(len(ranges)))]
    at = start + int(rng.integers(size))
    data[at] ^= 1 << int(rng.integers(8))
    path.write_bytes(bytes(data))
    return f"stored byte {at} of {path.name} changed"


def _damage_other(others: list[Path], rng: np.random.Generator) -> str:
    import h5py

    victim = others[int(rng.integers(len(others)))]
    pick = int(rng.integers(3))
    if pick == 0:
        victim.unlink()
        return f"{victim.name} removed"
    if pick == 1:
        size = victim.stat().st_size
        with open(victim, "r+b") as f:
            f.truncate(int(rng.integers(size)))
        return f"{victim.name} cut short"
    with h5py.File(victim, "w") as g:
        g["x"] = np.full((int(rng.integers(1, 9)), int(rng.integers(1, 6))), 7, np.int16)
    return f"{victim.name} replaced by another file"


def _h5py_rows(path: Path, names: list[str]) -> dict[str, list[Any]] | None:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return {n: [np.asarray(v) for v in f[n][()]] for n in names}
    except Exception:  # noqa: BLE001 - h5py cannot read it: fastpipe must not either
        return None


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "S" or b.dtype.kind == "S":
        return a.tobytes().rstrip(b"\0") == b.tobytes().rstrip(b"\0")
    return a.shape == b.shape and np.array_equal(a.astype(np.float64), b.astype(np.float64),
                                                 equal_nan=True)


def hdf5_plain(data: bytes, rng: np.random.Generator) -> None:
    from fastpipe.data import PackFormatError
    from fastpipe.data.format.fields import FieldError
    from fastpipe.data.sources.h5 import H5Source

    folder = _work("hdf5")
    layout = LAYOUTS[int(rng.integers(len(LAYOUTS)))]
    names, others, mapped = _write_h5(folder, layout, data, rng)
    path = folder / "main.h5"
    pick = int(rng.integers(3))
    if pick == 1:
        what = _flip_stored(rng.choice([path, *others]) if others else path, rng)
    elif pick == 2 and others:
        what = _damage_other(others, rng)
    else:
        pick, what = 0, "undamaged"
    what = f"{layout}, {what}"
    expected = _h5py_rows(path, names)
    try:
        source = H5Source(path, names)
        with source:
            one = [source.read(i) for i in range(len(source))]
            batch = source.read_batch(list(range(len(source)))) if len(source) else []
    except (PackFormatError, FieldError, FileNotFoundError) as exc:
        if pick < 2:
            raise Finding(f"hdf5 ({what}): a readable file refused: {exc}") from exc
        return
    except Exception as exc:  # noqa: BLE001 - the finding
        raise Finding(f"hdf5 ({what}): reading raised {type(exc).__name__}: {exc}") from exc
    unheld = _unheld(mapped) if pick == 2 else None
    if unheld is not None:
        raise Finding(f"hdf5 ({what}): a virtual dataset read whose source {unheld} no longer "
                      "holds what it maps (h5py gives its fill value or other rows there)")
    if expected is None:
        raise Finding(f"hdf5 ({what}): {len(one)} rows read from a file h5py cannot read")
    for name in names:
        want = expected[name]
        got = [r[name] for r in one]
        got_batch = [r[name] for r in batch]
        if len(got) != len(want) or not all(
                _same(g, w) and _same(b, w) for g, b, w in zip(got, got_batch, want,
                                                                strict=True)):
            raise Finding(f"hdf5 ({what}): field {name!r} differs from h5py's rows")


TARGETS: dict[str, Callable[[bytes, np.random.Generator], None]] = {
    "tar_shard": tar_shard,
    "hdf5_plain": hdf5_plain,
}
# The seeds each takes (the driver's SEED_PREFIX, as a test of the seed): hdf5_plain takes any.
SEEDS: dict[str, Callable[[bytes], bool]] = {"tar_shard": is_tar}

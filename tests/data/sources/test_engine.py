"""The reader engine (fastpipe/data/sources/_engine.py, _hdf5.py): where rows lie, the pieces of a
batch read in one call (from the files' mappings, or with pread where a file cannot be mapped),
the bounded mappings and descriptor pool, machine limits never reported as damage, and the
users' HDF5 files it reads directly (external links, virtual datasets, huge declared shapes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

h5py = pytest.importorskip("h5py", exc_type=ImportError)

from fastpipe.data import PackFormatError  # noqa: E402
from fastpipe.data.sources import _engine  # noqa: E402
from fastpipe.data.sources._engine import (  # noqa: E402
    Extents,
    FilePool,
    Pieces,
    ShortRead,
    copy_buffers,
    read_pieces,
    read_rows,
    resource_error,
)
from fastpipe.data.sources.h5 import H5Source  # noqa: E402

pytestmark = pytest.mark.hdf5


@pytest.fixture(params=["mapped", "pread"])
def way(request, monkeypatch):
    """Both ways the engine reads: copies from the files' mappings (the default), and pread
    (files that cannot be mapped, or an extension without the mapped copy)."""
    if _engine._map_file is None:
        pytest.skip("fastpipe._io was built without the mapped reads")
    monkeypatch.setattr(_engine, "MAPPINGS", _engine._Mappings(_engine.DEFAULT_MAPPINGS))
    if request.param == "pread":
        monkeypatch.setattr(_engine, "_map_file", None)
    return request.param


def _mapped(paths) -> set[str]:
    """Which of ``paths`` this process has mapped now."""
    with open("/proc/self/maps") as f:
        lines = f.read().splitlines()
    return {p for p in map(str, paths) if any(line.endswith(" " + p) for line in lines)}


@pytest.fixture
def blob(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, 200_000, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.tobytes())
    return path, data


def test_pieces_of_chunked_and_windowed_extents_read_the_right_bytes(blob, way):
    path, data = blob
    rows, chunk, row = 200, 7, 9
    rng = np.random.default_rng(1)
    starts = rng.permutation(np.arange(0, 190_000, 2_000))[:-(-rows // chunk)]
    extents = Extents.chunked(rows, chunk, 0, starts, row)

    def stored(i: int) -> bytes:
        k, within = divmod(i, chunk)
        at = starts[k] + within * row
        return data[at:at + row].tobytes()

    # Two windows of the array placed back to back, as a virtual merge places its parts.
    placed = Extents.concat([extents.window(5, 40, 0), extents.window(100, 190, 35)], row)
    order = list(range(5, 40)) + list(range(100, 190))
    pool = FilePool([os.path.realpath(path)])
    for trial in range(100):
        a = rng.integers(0, len(order), 6)
        # Every other trial a row a range: a batch of a fixed field, which has a path of its own.
        b = a + 1 if trial % 2 else np.minimum(a + rng.integers(0, 30, 6), len(order))
        sizes = (b - a) * row
        out = np.zeros(int(sizes.sum()), np.uint8)
        read_pieces(pool, placed.pieces(a, b, np.cumsum(sizes) - sizes), out)
        want = b"".join(stored(order[i]) for x, y in zip(a, b, strict=True) for i in range(x, y))
        assert out.tobytes() == want
    pool.close()


@pytest.fixture(params=["compiled", "python"])
def buffers_way(request, monkeypatch):
    """copy_buffers compiled (fastpipe._io) and in Python (an extension without it)."""
    if request.param == "compiled" and _engine._copy_buffers is None:
        pytest.skip("fastpipe._io was built without copy_buffers")
    if request.param == "python":
        monkeypatch.setattr(_engine, "_copy_buffers", None)
    return request.param


def test_copy_buffers_puts_each_value_in_its_row(buffers_way):
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((5, 2, 3)).astype(np.float32)
    values = [rows[0].tobytes(), bytearray(rows[1].tobytes()), memoryview(rows[2].tobytes()),
              rows[3], np.ascontiguousarray(rows[4])]
    out = np.zeros_like(rows)
    assert copy_buffers(values, out) is None
    assert out.tobytes() == rows.tobytes()
    assert copy_buffers([], np.zeros((0, 2, 3), np.float32)) is None


@pytest.mark.parametrize("bad", [None, b"\x00" * 23, b"\x00" * 25])
def test_copy_buffers_names_the_first_wrong_value_before_copying_any(buffers_way, bad):
    good = np.arange(6, dtype=np.float32).tobytes()  # 24 bytes: a (2, 3) float32 row
    out = np.full((4, 2, 3), -1, np.float32)
    assert copy_buffers([good, good, bad, bad], out) == 2
    assert (out == -1).all()  # nothing copied
    with pytest.raises(ValueError, match="3 buffers for an output of shape"):
        copy_buffers([good] * 3, out)


def test_a_short_read_names_the_file(blob, way):
    path, data = blob
    pool = FilePool([os.path.realpath(path)])
    out = np.zeros(100, np.uint8)
    with pytest.raises(ShortRead) as caught:
        read_pieces(pool, Pieces(np.array([0]), np.array([len(data) - 50]), np.array([100]),
                                 np.array([0])), out)
    assert caught.value.path == os.path.realpath(path) and caught.value.number == 0



def test_one_samples_rows_are_read_across_runs_and_files(blob, tmp_path):
    path, data = blob
    other = np.random.default_rng(2).integers(0, 256, 50_000, dtype=np.uint8)
    (tmp_path / "other.bin").write_bytes(other.tobytes())
    row = 9
    first = Extents.chunked(60, 7, 0, np.arange(0, 9_000, 1_000), row)
    second = Extents.chunked(40, 5, 1, np.arange(40_000, 0, -5_000), row)

    def stored(extents, file_data, i):
        k = int(np.searchsorted(extents.starts, i, side="right")) - 1
        at = int(extents.offsets[k]) + (i - int(extents.starts[k])) * row
        return file_data[at:at + row].tobytes()

    placed = Extents.concat([first.window(3, 60, 0), second.window(0, 40, 57)], row)
    order = ([stored(first, data, i) for i in range(3, 60)]
             + [stored(second, other, i) for i in range(40)])
    pool = FilePool([os.path.realpath(path), os.path.realpath(tmp_path / "other.bin")])
    crossed = 0
    for a in range(len(order)):
        for b in range(a, min(a + 12, len(order)) + 1):
            out = np.zeros((b - a) * row, np.uint8)
            read_rows(pool, placed, a, b, out)
            assert out.tobytes() == b"".join(order[a:b]), (a, b)
            crossed += len(placed.spans(a, b)) > 1
    assert crossed  # ranges that cross from one chunk (and one file) into the next
    with pytest.raises(ShortRead) as caught:
        read_rows(pool, Extents.contiguous(10, 1, len(other) - 40, row), 2, 6,
                  np.zeros(36, np.uint8))
    assert caught.value.path == os.path.realpath(tmp_path / "other.bin")
    assert caught.value.number == 0
    pool.close()


def test_a_sample_read_alone_is_the_same_as_in_a_batch_and_its_own_copy(tmp_path):
    from fastpipe.pack import pack

    class Rows:
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int):
            rng = np.random.default_rng(i)
            return {"blob": rng.bytes(int(rng.integers(0, 90_000))),
                    "grid": rng.standard_normal((4, 5)).astype(np.float32),
                    "label": i % 3, "tag": np.int16(i)}

    pack(Rows(), tmp_path / "rows.h5", progress=False)
    source = H5Source(tmp_path / "rows.h5")
    blob = source._columns["blob"]
    assert any(len(blob.extents.spans(int(blob.offsets[i]), int(blob.offsets[i + 1]))) > 1
               for i in range(len(source)))  # some samples' bytes cross a chunk's end
    for i in range(len(source)):
        alone, (batched,) = source.read(i), source.read_batch([i])
        assert list(alone) == list(batched)
        for name in alone:
            a, b = np.asarray(alone[name]), np.asarray(batched[name])
            assert (a.dtype, a.shape) == (b.dtype, b.shape) and np.array_equal(a, b), (i, name)
    first = source.read(5)
    want = {name: np.array(value, copy=True) for name, value in first.items()}
    for value in first.values():
        if isinstance(value, np.ndarray) and value.size:
            value[...] = 0
    again = source.read(5)
    assert all(np.array_equal(again[name], want[name]) for name in want)
    source.close()

def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_descriptors_are_bounded_and_a_file_in_use_is_never_closed(tmp_path, monkeypatch):
    paths = []
    for k in range(12):
        paths.append(tmp_path / f"{k}.bin")
        paths[-1].write_bytes(bytes([k]) * 64)
    # This process's own descriptors, fresh: the limit holds for every source together. Read
    # with pread, which is what takes descriptors (a mapping holds none).
    monkeypatch.setattr(_engine, "DESCRIPTORS", _engine._Descriptors(3))
    monkeypatch.setattr(_engine, "_map_file", None)
    pool = FilePool([os.path.realpath(p) for p in paths])
    other = FilePool([os.path.realpath(p) for p in paths[6:]])  # another source, shared files
    before = _open_fds()
    out = np.zeros(12, np.uint8)
    for _ in range(3):
        ids = np.arange(12)
        read_pieces(pool, Pieces(ids, np.zeros(12, np.int64), np.ones(12, np.int64), ids), out)
        assert out.tolist() == list(range(12))  # read 3 files at a time
        assert _open_fds() - before <= 3
        mine = np.arange(6)
        read_pieces(other, Pieces(mine, np.zeros(6, np.int64), np.ones(6, np.int64), mine),
                    out[:6])
        assert out[:6].tolist() == list(range(6, 12))
        assert _open_fds() - before <= 3  # every source together
    pins = pool.acquire(np.array([0, 1, 2, 3]))  # pinned: eviction passes them by
    more = pool.acquire(np.array([4, 5]))
    assert all(os.read(int(fd), 1) == bytes([k]) for k, fd in enumerate(pins))
    assert all(os.pread(int(fd), 1, 0) == bytes([k + 4]) for k, fd in enumerate(more))
    pool.release(np.array([0, 1, 2, 3]))
    pool.release(np.array([4, 5]))
    pool.close()
    other.close()
    assert _open_fds() == before


def test_mappings_are_bounded_hold_no_descriptor_and_end_with_close(tmp_path, monkeypatch):
    if _engine._map_file is None:
        pytest.skip("fastpipe._io was built without the mapped reads")
    paths = []
    for k in range(12):
        paths.append(tmp_path / f"{k}.bin")
        paths[-1].write_bytes(bytes([k]) * 64)
    paths = [os.path.realpath(p) for p in paths]
    monkeypatch.setattr(_engine, "MAPPINGS", _engine._Mappings(3))
    pool = FilePool(paths)
    before = _open_fds()
    out = np.zeros(12, np.uint8)
    ids = np.arange(12)
    read_pieces(pool, Pieces(ids, np.zeros(12, np.int64), np.ones(12, np.int64), ids), out)
    assert out.tolist() == list(range(12))
    # A batch pins the mappings it copies from: all 12 were mapped for it, and released after,
    # the least recently used unmapped down to the bound.
    assert len(_mapped(paths)) == 3
    assert _open_fds() == before  # a mapping keeps no descriptor
    read_pieces(pool, Pieces(ids[:2], np.zeros(2, np.int64), np.ones(2, np.int64), ids[:2]),
                out[:2])
    assert out[:2].tolist() == [0, 1] and len(_mapped(paths)) == 3
    pool.close()
    assert not _mapped(paths)


def test_a_file_that_grew_since_it_was_mapped_is_mapped_again(tmp_path, way):
    path = tmp_path / "growing.bin"
    path.write_bytes(b"a" * 100)
    pool = FilePool([os.path.realpath(path)])
    out = np.zeros(10, np.uint8)
    read_pieces(pool, Pieces(np.array([0]), np.array([90]), np.array([10]), np.array([0])), out)
    assert out.tobytes() == b"a" * 10
    with open(path, "ab") as f:
        f.write(b"b" * 100)
    read_pieces(pool, Pieces(np.array([0]), np.array([150]), np.array([10]), np.array([0])),
                out)
    assert out.tobytes() == b"b" * 10
    pool.close()


def test_a_file_that_cannot_be_mapped_is_read_with_pread(blob, monkeypatch):
    if _engine._map_file is None:
        pytest.skip("fastpipe._io was built without the mapped reads")
    path, data = blob
    monkeypatch.setattr(_engine, "MAPPINGS", _engine._Mappings(8))
    tries = []

    def refuse(p):
        tries.append(p)
        raise OSError(19, "No such device", p)  # what mmap says on a file system without it

    monkeypatch.setattr(_engine, "_map_file", refuse)
    pool = FilePool([os.path.realpath(path)])
    for _ in range(3):
        out = np.zeros(64, np.uint8)
        read_pieces(pool, Pieces(np.array([0]), np.array([1000]), np.array([64]),
                                 np.array([0])), out)
        assert out.tobytes() == data[1000:1064].tobytes()
    assert len(tries) == 1  # remembered: not tried again for every batch
    pool.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_reads_through_the_parents_mappings(blob, way):
    path, data = blob
    pool = FilePool([os.path.realpath(path)])
    out = np.zeros(64, np.uint8)
    read_pieces(pool, Pieces(np.array([0]), np.array([0]), np.array([64]), np.array([0])), out)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            got = np.zeros(64, np.uint8)
            read_pieces(pool, Pieces(np.array([0]), np.array([5000]), np.array([64]),
                                     np.array([0])), got)
            os.write(write, got.tobytes())
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 64)
    os.close(read)
    os.waitpid(child, 0)
    assert got == data[5000:5064].tobytes()
    pool.close()


def test_threads_share_a_pool(tmp_path, way):
    paths = []
    for k in range(20):
        paths.append(tmp_path / f"{k}.bin")
        paths[-1].write_bytes(bytes([k]) * 8)
    pool = FilePool([os.path.realpath(p) for p in paths])
    errors = []

    def read(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            ids = rng.integers(0, 20, 5)
            out = np.zeros(5, np.uint8)
            read_pieces(pool, Pieces(ids, np.zeros(5, np.int64), np.ones(5, np.int64),
                                     np.arange(5)), out)
            if out.tolist() != ids.tolist():
                errors.append((ids, out))

    threads = [threading.Thread(target=read, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    pool.close()


def test_machine_limits_are_told_apart_from_damage():
    assert resource_error(OSError(24, "Too many open files"))
    assert resource_error(MemoryError())
    assert resource_error(OSError("Unable to synchronously open file (unable to open file: "
                                  "name = 'x.h5', errno = 24, error message = 'Too many open "
                                  "files', flags = 0, o_flags = 0)"))
    assert not resource_error(OSError("Unable to synchronously open file (file signature not "
                                      "found)"))


def _virtual_pack_of(tmp_path, parts: int):
    """A records pack of ``parts`` part files (a virtual merge)."""
    from fastpipe.pack import pack

    class Rows:
        def __len__(self) -> int:
            return parts * 2

        def __getitem__(self, i: int):
            return {"x": np.full(3, i, np.float32)}

    out = tmp_path / "many.h5"
    pack(Rows(), out, shard_size=2, progress=False)
    return out


@pytest.mark.slow
def test_running_out_of_descriptors_is_not_reported_as_damage(tmp_path):
    out = _virtual_pack_of(tmp_path, 40)
    script = textwrap.dedent(f"""
        import resource, sys
        import numpy as np
        from fastpipe.data.sources.h5 import H5Source
        resource.setrlimit(resource.RLIMIT_NOFILE, (24, 24))
        held = []
        try:
            while True:
                held.append(open(sys.executable, "rb"))
        except OSError:
            pass  # every descriptor is in use now
        try:
            H5Source({str(out)!r})
        except OSError as exc:
            print("OSError", exc)
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert "OSError" in result.stdout, result.stdout + result.stderr
    assert "not damage" in result.stdout and "ulimit -n" in result.stdout
    assert "damaged" not in result.stdout


@pytest.mark.slow
def test_a_virtual_pack_of_many_parts_reads_within_a_few_descriptors(tmp_path, monkeypatch):
    out = _virtual_pack_of(tmp_path, 60)
    monkeypatch.setattr(_engine, "DESCRIPTORS", _engine._Descriptors(8))
    before = _open_fds()
    sources = [H5Source(out) for _ in range(3)]  # three datasets of one pack in one process
    for source in sources:
        batch = source.read_batch(list(range(len(source))))
        assert [r["x"].tolist() for r in batch] == [[i] * 3 for i in range(len(source))]
        for i in range(len(source)):
            assert source.read(i)["x"].tolist() == [i] * 3
    assert _open_fds() - before <= 8


def test_an_external_link_reads_the_linked_file(tmp_path):
    with h5py.File(tmp_path / "target.h5", "w") as f:
        f["x"] = np.arange(12, dtype=np.int64).reshape(4, 3) * 1000
    with h5py.File(tmp_path / "main.h5", "w") as f:
        f["pad"] = np.zeros((4, 1000), np.uint8)  # so that offsets in the two files differ
        f["x"] = h5py.ExternalLink("target.h5", "x")
    source = H5Source(tmp_path / "main.h5", ["x"])
    assert source._columns["x"].extents is not None  # read directly, from the linked file
    rows = [source.read(i)["x"].tolist() for i in range(4)]
    with h5py.File(tmp_path / "target.h5") as f:
        assert rows == f["x"][()].tolist()


def test_a_users_virtual_dataset_with_a_missing_source_is_refused(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(4, dtype=np.float32)
    layout = h5py.VirtualLayout(shape=(8,), dtype=np.float32)
    layout[0:4] = h5py.VirtualSource("a.h5", "x", shape=(4,))
    layout[4:8] = h5py.VirtualSource("b.h5", "x", shape=(4,))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("x", layout, fillvalue=0)
    with pytest.raises(PackFormatError, match=r"missing.*b\.h5.*zeros"):
        H5Source(tmp_path / "v.h5")
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.arange(4, 8, dtype=np.float32)
    source = H5Source(tmp_path / "v.h5")
    assert [float(source.read(i)["x"]) for i in range(8)] == list(range(8))


def test_a_users_virtual_dataset_whose_source_changed_size_is_refused(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(8, dtype=np.float32).reshape(4, 2)
    layout = h5py.VirtualLayout(shape=(4, 2), dtype=np.float32)
    layout[:] = h5py.VirtualSource("a.h5", "x", shape=(4, 2))
    with h5py.File(tmp_path / "v.h5", "w") as f:
        f.create_virtual_dataset("x", layout, fillvalue=0)
    # Another dtype is HDF5's to convert, as h5py does.
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(8, dtype=np.int16).reshape(4, 2)
    assert H5Source(tmp_path / "v.h5").read(3)["x"].tolist() == [6.0, 7.0]
    # Another size: HDF5 would map its values element by element into the wrong rows.
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.full((8, 3), 7, np.int16)
    with pytest.raises(PackFormatError, match=r"a\.h5 \('x' holds 24 values where 8 are mapped\)"):
        H5Source(tmp_path / "v.h5")
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["y"] = np.zeros(8, np.float32)
    with pytest.raises(PackFormatError, match="no dataset 'x'"):
        H5Source(tmp_path / "v.h5")


def test_a_huge_declared_chunked_shape_is_not_allocated(tmp_path):
    with h5py.File(tmp_path / "huge.h5", "w") as f:
        ds = f.create_dataset("x", shape=(2**40, 6), dtype=np.float32, chunks=(64, 6))
        ds[0:64] = np.ones((64, 6), np.float32)
    source = H5Source(tmp_path / "huge.h5")  # no 2 TiB chunk table
    assert len(source) == 2**40
    assert source._columns["x"].extents is None  # unallocated chunks: h5py gives the fill value
    assert source.read(3)["x"].tolist() == [1.0] * 6
    assert source.read(2**40 - 1)["x"].tolist() == [0.0] * 6


def test_a_variable_length_field_of_a_users_file_with_an_empty_row(tmp_path):
    with h5py.File(tmp_path / "v.h5", "w") as f:
        ds = f.create_dataset("v", (3,), dtype=h5py.vlen_dtype(np.dtype("int32")))
        ds[0], ds[1], ds[2] = np.array([1, 2, 3], np.int32), np.array([], np.int32), [4]
    source = H5Source(tmp_path / "v.h5")
    rows = [source.read(i)["v"] for i in range(3)]
    assert [r.tolist() for r in rows] == [[1, 2, 3], [], [4]]
    assert all(r.dtype == np.int32 for r in rows)
    field = source.schema.fields["v"]
    assert field.value(rows[1]).shape == (0,)


def test_the_native_copy_refuses_a_piece_outside_its_mapping_or_the_output(blob):
    io = pytest.importorskip("fastpipe._io")
    if not hasattr(io, "copy_pieces"):
        pytest.skip("fastpipe._io was built without the mapped reads")
    path, data = blob
    address, size = io.map_file(str(path))
    try:
        assert size == len(data)
        out = np.zeros(16, np.uint8)

        def copy(offset, length, to):
            io.copy_pieces(np.array([address], np.int64), np.array([size], np.int64),
                           np.array([offset], np.int64), np.array([length], np.int64), out,
                           np.array([to], np.int64))

        copy(100, 16, 0)
        assert out.tobytes() == data[100:116].tobytes()
        for offset, length, to in [(size - 8, 16, 0), (0, 16, 1), (-1, 4, 0), (0, -4, 0),
                                   (0, 4, -1), (size + 1, 0, 0)]:
            out[:] = 7
            with pytest.raises(ValueError, match="does not fit"):
                copy(offset, length, to)
            assert (out == 7).all()  # checked before anything was copied
    finally:
        io.unmap(address, size)

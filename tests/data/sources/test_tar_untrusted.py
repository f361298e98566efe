"""Tar shards that lie (fastpipe/data/sources/tar.py): a cached index is used only when every
member header at its recorded offset agrees with it, and the scan of a damaged shard ends with an
error naming it, in bounded time, never another member's bytes, a hang or a raw exception."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

from fastpipe.data import PackFormatError
from fastpipe.data.sources.tar import INDEX_SUFFIX, TarSource


def _shard(path, members) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _members(seed: int, n: int = 6) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append((f"{i:04d}.bin", rng.integers(0, 256, 300 + 37 * ((i + seed) % 5),
                                                 dtype=np.uint8).tobytes()))
        out.append((f"{i:04d}.cls", str((i + seed) % 3).encode()))
    return out


def _read_all(path) -> list[bytes]:
    with TarSource(path, ["bin"]) as source:
        return [source.read(i)["bin"].tobytes() for i in range(len(source))]


def test_a_shard_rewritten_with_its_size_and_mtime_kept_is_scanned_again(tmp_path):
    shard = tmp_path / "s.tar"
    _shard(shard, _members(0))
    first = _read_all(shard)  # caches the index
    stat = shard.stat()
    # Another shard of the same size (tar sizes come in 10 KiB records), copied over it with its
    # mtime kept (cp -p, rsync -t, unpacking an archive).
    other = tmp_path / "other.tar"
    _shard(other, _members(1))
    assert other.stat().st_size == stat.st_size
    shutil.copyfile(other, shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _read_all(shard) == [data for _, data in _members(1)[::2]] != first


@pytest.mark.parametrize("forge", ["offsets", "sizes", "shapes", "samples", "garbage"])
def test_a_forged_index_is_rebuilt(tmp_path, forge):
    shard = tmp_path / "s.tar"
    _shard(shard, _members(2))
    want = _read_all(shard)
    cache = shard.with_name(shard.name + INDEX_SUFFIX)
    with np.load(cache) as saved:
        index = {k: saved[k] for k in saved.files}
    if forge == "offsets":
        index["offset"] = index["offset"][::-1].copy()
    elif forge == "sizes":
        index["size"] = index["size"] + 512
    elif forge == "shapes":
        index["size"] = index["size"][:-1]
    elif forge == "samples":
        index["sample"] = index["sample"] + 7
    if forge == "garbage":
        cache.write_bytes(b"PK\x03\x04" + os.urandom(200))
    else:
        with open(cache, "wb") as f:
            np.savez(f, **index)
    assert _read_all(shard) == want


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=60)


def test_a_negative_member_size_ends_the_scan_with_an_error(tmp_path):
    shard = tmp_path / "neg.tar"
    _shard(shard, _members(3, 2))
    raw = bytearray(shard.read_bytes())
    # The second member's size field as a negative base-256 number (tarfile seeks back to the
    # same header for ever on it); its header checksum fixed so that tarfile reads it.
    header = 512 + 512 * ((len(_members(3, 2)[0][1]) + 511) // 512)
    raw[header + 124:header + 136] = b"\xff" * 12
    raw[header + 148:header + 156] = b" " * 8
    checksum = sum(raw[header:header + 512])
    raw[header + 148:header + 156] = b"%06o\x00 " % checksum
    shard.write_bytes(bytes(raw))
    result = _run(f"""
        from fastpipe.data.sources.tar import TarSource
        try:
            TarSource({str(shard)!r})
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    assert "PackFormatError" in result.stdout, result.stdout + result.stderr
    assert "neg.tar" in result.stdout and "-1 bytes" in result.stdout


@pytest.mark.parametrize("cut", ["data", "header", "flipped"])
def test_a_shard_cut_short_or_damaged_is_an_error_naming_it(tmp_path, cut):
    shard = tmp_path / "cut.tar"
    _shard(shard, _members(4, 3))
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tar:
        third = tar.getmembers()[2]
    if cut == "data":  # inside the third member's data
        data = data[:third.offset_data + 10]
    elif cut == "header":  # inside the third member's header: tarfile stops there quietly
        data = data[:third.offset + 100]
    else:  # a flipped byte in the third header: its checksum fails, tarfile stops there
        data[third.offset + 20] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(PackFormatError, match=r"cut\.tar"):
        TarSource(shard)


def test_sparse_members_are_refused(tmp_path):
    sparse = tmp_path / "sparse.bin"
    with open(sparse, "wb") as f:
        f.seek(1 << 20)
        f.write(b"end")
    shard = tmp_path / "sp.tar"
    done = subprocess.run(["tar", "--sparse", "-cf", str(shard), "-C", str(tmp_path),
                           "sparse.bin"], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"GNU tar cannot write a sparse member here: {done.stderr!r}")
    with tarfile.open(shard) as tar:
        if not tar.getmembers()[0].issparse():
            pytest.skip("this file system holds no holes: tar stored the file whole")
    with pytest.raises(PackFormatError, match="sparse"):
        TarSource(shard)


def test_a_text_member_that_is_not_utf8_is_an_error_naming_it(tmp_path):
    shard = tmp_path / "t.tar"
    _shard(shard, [("a.txt", b"fine"), ("a.cls", b"1"),
                   ("b.txt", b"\xff\xfe latin-1 \xe9"), ("b.cls", b"2")])
    source = TarSource(shard)
    assert source.read(0)["txt"].tobytes() == b"fine"
    with pytest.raises(PackFormatError, match=r"'txt' member of .*t\.tar:b is not UTF-8"):
        source.read(1)


# --- names past a header's 100 bytes, and sizes no int64 holds (issue 40 review) ---------------

_LONG = "d" * 120  # a folder name: every member name is past 100 bytes


def _long_shard(path, members, format) -> None:
    with tarfile.open(path, "w", format=format) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _tarfile_samples(path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name.rsplit(".", 1)[0], tar.extractfile(m).read())
                for m in tar if m.isfile() and m.name.endswith(".bin")]


def _fastpipe_samples(path) -> list[tuple[str, bytes]]:
    with TarSource(path, ["bin"]) as source:
        return [(source.describe(i).split(":", 1)[1], source.read(i)["bin"].tobytes())
                for i in range(len(source))]


@pytest.mark.parametrize("format", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT,
                                    tarfile.USTAR_FORMAT], ids=["gnu", "pax", "ustar-prefix"])
def test_a_rewritten_shard_with_long_names_swapped_is_scanned_again(tmp_path, format):
    """Two members of long names (a GNU long-name header, a pax path, a ustar prefix) swapped
    in a shard rewritten with its size and mtime kept: the cached index's names were compared
    only below 100 bytes without a prefix, and it gave each name the other member's bytes."""
    first, second = f"{_LONG}/0000.bin", f"{_LONG}/0001.bin"
    a, b = b"a" * 700, b"b" * 700
    shard = tmp_path / "s.tar"
    _long_shard(shard, [(first, a), (second, b)], format)
    assert _fastpipe_samples(shard) == [(f"{_LONG}/0000", a), (f"{_LONG}/0001", b)]
    stat = shard.stat()
    _long_shard(tmp_path / "o.tar", [(second, a), (first, b)], format)
    assert (tmp_path / "o.tar").stat().st_size == stat.st_size
    shutil.copyfile(tmp_path / "o.tar", shard)
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _fastpipe_samples(shard) == _tarfile_samples(shard) == [
        (f"{_LONG}/0001", a), (f"{_LONG}/0000", b)]


def _set_field(raw: bytearray, header: int, at: int, value: bytes) -> None:
    raw[header + at:header + at + len(value)] = value
    raw[header + 148:header + 156] = b" " * 8
    raw[header + 148:header + 156] = b"%06o\x00 " % sum(raw[header:header + 512])


@pytest.mark.parametrize("size", [b"\x80" + b"\xff" * 11, b"\x80" + b"\x7f" * 11,
                                  b"77777777777\x00"],
                         ids=["base-256 2**88", "base-256 past 2**63", "octal 8 GiB"])
def test_a_long_name_header_of_an_absurd_size_is_an_error_naming_the_shard(tmp_path, size):
    """The GNU long-name header's size: tarfile reads that many bytes (OverflowError past 2**63,
    MemoryError for 8 GiB where memory is short: here 2 GiB more address space than the child
    holds once it has imported fastpipe)."""
    shard = tmp_path / "ln.tar"
    _long_shard(shard, [(f"{_LONG}/0000.bin", b"x" * 10), (f"{_LONG}/0001.bin", b"y")],
                tarfile.GNU_FORMAT)
    raw = bytearray(shard.read_bytes())
    assert raw[156:157] == b"L"
    _set_field(raw, 0, 124, size)
    shard.write_bytes(bytes(raw))
    result = _run(f"""
        import resource
        from fastpipe.data.sources.tar import TarSource
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[0])
        limit = pages * resource.getpagesize() + (2 << 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            TarSource({str(shard)!r})
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    assert result.stdout.startswith("PackFormatError"), result.stdout + result.stderr
    assert "ln.tar" in result.stdout


def test_a_cached_index_over_a_base_256_size_is_checked_without_overflow(tmp_path):
    """The shard rewritten (size and mtime kept) with a member's size a base-256 number past
    2**63: the index check converted it into an int64 array (a raw OverflowError)."""
    shard = tmp_path / "s.tar"
    _shard(shard, _members(5, 2))
    _read_all(shard)  # caches the index
    stat = shard.stat()
    raw = bytearray(shard.read_bytes())
    _set_field(raw, 0, 124, b"\x80" + b"\x7f" * 11)
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(PackFormatError, match=r"s\.tar"):
        _read_all(shard)


@pytest.mark.parametrize("edit", ["type", "prefix", "skipped member", "global header"])
def test_headers_the_index_does_not_hold_are_checked_too(tmp_path, edit):
    """What the index never recorded still decides what tarfile reads: a member made a
    directory, a name prefix set, a member without an extension (skipped) renamed into the
    samples, a pax global header's path; each rewrite keeps the shard's size and mtime."""
    members = [("0000.bin", b"a" * 600), ("0000.cls", b"1"), ("0001.bin", b"b" * 600),
               ("0001.cls", b"2"), ("README", b"c" * 600)]
    shard = tmp_path / "s.tar"
    fmt = tarfile.PAX_FORMAT if edit == "global header" else tarfile.USTAR_FORMAT
    with tarfile.open(shard, "w", format=fmt,
                      pax_headers={"comment": "x" * 20} if fmt == tarfile.PAX_FORMAT else None
                      ) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    want = _read_all(shard)
    stat = shard.stat()
    raw = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tar:
        infos = tar.getmembers()
    if edit == "type":
        _set_field(raw, infos[0].offset, 156, b"5")
    elif edit == "prefix":
        _set_field(raw, infos[2].offset, 345, b"p")
    elif edit == "skipped member":
        _set_field(raw, infos[4].offset, 0, b"0002.bin\0")
    else:
        at = raw.index(b"comment=")
        raw[at:at + 8] = b"path=zz/"  # the global header's path: every member named zz/
        _set_field(raw, 0, 0, b"")  # its checksum again
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    try:
        got = _fastpipe_samples(shard)
    except PackFormatError:
        return  # refused: allowed
    assert got == _tarfile_samples(shard) != list(zip(["0000", "0001"], want))


@pytest.mark.parametrize("text", [b"9" * 20, b"-" + b"9" * 20, b"9223372036854775808"])
def test_an_int_member_past_int64_is_an_error_naming_it(tmp_path, text):
    shard = tmp_path / "i.tar"
    _shard(shard, [("a.bin", b"x"), ("a.cls", b"9223372036854775807"),
                   ("b.bin", b"y"), ("b.cls", text)])
    source = TarSource(shard)
    assert int(source.read(0)["cls"]) == 2**63 - 1
    with pytest.raises(PackFormatError, match=r"'cls' member of .*i\.tar:b .*not an integer"):
        source.read(1)


def _npy_header(shape) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": "<f8", "fortran_order": False,
                                               "shape": shape})
    return out.getvalue()


@pytest.mark.parametrize("data", [b"", b"PK\x03\x04" + bytes(60), b"\x93NUMPY\x01",
                                  _npy_header((1 << 40,)) + bytes(8)],
                         ids=["empty", "zip", "cut header", "huge shape"])
@pytest.mark.parametrize("which", ["first", "second"])
def test_an_npy_member_that_is_not_an_array_is_an_error_naming_it(tmp_path, data, which):
    """An empty member (np.load: EOFError), one that starts as a zip (BadZipFile), one whose
    header declares 8 TiB (np.load allocates it first): the first sample's gives the field, a
    later one is read."""
    good = io.BytesIO()
    np.save(good, np.arange(6, dtype=np.int16))
    members = [good.getvalue(), data] if which == "second" else [data, good.getvalue()]
    shard = tmp_path / "n.tar"
    _shard(shard, [("a.npy", members[0]), ("b.npy", members[1])])
    with pytest.raises(PackFormatError, match=r"'npy' member of .*n\.tar:(a|b) is not a \.npy"):
        source = TarSource(shard)
        np.testing.assert_array_equal(source.read(0)["npy"], np.arange(6))
        source.read(1)

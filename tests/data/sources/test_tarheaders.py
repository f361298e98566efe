"""Plain tar headers read without tarfile (fastpipe/data/sources/tarheaders.py): the index of a
shard whose headers are all plain is the one tarfile's reading makes, and every other shard is
left to tarfile (the fuzz target tar_shard checks the same on what it makes)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import numpy as np
import pytest

from fastpipe.data import PackFormatError
from fastpipe.data.sources import tar as tar_module
from fastpipe.data.sources.tarheaders import plain_headers


def _write(path, members, format=tarfile.GNU_FORMAT, directories=()) -> None:
    with tarfile.open(path, "w", format=format) as tar:
        for name in directories:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tar.addfile(info, io.BytesIO(data))


def _members(n: int = 5, prefix: str = "") -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(n)
    out = []
    for i in range(n):
        out.append((f"{prefix}{i:04d}.jpg", rng.integers(0, 256, 700 + 211 * i,
                                                         dtype=np.uint8).tobytes()))
        out.append((f"{prefix}{i:04d}.cls", str(i % 3).encode()))
    return out


def _edit(path, at: int, field: slice, value: bytes, checksum: str = "unsigned") -> None:
    """Writes ``value`` into ``field`` of the header at byte ``at``, then its checksum (the
    unsigned sum tarfile writes, the signed one some tars write, or a wrong one)."""
    data = bytearray(path.read_bytes())
    header = data[at:at + 512]
    assert len(value) <= field.stop - field.start
    header[field] = value.ljust(field.stop - field.start, b"\0")
    header[148:156] = b" " * 8
    raw = np.frombuffer(bytes(header), np.uint8)
    total = int(raw.view(np.int8).astype(int).sum() if checksum == "signed" else raw.sum())
    if checksum == "wrong":
        total += 1
    header[148:156] = b"%06o\0 " % total
    data[at:at + 512] = header
    path.write_bytes(bytes(data))


def _both(path):
    """The index of ``path`` as _scan makes it, and as tarfile's reading makes it (each an
    index or the PackFormatError message)."""
    def run(function, *args):
        try:
            return function(*args)
        except PackFormatError as exc:
            return str(exc)
    end = path.stat().st_size
    return run(tar_module._scan, path), run(tar_module._tarfile_index, path, end, str(path))


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def _gnu_tar(tmp_path, fmt: str):
    if shutil.which("tar") is None:
        pytest.skip("no tar command here")
    src = tmp_path / f"src-{fmt}"
    (src / "train" / "part").mkdir(parents=True)
    for name, data in _members(4, "train/part/"):
        (src / name).write_bytes(data)
    out = tmp_path / f"gnu-{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--sort=name", "-cf", str(out), "-C", str(src),
                    "train"], check=True)
    return out


def _plain_shards(tmp_path):
    yield "tarfile GNU", lambda p: _write(p, _members())
    yield "tarfile ustar", lambda p: _write(p, _members(), tarfile.USTAR_FORMAT)
    # tarfile's pax writer adds no extended header where a name fits the ustar header.
    yield "tarfile pax, ASCII names", lambda p: _write(p, _members(), tarfile.PAX_FORMAT)
    # ustar splits a long name into a prefix (byte 345 on) and a name.
    yield "ustar with name prefixes", lambda p: _write(
        p, _members(3, "a-folder-name-long-enough-to-split/" * 3), tarfile.USTAR_FORMAT)
    yield "with directories", lambda p: _write(p, _members(), directories=("train", "train/x/"))
    yield "an empty member", lambda p: _write(p, [("0000.jpg", b""), ("0000.cls", b"1")])


@pytest.mark.parametrize("kind", ["tarfile GNU", "tarfile ustar", "tarfile pax, ASCII names",
                                  "ustar with name prefixes", "with directories",
                                  "an empty member"])
def test_a_plain_shard_is_indexed_without_tarfile_as_tarfile_indexes_it(tmp_path, kind):
    write = dict(_plain_shards(tmp_path))[kind]
    path = tmp_path / "s.tar"
    write(path)
    assert plain_headers(str(path), path.stat().st_size) is not None
    fast, slow = _both(path)
    assert not isinstance(fast, str) and _same(fast, slow)
    assert len(fast["keys"]) >= 1


@pytest.mark.parametrize("fmt", ["gnu", "ustar", "oldgnu"])
def test_gnu_tars_shards_are_plain_and_indexed_alike(tmp_path, fmt):
    path = _gnu_tar(tmp_path, fmt)
    assert plain_headers(str(path), path.stat().st_size) is not None  # directories included
    fast, slow = _both(path)
    assert not isinstance(fast, str) and _same(fast, slow)
    assert list(fast["keys"]) == [f"train/part/{i:04d}" for i in range(4)]


def test_gnu_tars_pax_shards_holding_times_are_plain(tmp_path):
    # GNU tar's posix format puts a pax header of times (mtime, atime, ctime) before each member.
    path = _gnu_tar(tmp_path, "posix")
    with tarfile.open(path) as tar:
        assert all(set(m.pax_headers) >= {"mtime"} for m in tar)
    assert plain_headers(str(path), path.stat().st_size) is not None
    fast, slow = _both(path)
    assert not isinstance(fast, str) and _same(fast, slow)
    assert set(fast["chain_len"].tolist()) == {1536}  # pax header, its records, the member's


def test_webdataset_s_shards_are_plain_and_indexed_alike(tmp_path):
    # webdataset's writer gives each member a float mtime: a pax header of it.
    wds = pytest.importorskip("webdataset")
    path = tmp_path / "s.tar"
    with wds.TarWriter(str(path)) as writer:
        for i in range(6):
            writer.write({"__key__": f"sample{i:03d}", "jpg": bytes(range(i * 40 % 256)) * 3,
                          "cls": str(i % 3)})
    with tarfile.open(path) as tar:
        assert all("mtime" in m.pax_headers for m in tar)
    assert plain_headers(str(path), path.stat().st_size) is not None
    fast, slow = _both(path)
    assert not isinstance(fast, str) and _same(fast, slow)
    assert list(fast["keys"]) == [f"sample{i:03d}" for i in range(6)]


def _pax_shard(path, records: bytes, padding: bytes = b"", directories=(), which: int = 1
               ) -> None:
    """A shard whose member ``which`` has a pax header of ``records`` (its block's rest
    ``padding``, then zeros)."""
    _write(path, _members(3), directories=directories)
    data = bytearray(path.read_bytes())
    at = _headers(path)[which]
    header = bytearray(data[at:at + 512])
    header[0:100] = b"././@PaxHeader".ljust(100, b"\0")
    header[156:157] = b"x"
    header[124:136] = b"%011o\0" % len(records)
    body = (records + padding).ljust(-(-len(records) // 512) * 512 or 0, b"\0")
    data[at:at] = bytes(header) + body
    path.write_bytes(bytes(data))
    _edit(path, at, slice(156, 157), b"x")  # its checksum


@pytest.mark.parametrize(("records", "padding", "plain"), [
    (b"30 mtime=1700000000.123456789\n", b"", True),
    (b"20 atime=1700000000\n20 ctime=1700000000\n", b"", True),
    (b"", b"", True),
    # Left to tarfile: records that name, size or describe the member, or are not well formed.
    (b"19 path=renamed.jpg\n", b"", False),
    (b"13 size=1234\n", b"", False),
    (b"31 mtime=1700000000.123456789\n", b"", False),  # a length that is not the record's
    (b"30 mtime=1700000000.123456789 ", b"", False),
    (b"30 mtime=1700000000.123456789\n", b"13 size=1234\n", False),  # a record after it
])
def test_a_pax_header_is_plain_only_where_it_holds_times(tmp_path, records, padding, plain):
    path = tmp_path / "s.tar"
    _pax_shard(path, records, padding)
    assert (plain_headers(str(path), path.stat().st_size) is not None) == plain
    fast, slow = _both(path)
    assert _same(fast, slow)


@pytest.mark.parametrize("after", ["end blocks", "end of file", "another pax header"])
def test_a_pax_header_not_right_before_its_member_is_left_to_tarfile(tmp_path, after):
    path = tmp_path / "s.tar"
    _write(path, _members(2))
    data = path.read_bytes()
    members_end = _headers(path)[-1] + 1024
    pax = tmp_path / "pax.tar"
    _pax_shard(pax, b"20 mtime=1700000000\n")
    at = _headers(pax)[1]
    one = pax.read_bytes()[at:at + 1024]  # a pax header and its records
    first = data[:_headers(path)[1]]  # the first member whole
    tail = {"end blocks": b"", "end of file": b"", "another pax header": one + first}[after]
    end = b"" if after == "end of file" else b"\0" * 1024
    path.write_bytes(data[:members_end] + one + tail + end)
    assert plain_headers(str(path), path.stat().st_size) is None
    fast, slow = _both(path)
    assert _same(fast, slow)
    if after == "another pax header":  # tarfile reads both, the member's headers from the first
        assert int(fast["chain_start"][-1]) == members_end
    else:
        assert isinstance(fast, str)


def _headers(path) -> list[int]:
    with tarfile.open(path) as tar:
        return [m.offset for m in tar]


@pytest.mark.parametrize(("edit", "plain"), [
    # Read alike either way: fields as other writers write them.
    ((slice(100, 108), b"   644 \0"), True),
    ((slice(124, 136), b" 0000001617 "), True),  # the member's size, 911
    ((slice(108, 116), b"\x80\0\0\0\0\x01\x02\x03"), True),  # a base-256 uid
    # Left to tarfile: what it reads otherwise, or refuses.
    ((slice(124, 136), b"0o1617"), False),
    ((slice(124, 136), b"1_617"), False),
    ((slice(124, 136), b"\x80" + b"\0" * 10 + b"\x05"), False),  # a base-256 size
    ((slice(100, 108), b"64 4"), False),
    ((slice(100, 108), b"\x00644"), False),
    ((slice(156, 157), b"2"), False),  # a symbolic link
    ((slice(156, 157), b"x"), False),  # a pax header
    ((slice(156, 157), b"S"), False),  # GNU sparse
    ((slice(124, 136), b"77777777777"), False),  # data past the end of the file
    # Sizes int() takes that would move the walk back (to this header again, or before it).
    ((slice(124, 136), b"-1000"), False),
    ((slice(124, 136), b"\t-2000"), False),
    ((slice(124, 136), b"+1617"), False),
])
@pytest.mark.timeout(60)  # a size that moves the walk back would never end
def test_fields_are_read_as_tarfile_reads_them_or_left_to_it(tmp_path, edit, plain):
    path = tmp_path / "s.tar"
    _write(path, _members())
    _edit(path, _headers(path)[2], *edit)
    assert (plain_headers(str(path), path.stat().st_size) is not None) == plain
    fast, slow = _both(path)
    assert _same(fast, slow)


@pytest.mark.parametrize("checksum", ["signed", "wrong"])
def test_checksums_are_taken_as_tarfile_takes_them(tmp_path, checksum):
    path = tmp_path / "s.tar"
    _write(path, _members())
    # A name with bytes past 127, whose signed sum is not its unsigned one.
    at = _headers(path)[0]
    _edit(path, at, slice(0, 100), "0000-\u00e9t\u00e9.jpg".encode(), checksum)
    assert (plain_headers(str(path), path.stat().st_size) is not None) == (checksum == "signed")
    fast, slow = _both(path)
    assert _same(fast, slow)
    if checksum == "signed":
        assert fast["keys"][0] == "0000-\u00e9t\u00e9"


@pytest.mark.parametrize("kind", [b"5", b"\0"])
def test_a_directory_s_size_is_not_skipped_as_tarfile_does_not(tmp_path, kind):
    # A directory's header may state a size; tarfile reads the next header right after it. A
    # header of type NUL (AREGTYPE) whose name ends with "/" is a directory (V7 tar's).
    path = tmp_path / "s.tar"
    _write(path, _members(), directories=("train/",))
    _edit(path, 0, slice(156, 157), kind)
    _edit(path, 0, slice(124, 136), b"%011o" % 512)
    assert plain_headers(str(path), path.stat().st_size) is not None
    fast, slow = _both(path)
    assert _same(fast, slow)
    assert list(fast["chain_start"][:2]) == [0, 512]  # the directory's header, then a member's


def test_a_directory_stating_a_size_past_the_end_is_refused_as_tarfile_refuses_it(tmp_path):
    path = tmp_path / "s.tar"
    _write(path, _members(), directories=("train",))
    _edit(path, 0, slice(124, 136), b"%011o" % 10**6)
    assert plain_headers(str(path), path.stat().st_size) is None
    fast, slow = _both(path)
    assert isinstance(fast, str) and "declares 1000000 bytes" in fast and fast == slow


@pytest.mark.parametrize("end", ["no end blocks", "cut in a header", "garbage after the end",
                                 "empty", "only zeros"])
def test_the_end_of_a_shard_is_judged_as_tarfile_judges_it(tmp_path, end):
    path = tmp_path / "s.tar"
    _write(path, _members())
    data = path.read_bytes()
    last = _headers(path)[-1]
    members_end = last + 1024  # the last member's header and its one block of data
    data = {"no end blocks": data[:members_end], "cut in a header": data[:members_end + 100],
            "garbage after the end": data + b"not zeros" * 100, "empty": b"",
            "only zeros": b"\0" * 2048}[end]
    path.write_bytes(data)
    fast, slow = _both(path)
    assert _same(fast, slow)
    assert (plain_headers(str(path), len(data)) is not None) == (
        end in ("no end blocks", "garbage after the end", "only zeros"))
    if end == "no end blocks":
        assert int(fast["end"][0]) == len(data)
    if end == "garbage after the end":
        assert isinstance(fast, str) and "not the end of a tar archive" in fast


def test_tar_shard_reads_a_plain_shard_through_the_plain_index(tmp_path, monkeypatch):
    # The scan a TarSource makes goes through the plain headers (tarfile is not asked).
    path = tmp_path / "s.tar"
    _write(path, _members())

    def refused(*args, **kwargs):
        raise AssertionError("tarfile read a plain shard")

    monkeypatch.setattr(tar_module, "_tarfile_index", refused)
    with tar_module.TarSource(path, ["jpg", "cls"]) as source:
        assert len(source) == 5
        assert source.read(3)["jpg"].tobytes() == _members()[6][1]


def test_a_shard_cut_short_while_it_is_read_is_left_to_tarfile(tmp_path):
    # Its size was measured before it was cut: the walk reads past its end, and declines
    # (a mapping's page past the end would have killed the process).
    path = tmp_path / "s.tar"
    _write(path, _members())
    size = path.stat().st_size
    assert plain_headers(str(path), size) is not None
    with open(path, "r+b") as f:
        f.truncate(_headers(path)[3] + 100)
    assert plain_headers(str(path), size) is None
    assert plain_headers(str(tmp_path), size) is None  # not a file: tarfile's to name


def test_an_old_style_directory_after_a_pax_header_is_left_to_tarfile(tmp_path):
    # tarfile 3.10-3.14 reads it as a directory, 3.15 as a file (its data skipped): with a
    # size stated, the two read the next header at different places.
    path = tmp_path / "s.tar"
    _pax_shard(path, b"20 mtime=1700000000\n", directories=("train/",), which=0)
    _edit(path, 1024, slice(156, 157), b"\0")
    assert plain_headers(str(path), path.stat().st_size) is None
    fast, slow = _both(path)
    assert _same(fast, slow)
    _edit(path, 1024, slice(156, 157), b"5")  # a directory of type 5: plain
    assert plain_headers(str(path), path.stat().st_size) is not None


def test_a_shard_cut_short_before_a_member_s_headers_are_read_again_is_left_to_tarfile(
        tmp_path, monkeypatch):
    # A pax header of more records than the read window holds: the member's headers are read
    # again from the pax header's start for their CRC-32, and the file is cut before that.
    from fastpipe.data.sources import tarheaders

    records = b"20 mtime=1700000000\n" * 1000  # 20 KB: past the 16 KB window
    path = tmp_path / "s.tar"
    _pax_shard(path, records)
    size = path.stat().st_size
    assert plain_headers(str(path), size) is not None
    pax = _headers(path)[1]
    get = tarheaders._Window.get

    def cut_then_get(window, at, n):
        if at == pax and n > 20_000:  # the chain: the pax header, its records, the header
            with open(path, "r+b") as f:
                f.truncate(pax + 512)
        return get(window, at, n)

    monkeypatch.setattr(tarheaders._Window, "get", cut_then_get)
    assert plain_headers(str(path), size) is None

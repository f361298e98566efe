"""The member headers of a tar file that holds only plain headers, read without tarfile.

Python's tarfile makes an object of every header it reads (about 25 us a member); a shard of a
thousand samples has two or three thousand of them. Nearly every shard is plain: regular files
and directories, each one 512-byte header whose number fields are octal (as tarfile and GNU tar
write them), or that header after a pax header holding only times (as webdataset's writer
writes every member: its ``mtime`` is a float). :func:`plain_headers` reads such a file's headers
itself (about a quarter of tarfile's time) and returns what tarfile would have read; anything
else (long-name, sparse or link headers, pax headers holding anything but well-formed times,
base-256 sizes, a checksum or a field tarfile would refuse or read otherwise, a header past the
end, an empty or cut-short file) makes it return None, and the caller reads the file with
tarfile, which decides what it is and how it is damaged.

Its rules are tarfile's (``TarInfo.frombuf``, ``TarFile.next``, ``_proc_builtin``,
``_proc_pax``), kept narrower: where a field is one tarfile reads but not plainly written, this
module declines. The fuzz target ``tar_shard`` checks it against tarfile on every input it makes.
"""

from __future__ import annotations

import os
import re
import tarfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["Headers", "plain_headers"]

_BLOCK = tarfile.BLOCKSIZE
# (start, end, base-256 allowed) of the number fields tarfile parses but the size (mode, uid,
# gid, mtime, checksum, devmajor, devminor). Each must read as writers write them: spaces,
# octal digits, then spaces or NULs. tarfile reads more (whatever int(..., 8) takes of the
# field up to its first NUL, stripped); those decline.
_NUMBERS = ((100, 108, True), (108, 116, True), (116, 124, True), (136, 148, True),
            (148, 156, False), (329, 337, True), (337, 345, True))
# The size field, in the same form, matched in the walk: it places the next header.
_SIZE = re.compile(rb" *([0-7]*)[ \x00]*")
_KINDS = (ord("0"), 0, ord("5"))  # REGTYPE, AREGTYPE, DIRTYPE
_DIRECTORY = ord("5")
_PAX = ord("x")  # a pax header of the member after it
# A pax record "<length> <keyword>=<value>\n" of a time, which no index holds: tarfile (every
# version) reads such records alike and takes the member's name and size from its own header.
_TIME_RECORD = re.compile(
    rb"([1-9][0-9]{0,5}) (?:mtime|atime|ctime)=[0-9]{1,20}(?:\.[0-9]{1,9})?\n")


@dataclass
class Headers:
    """Every member of a plain tar file, in order: ``names`` (a regular file's as tarfile names
    it; None for a directory), ``starts`` (where its headers begin: its pax header's, else its
    own), ``data`` (where its data begins, after its own header), ``sizes``, ``crcs`` (the
    CRC-32 of its headers, ``starts`` to ``data``) and ``end`` (where the members end: the
    first zero block, or the end of the file)."""

    names: list[str | None]
    starts: list[int]
    data: list[int]
    sizes: list[int]
    crcs: list[int]
    end: int


def plain_headers(path: str, size: int) -> Headers | None:
    """The headers of the tar file at ``path`` (``size`` bytes) where every one is plain (see
    the module); None where one is not, the file is empty or cut short, or it cannot be read
    (tarfile's reading then names the error)."""
    if size < _BLOCK:
        return None
    try:
        with open(path, "rb", buffering=0) as f:
            return _walk(_Window(f.fileno()), size)
    except OSError:
        return None


class _Window:
    """Reads of a file through a window of ``_WINDOW`` bytes: the headers of small members
    come several to a read. Reads, not a mapping: a file cut short while it is read ends in a
    short read here, where a mapping's page would kill the process."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buf, self._at = b"", 0

    def get(self, at: int, n: int) -> bytes | None:
        """``n`` bytes at ``at``, or None where the file holds fewer."""
        start = at - self._at
        if start < 0 or start + n > len(self._buf):
            self._buf, self._at, start = os.pread(self._fd, max(n, _WINDOW), at), at, 0
        out = self._buf[start:start + n]
        return out if len(out) == n else None


_WINDOW = 16 << 10


def _walk(f: _Window, size: int) -> Headers | None:
    names, starts, data_at, sizes, crcs, blocks = [], [], [], [], [], []
    encoding = tarfile.ENCODING
    at = 0
    start = None  # where the member's pax header begins, if it has one
    while True:
        if at == size and start is None:
            break  # tarfile stops at the end of the file (an empty header)
        block = f.get(at, _BLOCK)
        if block is None:
            return None  # a header cut short: tarfile's to judge
        if block.count(0) == _BLOCK:
            if start is not None:
                return None  # a pax header of no member
            break  # the end-of-archive blocks
        kind = block[156]
        if kind not in _KINDS and not (kind == _PAX and start is None):
            return None
        field = _SIZE.fullmatch(block, 124, 136)
        if field is None:
            return None
        length = int(field.group(1) or b"0", 8)
        blocks.append(block)
        data = at + _BLOCK
        if kind == _PAX:
            following = data + -(-length // _BLOCK) * _BLOCK
            if following > size or not _times_only(f.get(data, following - data), length):
                return None
            start, at = at, following
            continue
        name: str | None = block[:100].split(b"\0", 1)[0].decode(encoding, "surrogateescape")
        if kind == 0 and name.endswith("/"):
            # V7 tar's directories: regular files named with a "/" at the end. After a pax
            # header, tarfile versions differ (3.15 reads a file), so that is tarfile's to read.
            if start is not None:
                return None
            name = None
        elif kind == _DIRECTORY:
            name = None  # no sample: its name is not needed
        elif block[345]:
            prefix = block[345:500].split(b"\0", 1)[0].decode(encoding, "surrogateescape")
            name = prefix + "/" + name
        following = data if name is None else data + -(-length // _BLOCK) * _BLOCK
        if data + length > size or following > size:
            return None  # a size past the end: tarfile's error names it
        first = at if start is None else start
        names.append(name)
        starts.append(first)
        data_at.append(data)
        sizes.append(length)
        chain = block if start is None else f.get(first, data - first)
        if chain is None:
            return None
        crcs.append(zlib.crc32(chain))
        at, start = following, None
    if blocks and not _fields_plain(np.frombuffer(b"".join(blocks), np.uint8).reshape(-1, _BLOCK)):
        return None
    return Headers(names, starts, data_at, sizes, crcs, at)


def _times_only(block: bytes | None, length: int) -> bool:
    """Whether a pax header's records (the first ``length`` bytes of its ``block``) are
    well-formed time records, and the block's rest zeros (tarfile would read records there
    too)."""
    if block is None:
        return False
    at = 0
    while at < length:
        match = _TIME_RECORD.match(block, at, length)
        if match is None or int(match.group(1)) != match.end() - at:
            return False
        at = match.end()
    return block.count(0, length) == len(block) - length


def _fields_plain(raw: np.ndarray) -> bool:
    """Whether every number field but the size (matched in the walk) of every header (a row of
    ``raw``) is plain, and each checksum one of the two sums tarfile accepts (of the header's
    bytes as unsigned or as signed, the checksum field counted as spaces)."""
    checksum = None
    for start, end, base_256 in _NUMBERS:
        field = raw[:, start:end]
        digit = (field >= ord("0")) & (field <= ord("7"))
        ok = digit | (field == ord(" ")) | (field == 0)
        count = digit.sum(axis=1)
        columns = np.arange(end - start)
        first = np.where(digit, columns, end - start).min(axis=1)
        last = np.where(digit, columns, -1).max(axis=1)
        first_nul = np.where(field == 0, columns, end - start).min(axis=1)
        # spaces, one run of digits, then spaces or NULs
        plain = ok.all(axis=1) & ((count == 0) | ((last < first_nul) & (count == last - first + 1)))
        if base_256:
            plain |= (field[:, 0] == 0o200) | (field[:, 0] == 0o377)
        if not plain.all():
            return False
        if start == 148:
            powers = np.where(digit, 8 ** np.clip(last[:, None] - columns, 0, None), 0)
            checksum = ((field.astype(np.int64) - ord("0")) * powers).sum(axis=1)
    rest = np.concatenate([raw[:, :148], raw[:, 156:]], axis=1)
    unsigned = rest.astype(np.int64).sum(axis=1) + 8 * ord(" ")
    signed = rest.view(np.int8).astype(np.int64).sum(axis=1) + 8 * ord(" ")
    return bool(np.all((checksum == unsigned) | (checksum == signed)))

"""The member headers of a tar file that holds only plain headers, read without tarfile.

Python's tarfile makes an object of every header it reads (about 25 us a member); a shard of a
thousand samples has two or three thousand of them. Nearly every shard is plain: regular files
and directories, each one 512-byte header whose number fields are octal, as tarfile, GNU tar and
webdataset's writers write them. :func:`plain_headers` reads such a file's headers itself (about
a fifth of tarfile's time) and returns what tarfile would have read; anything else (long-name,
pax, sparse or link headers, base-256 sizes, a checksum or a field tarfile would refuse or read
otherwise, a header past the end, an empty or cut-short file) makes it return None, and the
caller reads the file with tarfile, which decides what it is and how it is damaged.

Its rules are tarfile's (``TarInfo.frombuf``, ``TarFile.next``, ``_proc_builtin``), kept
narrower: where a field is one tarfile reads but not plainly written, this module declines.
The fuzz target ``tar_shard`` checks it against tarfile on every input it makes.
"""

from __future__ import annotations

import mmap
import tarfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["Headers", "plain_headers"]

_BLOCK = tarfile.BLOCKSIZE
# (start, end, base-256 allowed) of the number fields tarfile parses (mode, uid, gid, size,
# mtime, checksum, devmajor, devminor). Each must read as writers write them: spaces, octal
# digits, then spaces or NULs. tarfile reads more (whatever int(..., 8) takes of the field up
# to its first NUL, stripped); those decline.
_NUMBERS = ((100, 108, True), (108, 116, True), (116, 124, True), (124, 136, False),
            (136, 148, True), (148, 156, False), (329, 337, True), (337, 345, True))
_KINDS = (ord("0"), 0, ord("5"))  # REGTYPE, AREGTYPE, DIRTYPE
_DIRECTORY = ord("5")


@dataclass
class Headers:
    """Every member of a plain tar file, in order: ``names`` (a regular file's as tarfile names
    it; None for a directory), ``offsets`` (of each header), ``sizes``, ``crcs`` (the CRC-32 of
    each 512-byte header) and ``end`` (where the members end: the first zero block, or the end
    of the file)."""

    names: list[str | None]
    offsets: list[int]
    sizes: list[int]
    crcs: list[int]
    end: int


def plain_headers(path: str, size: int) -> Headers | None:
    """The headers of the tar file at ``path`` (``size`` bytes) where every one is plain (see
    the module); None where one is not, or the file is empty or cut short."""
    if size < _BLOCK:
        return None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if len(m) != size:
            return None  # changed since it was measured
        return _walk(m, size)


def _walk(m: mmap.mmap, size: int) -> Headers | None:
    names, offsets, sizes, crcs, blocks = [], [], [], [], []
    encoding = tarfile.ENCODING
    at = 0
    while True:
        if at == size and at > 0:
            break  # tarfile stops at the end of the file (an empty header)
        if at + _BLOCK > size:
            return None  # a header cut short: tarfile's to judge
        block = m[at:at + _BLOCK]
        if block.count(0) == _BLOCK:
            break  # the end-of-archive blocks
        kind = block[156]
        if kind not in _KINDS:
            return None
        try:
            # As tarfile reads a plain field; _fields_plain checks below that each one is.
            length = int(block[124:136].strip(b" \0") or b"0", 8)
        except ValueError:
            return None
        name: str | None = block[:100].split(b"\0", 1)[0].decode(encoding, "surrogateescape")
        # V7 tar's directories are regular files named with a "/" at the end.
        directory = kind == _DIRECTORY or (kind == 0 and name.endswith("/"))
        if directory:
            name = None  # no sample: its name is not needed
        elif block[345]:
            prefix = block[345:500].split(b"\0", 1)[0].decode(encoding, "surrogateescape")
            name = prefix + "/" + name
        data = at + _BLOCK
        following = data if directory else data + -(-length // _BLOCK) * _BLOCK
        if data + length > size or following > size:
            return None  # a size past the end: tarfile's error names it
        names.append(name)
        offsets.append(at)
        sizes.append(length)
        crcs.append(zlib.crc32(block))
        blocks.append(block)
        at = following
    if blocks and not _fields_plain(np.frombuffer(b"".join(blocks), np.uint8).reshape(-1, _BLOCK)):
        return None
    return Headers(names, offsets, sizes, crcs, at)


def _fields_plain(raw: np.ndarray) -> bool:
    """Whether every number field of every header (a row of ``raw``) is plain, and each
    checksum one of the two sums tarfile accepts (of the header's bytes as unsigned or as
    signed, the checksum field counted as spaces)."""
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

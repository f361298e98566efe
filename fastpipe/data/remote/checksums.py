"""Checksums of an object's bytes: those a store states (S3's ``x-amz-checksum-*`` of the whole
object, Cloud Storage's ``crc32c``, an ETag that is an MD5) and the one a download computes.

A download computes the cheapest stated checksum it can (CRC-64/NVME through awscrt, which the
``s3`` extra installs, CRC-32C through google-crc32c, which gcsfs installs, CRC-32 through zlib:
a fraction of an MD5's cost) and is checked against it; where the store states none
it can compute, it computes a CRC-32 of its own, recorded so that ``check="content"`` can
confirm the cached file later. An S3 checksum of a multipart upload that is a checksum of its
parts' checksums (``ChecksumType: COMPOSITE``) says nothing about the bytes as a whole and is
not used.
"""

from __future__ import annotations

import base64
import hashlib
import warnings
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ALGORITHMS", "Checksum", "Hasher", "cheapest", "computable", "etag_is_no_md5",
           "of_file", "stated_by_s3"]

# What fastpipe can compute, the cheapest first: CRC-64/NVME and CRC-32C by the CPU's own
# instructions (awscrt, google-crc32c), CRC-32 by zlib's tables, then an MD5.
ALGORITHMS = ("crc64nvme", "crc32c", "crc32", "md5")
# S3's name of each algorithm's checksum in a response.
_S3_FIELDS = {"crc32": "ChecksumCRC32", "crc32c": "ChecksumCRC32C",
              "crc64nvme": "ChecksumCRC64NVME"}
_READ = 8 << 20


@dataclass(frozen=True)
class Checksum:
    """``value`` as the store states it: the big-endian CRC in base64 (S3's and Cloud
    Storage's form), an MD5 in hex. ``etag``: an MD5 read from an S3 ETag, which is not the
    MD5 of the bytes of some objects (encrypted with KMS or by the customer's key)."""

    algorithm: str
    value: str
    etag: bool = False

    def same(self, other: Checksum | None) -> bool:
        """Whether ``other`` is this checksum of the same bytes (wherever it was read)."""
        return other is not None and (self.algorithm, self.value) == (other.algorithm,
                                                                      other.value)


def _crc32c() -> Any:
    try:
        with warnings.catch_warnings():  # its pure-Python fallback warns on import
            warnings.simplefilter("ignore")
            import google_crc32c
    except ImportError:
        return None
    return google_crc32c if google_crc32c.implementation == "c" else None


def _crc64nvme() -> Any:
    try:
        from awscrt import checksums
    except ImportError:
        return None
    return checksums if hasattr(checksums, "crc64nvme") else None  # awscrt 0.23 and later


def computable(algorithm: str) -> bool:
    if algorithm in ("crc32", "md5"):
        return True
    if algorithm == "crc32c":
        return _crc32c() is not None
    return algorithm == "crc64nvme" and _crc64nvme() is not None


class Hasher:
    """One algorithm's checksum of bytes given in pieces."""

    def __init__(self, algorithm: str) -> None:
        if algorithm not in ALGORITHMS or not computable(algorithm):
            raise ValueError(f"fastpipe cannot compute a {algorithm!r} checksum here")
        self.algorithm = algorithm
        self._md5 = hashlib.md5() if algorithm == "md5" else None
        self._crc = 0
        self._module = (_crc32c() if algorithm == "crc32c"
                        else _crc64nvme() if algorithm == "crc64nvme" else None)

    def update(self, data: bytes) -> None:
        if self._md5 is not None:
            self._md5.update(data)
        elif self.algorithm == "crc32":
            self._crc = zlib.crc32(data, self._crc)
        elif self.algorithm == "crc32c":
            self._crc = self._module.extend(self._crc, data)
        else:
            self._crc = self._module.crc64nvme(data, self._crc)

    def checksum(self) -> Checksum:
        if self._md5 is not None:
            return Checksum("md5", self._md5.hexdigest())
        width = 8 if self.algorithm == "crc64nvme" else 4
        return Checksum(self.algorithm,
                        base64.b64encode(self._crc.to_bytes(width, "big")).decode("ascii"))


def cheapest(stated: Iterable[Checksum]) -> Checksum | None:
    """The stated checksum fastpipe computes at the least cost (None: none it can)."""
    usable = {c.algorithm: c for c in stated if computable(c.algorithm)}
    return next((usable[a] for a in ALGORITHMS if a in usable), None)


def stated_by_s3(response: Mapping[str, Any]) -> list[Checksum]:
    """The checksums of the whole object in an S3 response (a HEAD's, or a GET's of the whole
    object with ``ChecksumMode="ENABLED"``). A checksum whose type the response does not give is
    taken as the whole object's only where the object is a single upload (its ETag has no
    ``-<parts>``): older S3-compatible stores state only composite ones for multipart uploads."""
    kind = response.get("ChecksumType")
    single = "-" not in str(response.get("ETag", ""))
    if kind not in (None, "FULL_OBJECT") or (kind is None and not single):
        return []
    return [Checksum(algorithm, str(response[field]))
            for algorithm, field in _S3_FIELDS.items()
            if response.get(field) and "-" not in str(response[field])]


def etag_is_no_md5(response: Mapping[str, Any]) -> bool:
    """Whether an S3 response is of an object encrypted with a KMS key or a customer's key,
    whose ETag S3 makes other than the MD5 of its bytes (an object encrypted with S3's own key
    keeps its MD5)."""
    return (str(response.get("ServerSideEncryption", "")).startswith("aws:kms")
            or bool(response.get("SSECustomerAlgorithm")))


def of_file(path: str, algorithm: str) -> Checksum:
    """The ``algorithm`` checksum of the file ``path``."""
    hasher = Hasher(algorithm)
    with open(path, "rb") as f:
        while data := f.read(_READ):
            hasher.update(data)
    return hasher.checksum()

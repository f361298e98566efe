"""``PackOptions``: the settings of one pack run, checked once, before any work starts."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastpipe import _validate

DEFAULT_SHARD_SIZE = 10_000


@dataclass(frozen=True)
class PackOptions:
    """How :func:`~fastpipe.pack.pack` packs; the arguments of ``pack`` after ``output``.

    Building one checks every value and normalises the spellings (``part="1/4"`` becomes
    ``(1, 4)``, ``size="224x224"`` or ``224`` becomes ``(224, 224)``); a bad value raises
    ``ValueError`` naming the option and the fix. ``format`` and ``merge`` stay ``None`` (the
    default for the output) until :meth:`for_output` fills them in.
    """

    storage: str = "bytes"
    num_workers: int = 1
    part: tuple[int, int] | None = None
    merge: str | None = None
    max_side: int | None = None
    size: tuple[int, int] | None = None
    strict: bool = False
    progress: bool = True
    format: str | None = None
    quality: int = 90
    transcode: bool = False
    check: bool = True
    shard_size: int = DEFAULT_SHARD_SIZE
    overwrite: bool = False
    resume: bool | None = None
    start_method: str | None = None

    def __post_init__(self) -> None:
        if self.format is not None:
            _check_format(self.format)
        if self.merge is not None and self.merge not in ("virtual", "copy"):
            raise ValueError(f"merge must be 'virtual' or 'copy', got {self.merge!r}")
        if self.format == "lmdb" and self.merge == "virtual":
            raise ValueError(_NO_VIRTUAL_LMDB)
        if self.storage not in ("bytes", "array"):
            raise ValueError(f"storage must be 'bytes' or 'array', got {self.storage!r}")
        self._set("num_workers", _validate.positive_int("num_workers", self.num_workers))
        self._set("shard_size", _validate.positive_int("shard_size", self.shard_size))
        self._set("part", parse_part(self.part))
        self._set("size", parse_size(self.size))
        if self.max_side is not None:
            if self.storage != "bytes":
                raise ValueError("max_side applies to bytes storage; for array storage pass "
                                 "size=(H, W)")
            if int(self.max_side) < 1:
                raise ValueError(f"max_side must be >= 1, got {self.max_side}")
            self._set("max_side", int(self.max_side))
        if self.size is not None and self.storage != "array":
            raise ValueError("size applies to array storage; for bytes storage pass max_side=N")
        if not 1 <= int(self.quality) <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        self._set("quality", int(self.quality))
        if self.transcode:
            if self.storage != "bytes":
                raise ValueError("transcode applies to bytes storage (it rewrites JPEG and PNG "
                                 "files); array storage keeps decoded pixels")
            if not any(importlib.util.find_spec(m) for m in ("fastpipe._jpeg", "fastpipe._png")):
                raise ValueError("transcode needs fastpipe._jpeg (JPEGs) or fastpipe._png "
                                 "(PNGs), built when libjpeg-turbo's or libpng's headers are "
                                 "installed (Debian: apt install libjpeg62-turbo-dev libpng-dev; "
                                 "then reinstall fastpipe)")
        for flag in ("strict", "progress", "check", "overwrite", "transcode"):
            self._set(flag, bool(getattr(self, flag)))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def for_output(self, output: str | os.PathLike) -> PackOptions:
        """These options with ``format`` and ``merge`` chosen for ``output`` when unset."""
        format = format_for(Path(output), self.format)
        return dataclasses.replace(self, format=format,
                                   merge=default_merge(format, self.merge))

    def plan_json(self) -> dict[str, Any]:
        """The options that change what is stored: part of the plan a resumed run must match.

        ``strict`` is in it because a skipping run's shards must not satisfy a strict one.
        """
        return {"max_side": self.max_side,
                "quality": self.quality if self.max_side is not None else None,
                "shape": list(self.size) if self.size is not None else None,
                "check": bool(self.check), "strict": bool(self.strict),
                **({"transcode": True} if self.transcode else {})}


_NO_VIRTUAL_LMDB = "LMDB has no virtual datasets: use merge='copy' (the default for LMDB)"


def _check_format(format: str) -> str:
    if format not in ("hdf5", "lmdb"):
        raise ValueError(f"format must be 'hdf5' or 'lmdb', got {format!r}")
    return format


def format_for(output: Path, format: str | None) -> str:
    """``format``, or the one the output's suffix names (``.lmdb`` / ``.mdb``: LMDB)."""
    if format is None:
        return "lmdb" if output.suffix.lower() in (".lmdb", ".mdb") else "hdf5"
    return _check_format(format)


def default_merge(format: str, merge: str | None) -> str:
    """``merge``, or the default of ``format`` (HDF5: virtual, LMDB: copy)."""
    if merge is None:
        return "virtual" if format == "hdf5" else "copy"
    if merge not in ("virtual", "copy"):
        raise ValueError(f"merge must be 'virtual' or 'copy', got {merge!r}")
    if merge == "virtual" and format == "lmdb":
        raise ValueError(_NO_VIRTUAL_LMDB)
    return merge


def parse_part(part: Any) -> tuple[int, int] | None:
    """``(i, n)`` or ``"i/n"``: part ``i`` of ``n`` of the inputs."""
    if part is None:
        return None
    if isinstance(part, str):
        try:
            i, n = (int(x) for x in part.split("/"))
        except ValueError as exc:
            raise ValueError(f"part must look like 'i/n' (e.g. 0/4), got {part!r}") from exc
    else:
        try:
            i, n = (int(x) for x in part)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"part must be (i, n), got {part!r}") from exc
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"part (i, n) needs 0 <= i < n, got ({i}, {n})")
    return i, n


def parse_size(size: Any) -> tuple[int, int] | None:
    """``(H, W)``, ``"HxW"`` or one int for a square."""
    if size is None:
        return None
    if isinstance(size, str):
        try:
            h, w = (int(x) for x in size.lower().split("x"))
        except ValueError as exc:
            raise ValueError(f"size must look like 'HxW' (e.g. 224x224), got {size!r}") from exc
    elif isinstance(size, int):
        h = w = size
    else:
        try:
            h, w = (int(x) for x in size)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"size must be (H, W), got {size!r}") from exc
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive, got ({h}, {w})")
    return h, w

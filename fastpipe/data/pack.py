"""Packing datasets: :func:`pack`, :func:`merge_packs`, :func:`verify` and their reports.

Import these from :mod:`fastpipe.data` (``from fastpipe.data import pack``); the implementation
lives in ``fastpipe.data._pack``.
"""

from __future__ import annotations

from fastpipe.data._pack import (
    CorruptInputError,
    PackError,
    PackFormatError,
    PackReport,
    VerifyReport,
    merge_packs,
    pack,
    verify,
)

__all__ = ["CorruptInputError", "PackError", "PackFormatError", "PackReport", "VerifyReport",
           "merge_packs", "pack", "verify"]

"""``LMDBDataset``: a map-style dataset over an LMDB pack (``fastpipe pack --format lmdb``)."""

from __future__ import annotations

from fastpipe.data._pack_dataset import PackDataset

__all__ = ["LMDBDataset"]


class LMDBDataset(PackDataset):
    """Reads an LMDB pack, with the same interface as :class:`fastpipe.data.H5Dataset`.

    The environment opens lazily in each process with ``readonly=True, lock=False,
    readahead=False`` and one long read transaction, so DataLoader workers under fork or spawn
    each hold their own handle.
    """

    _format = "lmdb"

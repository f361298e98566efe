"""Packing: many small files (or any source of records) into one HDF5 or LMDB file that reads
fast at random.

:func:`pack` writes a pack (in shards, in parallel, resumable), :func:`merge_packs` combines
packs (the parts of a multi-machine pack), :func:`upgrade` rewrites a pack of an earlier format
version as the current one, :func:`verify` checks one. The readers are
``fastpipe.data.H5Dataset`` and ``fastpipe.data.LMDBDataset``. Needs the ``hdf5`` extra (and
``lmdb`` for LMDB output), imported when a function runs, not with this package.
"""

from fastpipe.pack._errors import CorruptInputError, PackError, SourceError
from fastpipe.pack._merge import merge_packs, upgrade
from fastpipe.pack._options import PackOptions
from fastpipe.pack._pack import pack
from fastpipe.pack._reports import PackReport, VerifyReport
from fastpipe.pack._verify import verify

__all__ = [
    "CorruptInputError",
    "PackError",
    "PackOptions",
    "PackReport",
    "SourceError",
    "VerifyReport",
    "merge_packs",
    "pack",
    "upgrade",
    "verify",
]

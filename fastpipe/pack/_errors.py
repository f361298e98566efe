"""The errors the packer raises.

The readers' error, :class:`~fastpipe.data._format.PackFormatError`, lives with the format in
``fastpipe.data``: the readers must not import the writer.
"""

from __future__ import annotations


class PackError(RuntimeError):
    """Packing or merging could not finish; the message says why and what to do."""


class CorruptInputError(PackError):
    """An input could not be read or decoded while packing with ``strict=True``."""

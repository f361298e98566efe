"""The errors the packer raises.

The readers' error, :class:`~fastpipe.data.format.layout.PackFormatError`, lives with the format in
``fastpipe.data``: the readers must not import the writer.
"""

from __future__ import annotations


class PackError(RuntimeError):
    """Packing or merging could not finish; the message says why and what to do."""


class CorruptInputError(PackError):
    """An input could not be read or decoded while packing with ``strict=True``."""


class SourceError(PackError, ValueError):
    """The source cannot be packed as given (empty, not an ImageFolder tree, a list file without
    samples): a mistake in the input, which the ``fastpipe pack`` command reports with exit code
    2, as a bad argument."""

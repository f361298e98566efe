"""fastpipe: keep the GPU fed.

The public API is small: :class:`DataLoaderX`, :class:`DataPrefetcher`, :func:`profile`, and the subpackages
``fastpipe.ops``, ``fastpipe.data``, ``fastpipe.dali`` (needs the ``dali`` extra) and
``fastpipe.datasets``. Importing fastpipe imports torch and numpy only.
"""

from fastpipe.loader import DataLoaderX
from fastpipe.prefetch import DataPrefetcher
from fastpipe.profiling import profile

__version__ = "0.1.0"

__all__ = ["DataLoaderX", "DataPrefetcher", "__version__", "profile"]

"""DALI pipelines that behave like a DataLoader. Needs the ``dali`` extra.

* :class:`DALILoader`: ``for images, labels in loader:`` over an image folder, a list file or an
  encoded dataset (an HDF5 pack of JPEGs), on the GPU or in DALI's CPU mode.
* :func:`image_pipeline`: the DALI pipeline behind it, for driving DALI yourself.
* :class:`EncodedSource`, :class:`FileList`: the inputs; :func:`dali_device_id`: how ``device=`` is
  read; :class:`EpochSampler`: what ``DALILoader.sampler`` is.
"""

from fastpipe._optional import require

require("nvidia.dali", extra="dali", package="nvidia-dali-cuda130", feature="fastpipe.dali")

from fastpipe.dali.loader import DALILoader, EpochSampler  # noqa: E402
from fastpipe.dali.pipelines import dali_device_id, image_pipeline  # noqa: E402
from fastpipe.dali.sources import EncodedSource, FileList  # noqa: E402

__all__ = [
    "DALILoader",
    "EncodedSource",
    "EpochSampler",
    "FileList",
    "dali_device_id",
    "image_pipeline",
]

"""``H5Dataset``: a map-style dataset over an HDF5 pack made by :func:`fastpipe.pack.pack`."""

from __future__ import annotations

from fastpipe.data._pack_dataset import PackDataset

__all__ = ["H5Dataset"]


class H5Dataset(PackDataset):
    """Reads an HDF5 pack: ``dataset[i] -> (image, label)``.

    Bytes storage: ``decoder(data, source)`` turns the stored bytes (uint8 1-D array) into the image;
    the default decodes fully to a uint8 ``(3, H, W)`` tensor. Array storage: the stored array as a
    tensor (images as uint8 ``(3, H, W)``). ``transform`` then applies to the image.

    Safe with DataLoader workers under fork and spawn (the file opens lazily in each process) and
    with DistributedSampler. Reads never use h5py fancy indexing: contiguous data (``merge="copy"``)
    is read with ``os.preadv`` at its file offset, chunked data one slice at a time with the chunk
    cache off. ``__getitems__`` reads a batch in storage order.

    Attributes: ``labels`` (int64 numpy array), ``classes``, ``storage`` (``"bytes"``/``"array"``),
    ``meta`` (the pack's JSON metadata), ``skipped`` (inputs left out when packing).
    Raw access: :meth:`encoded` (bytes storage) and :meth:`source`.
    """

    _format = "hdf5"

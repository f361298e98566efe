"""``H5Dataset``: a map-style dataset over an HDF5 pack made by :func:`fastpipe.pack.pack`."""

from __future__ import annotations

from fastpipe.data._pack_dataset import PackDataset

__all__ = ["H5Dataset"]


class H5Dataset(PackDataset):
    """Reads an HDF5 pack: ``dataset[i] -> (image, label)``.

    Bytes storage: ``decoder(data, source)`` turns the stored bytes (uint8 1-D array) into the
    image; the default decodes fully to a uint8 ``(3, H, W)`` tensor. Array storage: the stored
    array as a tensor (images as uint8 ``(3, H, W)``).

    Safe with DataLoader workers under fork and spawn (the file opens lazily in each process) and
    with DistributedSampler. Reads never use h5py fancy indexing: contiguous data (``merge="copy"``)
    is read with ``os.preadv`` at its file offset, chunked data one slice at a time with the chunk
    cache off. ``__getitems__`` reads a batch in storage order.

    ``auto_augment`` and ``transform`` follow, with every random draw of sample ``i`` a pure
    function of ``(seed, epoch, i)`` (``set_epoch``), as in :class:`~fastpipe.data.ImageFolder`.

    Attributes: ``targets`` (int64 numpy array), ``classes``, ``file`` (the pack), ``storage``
    (``"bytes"``/``"array"``), ``meta`` (the pack's JSON metadata), ``skipped`` (inputs left out
    when packing). Raw access: :meth:`encoded` (bytes storage) and :meth:`path`.
    """

    _format = "hdf5"

"""The map-style dataset shared by :class:`H5Dataset` and :class:`LMDBDataset`."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fastpipe._constants import DEFAULT_INTERPOLATION
from fastpipe.data import _format as fmt
from fastpipe.data._augment import PerSample
from fastpipe.data._decode import CorruptImageError, ImageDecoder, decode_rgb
from fastpipe.data._random import forked_default_generator, sample_seed
from fastpipe.recipe import Recipe


def decode_chw(data: bytes | memoryview | np.ndarray, source: str = "<bytes>") -> torch.Tensor:
    """The default decoder: full decode to a uint8 ``(3, H, W)`` tensor."""
    return torch.from_numpy(decode_rgb(data, source)).permute(2, 0, 1).contiguous()


class PackDataset(PerSample, Dataset):
    """A map-style dataset over a fastpipe pack, opened lazily in each process.

    Each sample: ``decoder`` (bytes storage), then ``auto_augment``, then ``transform``; every
    random draw of sample ``i`` is a pure function of ``(seed, epoch, i)`` (see
    :class:`~fastpipe.data.ImageFolder`). With ``recipe=`` (a :class:`~fastpipe.Recipe`), the
    decoder is fastpipe's :class:`~fastpipe.data.ImageDecoder` for it and ``auto_augment`` the
    recipe's, as in ImageFolder; without one, ``decoder`` (default: a full decode to a uint8
    ``(3, H, W)`` tensor). ``file`` is the pack's path; ``path(i)`` names the file sample ``i``
    was packed from.

    The constructor opens the pack once to validate it and read the labels, then closes it, so
    nothing open is ever pickled or inherited: each DataLoader worker (fork or spawn) opens its own
    handle on first access, and a handle from before a fork is replaced in the child.
    """

    _format = ""

    def __init__(
        self,
        path: str | os.PathLike,
        decoder: Callable[[np.ndarray, str], Any] | None = None,
        transform: Callable[[Any], Any] | None = None,
        auto_augment: str | None = None,
        seed: int | None = None,
        *,
        recipe: Recipe | None = None,
    ) -> None:
        self.file = Path(path)
        where = type(self).__name__
        if recipe is not None:
            if decoder is not None:
                raise ValueError(f"{where}: pass recipe= (fastpipe's decoder for it) or decoder=, "
                                 "not both")
            recipe = Recipe.resolve(recipe, PackDataset.__init__, where,
                                    auto_augment=auto_augment)
            decoder = ImageDecoder(recipe=recipe)
        elif isinstance(decoder, ImageDecoder):
            recipe = decoder.recipe.replace(auto_augment=auto_augment)
        self.decoder = decoder
        # Without a recipe, auto_augment's geometric ops resize with the decoder's filter.
        self._init_per_sample(transform, recipe, seed, auto_augment,
                              getattr(decoder, "interpolation", DEFAULT_INTERPOLATION))
        with self._open() as reader:
            self.meta: dict[str, Any] = reader.meta
            self.targets: np.ndarray = reader.labels
            self.classes: list[str] = reader.classes
            self.storage: str = reader.spec.storage
            self.layout: str = reader.spec.layout
            self.sample_shape = reader.spec.sample_shape
            self._count = reader.count
        if decoder is not None and self.storage != "bytes":
            raise ValueError(
                f"{self.file} holds decoded arrays ({self.layout}) of one size, which cannot be "
                "cropped and resized per sample: a decoder applies to bytes storage only (and "
                "recipe= builds one); pack with storage='bytes' (fastpipe pack --storage bytes), "
                "or pass a transform instead")
        self._reader: fmt.PackReader | None = None
        self._pid: int | None = None

    def _open(self) -> fmt.PackReader:
        try:
            found = fmt.sniff_format(self.file)
        except fmt.PackFormatError:
            found = None  # open_pack explains what the file is not
        if found is not None and found != self._format:
            reader = "LMDBDataset" if found == "lmdb" else "H5Dataset"
            raise fmt.PackFormatError(
                f"{self.file} is an {'LMDB' if found == 'lmdb' else 'HDF5'} file, but "
                f"{type(self).__name__} reads {'LMDB' if self._format == 'lmdb' else 'HDF5'} "
                f"packs: open it with fastpipe.data.{reader}")
        return fmt.open_pack(self.file, self._format)

    def _get_reader(self) -> fmt.PackReader:
        pid = os.getpid()
        if self._reader is None or self._pid != pid:
            if self._reader is not None:
                # Inherited through fork: close this process's copies of the parent's handles
                # (the parent's stay open) and open our own.
                try:
                    self._reader.close()
                except Exception:  # noqa: BLE001 - best effort on inherited handles
                    pass
            self._reader = None
            self._reader = self._open()
            self._pid = pid
        return self._reader

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_pid"] = None
        return state

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> tuple[Any, int]:
        reader = self._get_reader()
        i = reader._check_index(index)
        return self._finish(reader, i, self._epoch_of(index), reader.read(i))

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        """Batched read: samples are read in storage order, returned in the order asked."""
        reader = self._get_reader()
        checked = [reader._check_index(i) for i in indices]
        epochs = [self._epoch_of(i) for i in indices]
        order = np.argsort(checked, kind="stable")
        if self.storage == "array":
            batch = np.empty((len(checked), *reader.spec.sample_shape), reader.spec.dtype)
            for k in order:
                reader.read(checked[k], batch[k])
            rows = torch.from_numpy(batch)
            return [self._finish(reader, i, epochs[k], None, rows[k])
                    for k, i in enumerate(checked)]
        data: list[np.ndarray | None] = [None] * len(checked)
        for k in order:
            data[k] = reader.read(checked[k])
        return [self._finish(reader, i, epochs[k], data[k]) for k, i in enumerate(checked)]

    def _finish(self, reader: fmt.PackReader, index: int, epoch: int, data: np.ndarray | None,
                tensor: torch.Tensor | None = None) -> tuple[Any, int]:
        # fastpipe's ImageDecoder draws from a generator it is given; any other decoder runs
        # under the forked global generator, as auto_augment and transform do.
        fused = isinstance(self.decoder, ImageDecoder)
        fork = self._needs_fork() or (self.decoder is not None and not fused)
        if not fork:
            return self._decoded(reader, index, epoch, data, tensor), int(self.targets[index])
        with forked_default_generator(sample_seed(self.seed, epoch, index, 1)):
            image = self._augmented(self._decoded(reader, index, epoch, data, tensor))
        return image, int(self.targets[index])

    def _decoded(self, reader: fmt.PackReader, index: int, epoch: int, data: np.ndarray | None,
                 tensor: torch.Tensor | None) -> Any:
        if self.storage != "bytes":
            return tensor if tensor is not None else torch.from_numpy(data)
        source = f"{self.file}[{index}]"
        try:
            if isinstance(self.decoder, ImageDecoder):
                return self.decoder._from_seed(data, source, sample_seed(self.seed, epoch, index))
            return (self.decoder or decode_chw)(data, source)
        except CorruptImageError as exc:
            raise CorruptImageError(
                f"sample {index} of {self.file} (packed from {reader.source(index)}) does not "
                f"decode: {exc}"
            ) from exc

    def encoded(self, index: int) -> tuple[np.ndarray, int]:
        """The stored bytes of sample ``index`` (uint8 1-D array, e.g. a JPEG file) and its label.

        Bytes storage only; this is what a DALI external source feeds to its decoder.
        """
        if self.storage != "bytes":
            raise ValueError(f"{self.file} holds decoded arrays (array storage): encoded() "
                             "needs bytes storage")
        reader = self._get_reader()
        i = reader._check_index(index)
        return reader.read(i), int(self.targets[i])

    def fingerprint(self) -> str:
        """A short hash of what the pack holds (its packing plan, which names the source files
        and options, and the labels), which a saved loader state must match
        (fastpipe.data._resume)."""
        digest = hashlib.sha256(str(self.meta.get("plan") or self.file).encode())
        digest.update(np.asarray(self.targets, dtype=np.int64).tobytes())
        return digest.hexdigest()[:16]

    def describe(self, index: int) -> str:
        """Names sample ``index`` for error messages: the pack, the index and the original file."""
        return f"{self.file}[{index}] (packed from {self.path(index)})"

    def path(self, index: int) -> str:
        """Where sample ``index`` was packed from (path relative to the source root, as listed)."""
        return self._get_reader().source(index)

    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Inputs left out when packing: ``{"index", "source", "reason"}`` dicts."""
        return list(self.meta.get("skipped") or [])

    def close(self) -> None:
        """Closes this process's handle (reopened on next access)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader = None
        self._pid = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        shape = f", sample_shape={tuple(self.sample_shape)}" if self.sample_shape else ""
        return (f"{type(self).__name__}({str(self.file)!r}, samples={len(self)}, "
                f"storage={self.storage!r}"
                f"{shape}, classes={len(self.classes)})")

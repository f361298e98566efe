"""What a DALI pipeline reads: file lists (ImageFolder trees, list files) and encoded samples.

Two kinds of input feed :func:`fastpipe.dali.image_pipeline`:

* a :class:`FileList` (or a path that becomes one), read by DALI's own ``fn.readers.file``;
* an :class:`EncodedSource` over any *encoded dataset*, fed through ``fn.external_source``. An
  encoded dataset is any object with ``__len__`` and ``encoded(index) -> (data, label)``, where
  ``data`` is the encoded image (JPEG, PNG, ...) as a 1-D uint8 numpy array (or bytes) and
  ``label`` an int. :class:`FileList` is one; an HDF5 pack of JPEG bytes is another.

:func:`fastpipe.data.shard_order` is the one rule for which samples a shard reads in an epoch and
in which order; :class:`EncodedSource` and :class:`fastpipe.dali.DALILoader` both use it.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe import _validate as check
from fastpipe.data.sampling.sampler import shard_order
from fastpipe.data.sources.listing import list_image_folder

# What DALI's image decoders read (JPEG, JPEG 2000, PNG, BMP, TIFF, PNM, WebP); the same
# extensions fn.readers.file picks up from a folder tree.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2", ".pbm", ".pgm", ".ppm",
     ".pnm"}
)

# A list file naming thousands of missing images gets a short error, not thousands of lines.
_MAX_LISTED_PROBLEMS = 5


class FileList:
    """Image file paths with integer labels, in a fixed order.

    Build one with :meth:`from_path` (a folder or a list file), :meth:`from_folder` or
    :meth:`from_list_file`, or directly from two sequences. It is also an encoded dataset:
    ``encoded(i)`` returns the bytes of file ``i`` and its label.

    Attributes:
        files: absolute paths, as strings.
        targets: ``(N,)`` int64 array of labels.
        classes: class names by label for an ImageFolder tree, else ``None``.
    """

    def __init__(
        self,
        files: Sequence[str | os.PathLike],
        targets: Sequence[int] | np.ndarray,
        classes: Sequence[str] | None = None,
    ) -> None:
        self.files = [os.fspath(f) for f in files]
        self.targets = np.asarray(targets, dtype=np.int64).reshape(-1)
        self.classes = list(classes) if classes is not None else None
        if len(self.files) != len(self.targets):
            raise ValueError(
                f"FileList got {len(self.files)} files but {len(self.targets)} labels; "
                "pass one label per file"
            )
        if len(self.files) == 0:
            raise ValueError("FileList got no files; pass at least one image")
        if self.targets.min() < 0:
            raise ValueError(f"labels must be >= 0, got {int(self.targets.min())}")

    def fingerprint(self) -> str:
        """A short hash of the files and labels, which a saved loader state must match."""
        digest = hashlib.sha256("\0".join(self.files).encode())
        digest.update(self.targets.tobytes())
        return digest.hexdigest()[:16]

    @classmethod
    def from_path(cls, path: str | os.PathLike, root: str | os.PathLike | None = None) -> FileList:
        """A folder in ImageFolder layout, or a list file with ``path label`` lines."""
        path = Path(path)
        if path.is_dir():
            if root is not None:
                raise ValueError(f"root= applies to list files only, but {path} is a folder")
            return cls.from_folder(path)
        if path.is_file():
            return cls.from_list_file(path, root=root)
        raise FileNotFoundError(
            f"{path} does not exist: pass an image folder (root/<class>/<image>) or a list file "
            "with one 'path label' line per image"
        )

    @classmethod
    def from_folder(cls, root: str | os.PathLike) -> FileList:
        """Scans ``root/<class>/**/<image>``: classes sorted by name, label = class position.

        Same labelling as ``torchvision.datasets.ImageFolder``; files with other extensions
        than :data:`IMAGE_EXTENSIONS` and files directly in ``root`` are ignored.
        """
        root = Path(root).absolute()
        if not root.is_dir():
            if root.exists():
                raise NotADirectoryError(f"{root} is a file, not an image folder")
            raise FileNotFoundError(f"image folder {root} does not exist")
        classes, paths, labels = list_image_folder(root, IMAGE_EXTENSIONS)
        if not classes:
            raise ValueError(
                f"{root} has no class folders: expected the ImageFolder layout "
                "root/<class>/<image>, or pass a list file with 'path label' lines"
            )
        files = [os.path.join(root, path) for path in paths]
        if not files:
            raise ValueError(
                f"no images found in the class folders of {root} "
                f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        return cls(files, labels, classes)

    @classmethod
    def from_list_file(
        cls, list_file: str | os.PathLike, root: str | os.PathLike | None = None
    ) -> FileList:
        """Reads ``path label`` lines (the format of DALI's ``file_list``); blank lines skipped.

        Relative paths are taken relative to ``root``, or to the list file's folder without it.
        The path is everything before the last whitespace, so it may contain spaces. Every file
        must exist: a missing one is reported with its line number here, not mid-epoch.
        """
        list_file = Path(list_file)
        if not list_file.is_file():
            raise FileNotFoundError(f"list file {list_file} does not exist")
        base = Path(root) if root is not None else list_file.parent
        files: list[str] = []
        labels: list[int] = []
        missing: list[str] = []
        with open(list_file, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                line = line.strip()
                if not line:
                    continue
                parts = line.rsplit(None, 1)
                try:
                    if len(parts) != 2:
                        raise ValueError
                    label = int(parts[1])
                except ValueError:
                    raise ValueError(
                        f"{list_file}:{number}: expected 'path label' with an integer label, "
                        f"got {line!r}"
                    ) from None
                if label < 0:
                    raise ValueError(f"{list_file}:{number}: labels must be >= 0, got {label}")
                path = os.path.abspath(os.path.join(base, parts[0]))
                if not os.path.isfile(path):
                    missing.append(f"line {number}: {path}")
                files.append(path)
                labels.append(label)
        if missing:
            shown = "; ".join(missing[:_MAX_LISTED_PROBLEMS])
            extra = len(missing) - _MAX_LISTED_PROBLEMS
            more = f" and {extra} more" if extra > 0 else ""
            raise FileNotFoundError(
                f"{list_file} names {len(missing)} image(s) that do not exist ({shown}{more}); "
                f"fix the paths (relative paths are read from {base}) or remove those lines"
            )
        if not files:
            raise ValueError(f"list file {list_file} has no 'path label' lines")
        return cls(files, labels)

    def __len__(self) -> int:
        return len(self.files)

    def encoded(self, index: int) -> tuple[np.ndarray, int]:
        """The bytes of file ``index`` as a 1-D uint8 array, and its label."""
        path = self.files[index]
        try:
            data = np.fromfile(path, dtype=np.uint8)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"image {path} disappeared after the file list was made; restore it or rebuild "
                "the list"
            ) from None
        return data, int(self.targets[index])

    def describe(self, index: int) -> str:
        """How error messages name sample ``index``: its path."""
        return self.files[index]

    def subset(self, indices: Sequence[int] | np.ndarray) -> FileList:
        """The files at ``indices``, in that order (repeats allowed)."""
        indices = np.asarray(indices, dtype=np.int64)
        return FileList([self.files[i] for i in indices], self.targets[indices], self.classes)

    def __repr__(self) -> str:
        return f"FileList({len(self)} files, {len(self.classes or ())} classes)"


def open_source(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Any:
    """What a path names (fastpipe.data.sources.resolve.kind_of, the one answer): a fastpipe pack
    of encoded images (HDF5 or LMDB, told by its content), an image folder in ImageFolder
    layout, or a list file of ``path label`` lines."""
    from fastpipe.data.sources.resolve import kind_of

    kind = kind_of(path)
    if kind in ("folder", "list"):
        return FileList.from_path(path, root=root)
    if kind not in ("hdf5", "lmdb"):
        raise ValueError(f"{path} holds {kind} data; DALI's readers take an image folder, a list "
                         "file of 'path label' lines or a fastpipe pack of encoded images (read "
                         "other sources with the CPU path, fastpipe.data)")
    if root is not None:
        raise ValueError(f"root= applies to list files only, but {path} is a {kind} pack")
    if kind == "hdf5":
        from fastpipe.data import H5Dataset as pack_class
    else:
        from fastpipe.data import LMDBDataset as pack_class
    dataset = pack_class(path)
    if dataset.storage != "bytes":
        raise ValueError(
            f"{path} stores decoded arrays; DALI decodes encoded images, so pack with "
            "storage='bytes' (fastpipe pack --storage bytes) or read this pack with H5Dataset"
        )
    return dataset


def _as_encoded(data: Any, label: Any, where: str) -> tuple[np.ndarray, np.int64]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 1:
        if isinstance(data, np.ndarray):
            got = f"{data.dtype} array of shape {data.shape}"
        else:
            got = type(data).__name__
        raise TypeError(
            f"{where} must give (encoded image as a 1-D uint8 array or bytes, int label), got {got}"
        )
    if data.size == 0:
        from fastpipe.data import CorruptImageError

        raise CorruptImageError(f"cannot decode image {where}: it is empty (0 bytes)")
    try:
        label = np.int64(label)
    except (TypeError, ValueError):
        raise TypeError(f"{where} gave a label that is not an int: {label!r}") from None
    return data, label


class EncodedSource:
    """Feeds ``fn.external_source`` with batches of encoded images and labels from a dataset.

    ``dataset`` is any object with ``__len__`` and ``encoded(index) -> (data, label)`` (``data``
    the encoded image as a 1-D uint8 array or bytes, ``label`` an int); pass ``fetch`` to read
    samples another way (``fetch(index) -> (data, label)``), e.g. ``fetch=dataset.__getitem__``.

    Iterating it runs one epoch on this shard: batches of ``(list of 1-D uint8 arrays, (n,) int64
    labels)``, the last one smaller unless ``drop_last``; each ``iter()`` starts the next epoch,
    reshuffled when ``shuffle`` (the order: :func:`fastpipe.data.shard_order`). Hand it to
    :func:`fastpipe.dali.image_pipeline` as the source, which passes ``cycle="raise"`` so each DALI
    epoch is one pass; the pipeline needs ``batch_size`` equal to this source's.

    Reading happens in the thread that runs the pipeline, one batch at a time; the dataset object
    stays in this process (it is not pickled).
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        epoch: int = 0,
        fetch: Callable[[int], tuple[Any, Any]] | None = None,
    ) -> None:
        batch_size = check.positive_int("batch_size", batch_size)
        if getattr(dataset, "joint", None) is not None:
            raise ValueError(
                f"{type(dataset).__name__} has joint={dataset.joint!r}, which DALI does not run "
                "(DALI crops one image per sample); load it on the CPU path (DataLoaderX), or "
                "build the dataset with joint=None")
        if fetch is None:
            fetch = getattr(dataset, "encoded", None)
            if not callable(fetch):
                raise TypeError(
                    f"{type(dataset).__name__} has no encoded(index) method; give the dataset one "
                    "returning (encoded bytes as a 1-D uint8 array, int label), or pass fetch="
                )
        try:
            size = len(dataset)
        except TypeError:
            raise TypeError(
                f"{type(dataset).__name__} has no len(); an encoded dataset needs __len__"
            ) from None
        if size == 0:
            raise ValueError(f"the dataset {dataset!r} is empty")
        self.dataset = dataset
        self.fetch = fetch
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.drop_last = bool(drop_last)
        self._dataset_size = size
        self._next_epoch = int(epoch)
        # Validates the shard arguments once, here rather than at the first batch.
        self.num_samples = len(self.indices(0))

    def __len__(self) -> int:
        """Batches per epoch on this shard."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` runs (to resume a run at the right shuffle)."""
        self._next_epoch = int(epoch)

    def indices(self, epoch: int) -> np.ndarray:
        """This shard's sample indices for ``epoch``, in reading order."""
        return np.asarray(shard_order(
            self._dataset_size, epoch=epoch, seed=self.seed, shuffle=self.shuffle,
            rank=self.rank, world_size=self.world_size, drop_last=self.drop_last,
        ), np.int64)

    def batches(self, epoch: int) -> list[np.ndarray]:
        """This shard's index batches for ``epoch``; the last is partial unless ``drop_last``."""
        indices = self.indices(epoch)
        step = self.batch_size
        return [indices[start:start + step] for start in range(0, len(self) * step, step)]

    def describe(self, index: int) -> str:
        """How error messages name sample ``index``."""
        describe = getattr(self.dataset, "describe", None)
        if callable(describe):
            return describe(index)
        return f"sample {index} of {type(self.dataset).__name__}"

    def read(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Reads samples ``indices``: (list of 1-D uint8 arrays, ``(n,)`` int64 labels)."""
        data: list[np.ndarray] = []
        labels = np.empty(len(indices), dtype=np.int64)
        for position, index in enumerate(indices):
            index = int(index)
            item = self.fetch(index)
            if not isinstance(item, tuple) or len(item) != 2:
                raise TypeError(
                    f"{self.describe(index)}: fetch must return a (data, label) pair, got "
                    f"{type(item).__name__}"
                )
            encoded, labels[position] = _as_encoded(item[0], item[1], self.describe(index))
            data.append(encoded)
        return data, labels

    def __iter__(self) -> Iterator[tuple[list[np.ndarray], np.ndarray]]:
        epoch = self._next_epoch
        self._next_epoch += 1
        return (self.read(batch) for batch in self.batches(epoch))

    def __repr__(self) -> str:
        return (
            f"EncodedSource({self.dataset!r}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, "
            f"shard {self.rank}/{self.world_size}, {self.num_samples} samples per epoch)"
        )

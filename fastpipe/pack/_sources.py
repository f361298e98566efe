"""What ``pack`` reads (an ImageFolder tree, a list file, a map-style dataset) and how one input
becomes one stored sample (kept bytes, re-encoded bytes, or a fixed-shape array)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data._decode import CorruptImageError, ImageTooLargeError, decode_rgb
from fastpipe.data._format import Spec
from fastpipe.data._listing import IMG_EXTENSIONS, list_image_folder
from fastpipe.pack._errors import PackError


class SkipInput(Exception):
    """This input is unreadable or corrupt: skip it (or stop with ``strict``)."""


@dataclass
class Listing:
    """The inputs of a pack, in order. File sources keep paths; dataset sources keep the dataset."""

    kind: str  # "folder", "list" or "dataset"
    description: str
    count: int
    classes: list[str]
    files: list[str] | None = None  # absolute paths to read (file sources)
    names: list[str] | None = None  # stored source paths (relative to the root / as listed)
    labels: np.ndarray | None = None  # file sources: int64 labels
    dataset: Any = None
    fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    records: bool = False  # dataset samples are records of fields (pack/_records.py)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "description": self.description, "inputs": self.count,
                "fingerprint": self.fingerprint}


def list_source(source: Any) -> Listing:
    """Lists the inputs of ``source``: a folder, a list file, or a map-style dataset."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if path.is_dir():
            return _list_folder(path)
        if path.is_file():
            if tarfile.is_tarfile(path):
                return _list_tars([path], str(path))
            return _list_file(path)
        raise FileNotFoundError(f"pack source {path} does not exist (expected an ImageFolder tree "
                                "or a list file)")
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        n = len(source)
        classes = [str(c) for c in getattr(source, "classes", None) or []]
        name = type(source).__name__
        key = f"dataset\0{type(source).__module__}.{name}\0{n}"
        digest = hashlib.sha256(key.encode()).hexdigest()
        return Listing("dataset", f"{name} ({n} samples)", n, classes, dataset=source,
                       fingerprint=digest)
    raise TypeError(
        f"pack source must be a folder, a list file or a map-style dataset (with __len__ and "
        f"__getitem__ returning (array, label)), got {type(source).__name__}"
    )


def _fingerprint(kind: str, names: list[str], labels: np.ndarray, classes: list[str],
                 files: list[str]) -> str:
    """Names, labels and each file's size and mtime: a file rewritten in place changes the plan, so
    its old shard is not reused on resume."""
    h = hashlib.sha256(kind.encode())
    h.update("\0".join(classes).encode())
    h.update(b"\1")
    h.update("\0".join(names).encode("utf-8", "surrogateescape"))
    h.update(np.ascontiguousarray(labels, "<i8").tobytes())
    h.update(np.ascontiguousarray([_stat_key(f) for f in files], "<i8").tobytes())
    return h.hexdigest()


def _stat_key(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:  # unreadable inputs are skipped (or refused) when packing, not here
        return -1, -1
    return st.st_size, st.st_mtime_ns


def _list_folder(root: Path) -> Listing:
    # torchvision's listing, shared with ImageFolder and DALI, so sample i and its label match.
    classes, names, labels = list_image_folder(root, IMG_EXTENSIONS)
    if not names:
        tars = sorted(root.glob("*.tar"))
        if tars:
            return _list_tars(tars, str(root))
        arrays = _list_array_folder(root)
        if arrays is not None:
            return arrays
    if not classes:
        # A folder of images without class folders (super-resolution's HR/): records of one
        # image field, "image", stored as they are.
        from fastpipe.data.datasets.folders import PairedFolders

        try:
            flat = PairedFolders({"image": root}, seed=0)
        except FileNotFoundError:
            raise PackError(f"{root} has no class folders and no images: an ImageFolder tree is "
                            "root/<class>/<image>; a folder of images packs as records of one "
                            "image field") from None
        files = [flat.paths(i)["image"] for i in range(len(flat))]
        names = [os.path.relpath(f, root) for f in files]
        return Listing("dataset", f"{root} ({len(files)} images, no class folders: one image "
                       "field)", len(files), [], dataset=flat.pack_source(),
                       fingerprint=_fingerprint("images", names, np.zeros(len(names), np.int64),
                                                [], files))
    if not names:
        raise PackError(f"{root} holds class folders but no images ({', '.join(IMG_EXTENSIONS)})")
    label_array = np.asarray(labels, np.int64)
    files = [str(root / n) for n in names]
    return Listing("folder", str(root), len(names), classes, files=files, names=names,
                   labels=label_array,
                   fingerprint=_fingerprint("folder", names, label_array, classes, files))


def _list_tars(shards: list[Path], description: str) -> Listing:
    """WebDataset tar shards, read in place: one record per sample, fields by extension."""
    from fastpipe.data.tar import TarRecords

    records = TarRecords(shards)
    h = hashlib.sha256(b"tar")
    for shard in shards:
        st = shard.stat()
        h.update(f"{shard.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\1".encode())
    return Listing("dataset", f"{description} ({len(shards)} tar shards, {len(records)} samples)",
                   len(records), [], dataset=records, fingerprint=h.hexdigest())


def _list_array_folder(root: Path) -> Listing | None:
    """A folder of ``.npy``/``.npz`` files (one record each), in class sub-folders (labelled) or
    not; None when it holds none."""
    from fastpipe.pack._records import ARRAY_EXTENSIONS

    classes, names, labels = list_image_folder(root, ARRAY_EXTENSIONS)
    if not names:
        classes = []
        names = sorted(os.path.relpath(os.path.join(d, f), root)
                       for d, _, fs in os.walk(root, followlinks=True) for f in fs
                       if f.lower().endswith(ARRAY_EXTENSIONS)
                       and not f.endswith(".fastpipe-index.npz"))
        labels = [-1] * len(names)
    if not names:
        return None
    label_array = np.asarray(labels, np.int64)
    files = [str(root / n) for n in names]
    return Listing("arrays", str(root), len(names), classes, files=files, names=names,
                   labels=label_array, records=True,
                   fingerprint=_fingerprint("arrays", names, label_array, classes, files))


def _list_file(list_path: Path) -> Listing:
    """``path [label]`` per line; ``#`` comments and blank lines skipped; tab-separated lines split
    on the last tab (paths with spaces), others on the last run of whitespace. Labels are integers
    or class names (sorted into ``classes``); relative paths are relative to the list file."""
    names: list[str] = []
    raw_labels: list[str | None] = []
    with open(list_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if line.startswith(COLUMNS_HEADER):
                return _list_columns(list_path, line[len(COLUMNS_HEADER):].split(), f, number)
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit("\t", 1) if "\t" in line else line.rsplit(None, 1)
            parts = [p.strip() for p in parts]
            names.append(parts[0])
            raw_labels.append(parts[1] if len(parts) == 2 else None)
            if not parts[0]:
                raise PackError(f"{list_path}:{number}: empty path")
    if not names:
        raise PackError(f"{list_path} lists no files (expected 'path [label]' per line)")
    given = [lab for lab in raw_labels if lab is not None]
    if given and len(given) != len(raw_labels):
        raise PackError(f"{list_path}: some lines have a label and some do not; give every line "
                        "a label or none")
    classes: list[str] = []
    if not given:
        labels = np.full(len(names), -1, np.int64)
    elif all(_is_int(lab) for lab in given):
        labels = _checked_labels([int(lab) for lab in given], str(list_path))
    else:
        classes = sorted(set(given))
        index = {name: k for k, name in enumerate(classes)}
        labels = np.asarray([index[lab] for lab in given], np.int64)
    base = list_path.parent
    files = [str(base / n) if not os.path.isabs(n) else n for n in names]
    from fastpipe.pack._records import is_array_file

    arrays = [is_array_file(n) for n in names]
    if any(arrays) and not all(arrays):
        raise PackError(f"{list_path} lists both .npy/.npz files and other files; a pack holds "
                        "one kind of sample")
    kind = "arrays" if all(arrays) else "list"
    return Listing(kind, str(list_path), len(names), classes, files=files, names=names,
                   labels=labels, records=kind == "arrays",
                   fingerprint=_fingerprint(kind, names, labels, classes, files))


COLUMNS_HEADER = "#fields:"
NO_LABEL = -1
LABEL_RANGE = "labels are class indices (0 and up), or -1 for a sample without one"


def _checked_labels(labels: list[int], where: str) -> np.ndarray:
    """Integer labels of a list file; one below -1 would be refused by every reader of the pack."""
    array = np.asarray(labels, np.int64)
    if (bad := np.flatnonzero(array < NO_LABEL)).size:
        raise PackError(f"{where}: sample {int(bad[0])} has label {int(array[bad[0]])}; "
                        f"{LABEL_RANGE}")
    return array


def _list_columns(list_path: Path, fields: list[str], lines: Any, header: int) -> Listing:
    """A list file of records: a ``#fields: lr hr label`` line names the columns, then one line
    per sample (tab-separated when it has tabs, else whitespace). A ``label`` column holds
    integers or class names; every other column a file (images kept as bytes, ``.npy``/``.npz``
    arrays), relative to the list file."""
    from fastpipe.pack._records import check_name

    if len(fields) < 1 or len(set(fields)) != len(fields):
        raise PackError(f"{list_path}:{header}: '{COLUMNS_HEADER}' needs distinct field names, "
                        f"got {fields}")
    for name in fields:
        check_name(name)
    columns = [k for k, name in enumerate(fields) if name != "label"]
    rows: list[list[str]] = []
    for number, line in enumerate(lines, header + 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in (line.split("\t") if "\t" in line else line.split())]
        if len(parts) != len(fields):
            raise PackError(f"{list_path}:{number}: {len(parts)} columns, but the header names "
                            f"{len(fields)} ({' '.join(fields)})")
        rows.append(parts)
    if not rows:
        raise PackError(f"{list_path} lists no samples after its '{COLUMNS_HEADER}' line")
    base = list_path.parent
    paths = [[row[k] if os.path.isabs(row[k]) else str(base / row[k]) for k in columns]
             for row in rows]
    classes: list[str] = []
    if "label" in fields:
        raw = [row[fields.index("label")] for row in rows]
        if all(_is_int(x) for x in raw):
            labels = _checked_labels([int(x) for x in raw], str(list_path))
        else:
            classes = sorted(set(raw))
            labels = np.asarray([classes.index(x) for x in raw], np.int64)
    else:
        labels = np.full(len(rows), -1, np.int64)
    names = [rows[i][columns[0]] if columns else f"line {i}" for i in range(len(rows))]
    files = ["\0".join(p) for p in paths]  # one entry per sample: its files, in column order
    flat = [f for p in paths for f in p]
    return Listing("columns", str(list_path), len(rows), classes, files=files, names=names,
                   labels=labels, records=True,
                   extra={"columns": [fields[k] for k in columns]},
                   fingerprint=_fingerprint("columns", names + fields, labels, classes, flat))


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# One input -> one stored sample


def load_input(listing: Listing, index: int, local: int | None = None,
               files: list[str] | None = None, raw: bool = False) -> tuple[Any, int]:
    """Reads input ``index``: (raw bytes or array-like, label); a dataset's sample as it is with
    ``raw`` or for a records pack. Raises SkipInput when unreadable."""
    if listing.kind == "dataset":
        try:
            item = listing.dataset[index]
        except (KeyboardInterrupt, SystemExit, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - a user dataset may raise anything for a bad sample
            raise SkipInput(f"dataset[{index}] raised {type(exc).__name__}: {exc}") from exc
        if raw or listing.records:
            return item, -1
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise PackError(
                f"dataset[{index}] returned {type(item).__name__}; an image pack needs "
                "(image, label) pairs (a dict or another tuple packs as a record of fields)"
            )
        value, label = item
        try:
            label = int(label)
        except (TypeError, ValueError) as exc:
            raise PackError(f"dataset[{index}] has label {label!r}; labels must be "
                            "integers") from exc
        if label < NO_LABEL:
            raise PackError(f"dataset[{index}] has label {label}; {LABEL_RANGE}")
        return value, label
    path = (files if files is not None else listing.files)[index if local is None else local]
    if listing.kind == "columns":
        from fastpipe.pack._records import load_array_file

        record: dict[str, Any] = {}
        for name, file in zip(listing.extra["columns"], path.split("\0"), strict=True):
            try:
                if file.lower().endswith((".npy", ".npz")):
                    arrays = load_array_file(file)
                    record[name] = arrays["array"] if len(arrays) == 1 and "array" in arrays \
                        else arrays
                else:
                    with open(file, "rb") as f:
                        record[name] = f.read()
            except (OSError, ValueError, EOFError) as exc:
                raise SkipInput(f"column {name!r}: unreadable {file}: {exc}") from exc
        return record, -1
    if listing.kind == "arrays":
        from fastpipe.pack._records import load_array_file

        try:
            return load_array_file(path), -1
        except (OSError, ValueError, EOFError) as exc:
            raise SkipInput(f"unreadable array file: {exc}") from exc
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SkipInput(f"unreadable: {exc.strerror or exc}") from exc
    if not data:
        raise SkipInput("empty file")
    return data, -1  # file labels come from the listing


def source_name(listing: Listing, index: int, names: list[str] | None = None,
                local: int | None = None) -> str:
    if listing.kind == "dataset":
        describe = getattr(listing.dataset, "describe", None)
        if callable(describe):  # fastpipe's readers name a sample's origin (shard:key, file[i])
            return str(describe(index))
        return f"{type(listing.dataset).__name__}[{index}]"
    return (names if names is not None else listing.names)[index if local is None else local]


def _as_array(value: Any) -> np.ndarray | bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if hasattr(value, "convert") and hasattr(value, "size") and hasattr(value, "mode"):  # PIL image
        return np.asarray(value.convert("RGB"))
    if hasattr(value, "detach") and hasattr(value, "numpy"):  # torch tensor
        return value.detach().cpu().numpy()
    if isinstance(value, (tuple, list, dict)):
        raise PackError(
            f"a sample's image is a {type(value).__name__} of {len(value)} values; an image pack "
            "holds (image, label) pairs. To pack several arrays per sample, return a flat tuple "
            "(e.g. (mix, zone0, label)) or a dict: it packs as a record of fields")
    return np.asarray(value)


def _is_image(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3


def fit_image(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Resizes an (H, W, 3) uint8 image so it covers ``shape`` (aspect kept, bicubic) and crops
    the centre."""
    from PIL import Image

    th, tw = shape
    h, w = image.shape[:2]
    if (h, w) == (th, tw):
        return image
    scale = max(th / h, tw / w)
    nh, nw = max(th, round(h * scale)), max(tw, round(w * scale))
    resized = np.asarray(Image.fromarray(image).resize((nw, nh), Image.Resampling.BICUBIC))
    top, left = (nh - th) // 2, (nw - tw) // 2
    return resized[top:top + th, left:left + tw]


def _decode(data: bytes, source: str) -> np.ndarray:
    try:
        return decode_rgb(data, source)
    except ImageTooLargeError as exc:  # a decompression bomb, refused from its header
        raise SkipInput(f"too large: {exc}") from exc
    except CorruptImageError as exc:
        raise SkipInput(f"corrupt image: {exc}") from exc


@dataclass
class Processor:
    """Turns a loaded input into the bytes or array the pack stores."""

    spec: Spec
    max_side: int | None = None
    shape: tuple[int, int] | None = None
    quality: int = 90
    check: bool = True
    transcode: bool = False

    def __call__(self, value: Any, source: str) -> np.ndarray:
        """Returns the sample to store: flat uint8 (bytes storage) or the sample array."""
        value = _as_array(value)
        if self.spec.storage == "bytes":
            if isinstance(value, bytes):
                return np.frombuffer(self._rewritten(self._encoded(value, source), source),
                                     np.uint8)
            array = np.asarray(value)
            if array.dtype == np.uint8 and array.ndim == 1:
                data = self._encoded(array.tobytes(), source)
                return np.frombuffer(self._rewritten(data, source), np.uint8)
            if array.dtype == np.uint8 and (array.ndim == 2 or _is_image(array)):
                return np.frombuffer(self._encode_array(array, source), np.uint8)
            raise PackError(
                f"{source} is a {array.dtype} array of shape {array.shape}: bytes storage holds "
                "encoded images (bytes, or uint8 HxW / HxWx3 arrays); use storage='array' for "
                "other arrays"
            )
        if isinstance(value, bytes):
            value = _decode(value, source)
        array = np.asarray(value)
        if self.spec.layout == "CHW":
            if array.dtype == np.uint8 and array.ndim == 2:
                array = np.repeat(array[:, :, None], 3, axis=2)
            if not _is_image(array):
                raise PackError(f"{source} is a {array.dtype} array of shape {array.shape}, not an "
                                f"HxWx3 uint8 image like the first input of this pack")
            if self.shape is not None:
                array = fit_image(array, self.shape)
            array = np.ascontiguousarray(array.transpose(2, 0, 1))
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        if tuple(array.shape) != self.spec.sample_shape or array.dtype != np.dtype(self.spec.dtype):
            got = tuple(array.shape)
            want = self.spec.sample_shape
            if self.spec.layout == "CHW":
                got, want = got[1:], want[1:]
            hint = ""
            if self.spec.layout == "CHW":
                hint = " pass size=(H, W) to resize images to one size"
            raise PackError(
                f"array storage needs one shape and dtype for all samples: {source} is "
                f"{array.dtype} {got}, the pack holds {self.spec.dtype} {want};{hint}"
            )
        return np.ascontiguousarray(array)

    def _rewritten(self, data: bytes, source: str) -> bytes:
        """With ``transcode``, the image rewritten losslessly for crops (fastpipe.pack._transcode);
        anything else as it is."""
        if not self.transcode:
            return data
        from fastpipe.pack._transcode import transcoded

        return transcoded(data, source)

    def _encoded(self, data: bytes, source: str) -> bytes:
        if self.max_side is None:
            if self.check:
                _decode(data, source)
            return data
        from PIL import Image

        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                fmt = image.format
                short = min(width, height)
                if short <= self.max_side:
                    if self.check:
                        image.load()
                    return data  # already small enough: keep the original bytes, bit for bit
                scale = self.max_side / short
                size = (max(1, round(width * scale)), max(1, round(height * scale)))
                if fmt == "JPEG":
                    image.draft("RGB", size)  # decode at a reduced DCT scale when it is >= size
                rgb = image.convert("RGB")
                resized = rgb.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Image.UnidentifiedImageError as exc:
            # Pillow names the buffer it read (<_io.BytesIO object at 0x...>), not the file.
            raise SkipInput(f"corrupt image: cannot decode {source}: not a format Pillow "
                            "recognises") from exc
        except Exception as exc:  # noqa: BLE001 - PIL raises many types for bad data
            raise SkipInput(f"corrupt image: cannot decode {source}: {exc}") from exc
        out = io.BytesIO()
        if fmt == "JPEG":
            resized.save(out, format="JPEG", quality=self.quality)
        else:
            resized.save(out, format="PNG")
        return out.getvalue()

    def _encode_array(self, array: np.ndarray, source: str) -> bytes:
        from PIL import Image

        image = Image.fromarray(array)
        if self.max_side is not None and min(image.size) > self.max_side:
            scale = self.max_side / min(image.size)
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BICUBIC)
        out = io.BytesIO()
        image.save(out, format="PNG")  # lossless: what the dataset returned is what comes back
        return out.getvalue()


def probe_spec(listing: Listing, storage: str, start: int, stop: int, shape: tuple[int, int] | None,
               attempts: int = 64) -> Spec:
    """The sample spec of a pack. Array storage looks at the first readable input of the range."""
    if storage == "bytes":
        return Spec("bytes", "encoded")
    if shape is not None and listing.kind != "dataset":
        return Spec("array", "CHW", (3, *shape), "uint8")
    reasons = []
    for index in range(start, min(stop, start + attempts)):
        name = source_name(listing, index)
        try:
            value, _ = load_input(listing, index)
            value = _as_array(value)
            if isinstance(value, bytes):
                value = _decode(value, name)
        except SkipInput as exc:
            reasons.append(f"{name}: {exc}")
            continue
        array = np.asarray(value)
        if array.dtype == np.uint8 and array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        if _is_image(array):
            h, w = shape if shape is not None else array.shape[:2]
            return Spec("array", "CHW", (3, int(h), int(w)), "uint8")
        if shape is not None:
            raise PackError(f"size=(H, W) resizes images, but {name} is a {array.dtype} array of "
                            f"shape {array.shape}; pack arrays without size")
        if array.dtype.hasobject:
            raise PackError(f"{name} is an object array; array storage holds plain numeric arrays")
        return Spec("array", "raw", tuple(int(s) for s in array.shape), array.dtype.name)
    if start == stop:
        return Spec("array", "CHW", (3, *(shape or (0, 0))), "uint8")
    raise PackError(f"array storage needs one readable input to learn the sample shape; the first "
                    f"{len(reasons)} inputs failed: {'; '.join(reasons[:3])}")

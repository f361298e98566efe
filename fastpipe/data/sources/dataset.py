"""A map-style dataset as a source: a Hugging Face dataset, or any object with ``__len__`` and
``__getitem__`` returning records (a dict of fields, a tuple other than ``(image, int label)``)
or ``(image, label)`` pairs.

The fields are declared (``fields=``: some or all of them, or the names of a tuple's values) or
taken from the first readable sample (:func:`fastpipe.data.format.fields.infer_field`), and every
record is encoded to its fields' stored form, so that a sample that does not fit is an error
naming it and the field, never a cast. A Hugging Face dataset's ``ClassLabel`` names are its
label fields' classes; an image column cast to ``Image(decode=False)`` gives the stored bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fastpipe.data.format import fields as F
from fastpipe.data.sources._base import Schema, Source

__all__ = ["DatasetSource", "as_record", "infer_schema", "is_record"]

# Samples tried for the first readable one, which gives the fields.
_PROBES = 16


def is_record(item: Any) -> bool:
    """Whether a dataset's sample is a record rather than an ``(image, int label)`` pair."""
    if isinstance(item, Mapping):
        return True
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        return isinstance(item, (tuple, list))
    label = item[1]
    if isinstance(label, (bool, np.bool_)):
        return True
    if isinstance(label, (int, np.integer)):
        return False
    shape = getattr(label, "shape", None)
    return not (shape == () and getattr(label, "dtype", None) is not None
                and np.dtype(str(label.dtype).replace("torch.", "")).kind in "iu")


def as_record(item: Any, names: Sequence[str] | None, where: str) -> dict[str, Any]:
    """A sample as a dict of fields: a dict as it is, a tuple named by ``names`` (or "0",
    "1", ...)."""
    if isinstance(item, Mapping):
        bad = [k for k in item if not isinstance(k, str)]
        if bad:
            raise ValueError(f"{where} has the key {bad[0]!r}; field names are strings")
        return dict(item)
    if isinstance(item, (tuple, list)):
        keys = list(names) if names is not None else [str(k) for k in range(len(item))]
        if len(keys) != len(item):
            raise ValueError(f"{where} has {len(item)} values but fields names {len(keys)}: "
                             f"{keys}")
        return dict(zip(keys, item, strict=True))
    raise ValueError(f"{where} is a {type(item).__name__}; a record is a dict or a tuple of "
                     "fields")


def infer_schema(first: Any, declared: Mapping[str, Any] | Sequence[str] | None,
                 where: str) -> Schema:
    """The schema of records from a first sample and what the user declared (a dict of fields,
    some or all; or the names of a tuple's values)."""
    names = list(declared) if isinstance(declared, Sequence) and not isinstance(
        declared, (str, Mapping)) else None
    record = as_record(first, names, where)
    given = dict(declared) if isinstance(declared, Mapping) else {}
    if unknown := [n for n in given if n not in record]:
        raise ValueError(f"fields declares {unknown}, which {where} does not have (it has "
                         f"{list(record)})")
    fields: dict[str, Any] = {}
    for name, value in record.items():
        field = given.get(name)
        if field is not None and not isinstance(field, F.Field):
            raise ValueError(f"fields[{name!r}] is {field!r}; declare a field with ImageField(), "
                             "ArrayField(dtype, shape), IntField(), FloatField(), BytesField() "
                             "or StrField()")
        fields[name] = field or F.infer_field(value, f"field {name!r} of {where}")
    return Schema(fields, "tuple" if isinstance(first, (tuple, list)) else "dict")


class DatasetSource(Source):
    """The samples of a map-style dataset, encoded to their fields.

    ``fields``: declared fields (name -> field) or a tuple's names. ``raw=True`` keeps an
    ``(image, label)`` pair's image as the dataset gives it (a PIL image, an array, a tensor,
    bytes) and the schema's image field is the first sample's: what ``fastpipe.pack`` packs from
    (it encodes or resizes such images itself, as its options ask).
    """

    def __init__(self, dataset: Any, fields: Mapping[str, Any] | Sequence[str] | None = None,
                 *, raw: bool = False) -> None:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"a dataset source needs __len__ and __getitem__, got "
                            f"{type(dataset).__name__}")
        self.dataset = dataset
        self.count = len(dataset)
        self.where = f"{type(dataset).__name__} ({self.count} samples)"
        self.raw = raw
        self.meta = {}
        first, index = self._first()
        where = f"dataset[{index}]"
        if fields is None and not is_record(first):
            image, label = first
            try:
                image_field = F.infer_field(image, f"the image of {where}")
            except F.FieldError:
                if not raw:
                    raise
                image_field = F.BytesField()  # the dataset's own value, for the packer
            self.pair = True
            schema = Schema({"image": image_field, "label": F.IntField("int64")}, "pair")
        else:
            self.pair = False
            schema = infer_schema(first, fields, where)
        self.schema = Schema(schema.fields, schema.record, _classes(dataset, schema))

    def _first(self) -> tuple[Any, int]:
        reasons = []
        for index in range(min(self.count, _PROBES)):
            try:
                return self.dataset[index], index
            except (KeyboardInterrupt, SystemExit, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - a user dataset may raise anything
                reasons.append(f"dataset[{index}]: {type(exc).__name__}: {exc}")
        if not self.count:
            raise ValueError(f"{self.where} has no samples")
        raise ValueError(f"no sample of the dataset could be read to learn its fields: "
                         f"{'; '.join(reasons[:3])}")

    def _read(self, index: int, names: Sequence[str]) -> dict[str, Any]:
        item = self.dataset[index]
        where = f"dataset[{index}]"
        if self.pair:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"{where} returned {type(item).__name__}; the dataset's first "
                                 "sample was an (image, label) pair")
            image, label = item
            try:
                label = int(label)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where} has label {label!r}; labels must be integers") from exc
            record = {"image": image, "label": label}
        else:
            record = as_record(item, self.schema.names if self.schema.record == "tuple" else None,
                               where)
            if set(record) != set(self.schema.fields):
                missing = [n for n in self.schema.fields if n not in record]
                extra = [n for n in record if n not in self.schema.fields]
                raise ValueError(f"{where} has other fields than the first sample: missing "
                                 f"{missing}, extra {extra}")
        out = {}
        for name in names:
            field = self.schema.fields[name]
            if self.raw and self.pair and name == "image":
                out[name] = record[name]
                continue
            try:
                out[name] = field.encode(record[name], f"field {name!r} of {where}")
            except F.FieldError as exc:
                raise ValueError(str(exc)) from exc
        return out

    def describe(self, index: int) -> str:
        describe = getattr(self.dataset, "describe", None)
        if callable(describe):  # fastpipe's datasets name a sample's origin (shard:key, file[i])
            return str(describe(index))
        return f"{type(self.dataset).__name__}[{index}]"

    def labels(self) -> np.ndarray | None:
        targets = getattr(self.dataset, "targets", None)
        if targets is not None and "label" in self.schema.fields:
            return np.asarray(targets, np.int64)
        return None

    def fingerprint(self) -> str:
        fingerprint = getattr(self.dataset, "fingerprint", None)
        if callable(fingerprint):
            return str(fingerprint())
        kind = type(self.dataset)
        key = f"dataset\0{kind.__module__}.{kind.__name__}\0{self.count}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]


def _classes(dataset: Any, schema: Schema) -> dict[str, list[str]]:
    """Class names per int field: a Hugging Face dataset's ``ClassLabel`` names, or the
    dataset's ``classes`` for its ``label`` field."""
    out: dict[str, list[str]] = {}
    features = getattr(dataset, "features", None)
    if isinstance(features, Mapping):
        for name, feature in features.items():
            if name in schema.fields and type(feature).__name__ == "ClassLabel":
                out[name] = [str(n) for n in feature.names]
    classes = getattr(dataset, "classes", None)
    if "label" in schema.fields and "label" not in out and classes:
        out["label"] = [str(c) for c in classes]
    return out

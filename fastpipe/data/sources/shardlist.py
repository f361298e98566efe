"""A shard list: a dataset's tar shards and the samples each holds, in one JSON file.

The format is webdataset's (``wids``): ``{"__kind__": "wids-shard-index-v1", "wids_version": 1,
"shardlist": [{"url": "shard-000000.tar", "nsamples": 1000, "filesize": 81920000}, ...]}``, as
``widsindex create`` and :func:`~fastpipe.data.write_shard_list` write it. A shard's ``url`` is
taken as given where it is a URL or an absolute path, else as a name in the folder of
``base_path`` (when the file gives one) or of the list itself: the list sits beside its shards.

With a list, :class:`~fastpipe.data.TarDataset` knows its length and where each shard's samples
start without reading the shards: a shard is indexed when it is first read (a remote one when it
is downloaded to be read) instead of every shard when the dataset is built, and a shard that no
longer holds the samples the list says is refused then, naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastpipe.data.format.layout import PackFormatError
from fastpipe.data.remote.options import RemoteOptions
from fastpipe.data.remote.urls import is_url, join, local_path_of, parent, redact

__all__ = ["KIND", "ShardList", "is_shard_list", "read_shard_list"]

KIND = "wids-shard-index-v1"
# A list is read whole; one of a million shards is about 100 MB.
_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardList:
    """A shard list as read: ``shards`` (URLs or local paths, resolved), ``counts`` (samples per
    shard) and ``sizes`` (bytes per shard, None where the list does not say)."""

    where: str  # the list's path or URL, as messages name it
    shards: list[str]
    counts: np.ndarray
    sizes: list[int | None]


def is_shard_list(value: Any) -> bool:
    """Whether ``value`` names a shard list: a path or URL ending in ``.json``."""
    return isinstance(value, (str, os.PathLike)) and os.fspath(value).lower().endswith(".json")


def read_shard_list(spec: str | os.PathLike, options: RemoteOptions | None = None) -> ShardList:
    """The list at ``spec`` (a local path or a URL, read through ``options``), checked: every
    entry a ``url`` and a non-negative integer ``nsamples``."""
    text = os.fspath(spec)
    shown = redact(text)
    if is_url(text):
        from fastpipe.data.remote.filesystems import head

        raw = head(text, _MAX_BYTES + 1, RemoteOptions.of(options))
        folder = parent(text)
    else:
        path = Path(local_path_of(text))
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
        folder = str(path.resolve().parent)
    if len(raw) > _MAX_BYTES:
        raise PackFormatError(f"{shown} is over {_MAX_BYTES >> 20} MiB: not a shard list")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackFormatError(f"{shown} is not JSON ({exc}); a shard list is webdataset's "
                              "JSON shard index (write one with write_shard_list)") from exc
    entries = doc.get("shardlist") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PackFormatError(f"{shown} has no 'shardlist' of shards: not a shard list (the "
                              "JSON of webdataset's widsindex, or of write_shard_list)")
    base = doc.get("base_path")
    if base is not None:
        if not isinstance(base, str):
            raise PackFormatError(f"{shown}: base_path is {base!r}, not a path or URL")
        folder = _join(folder, base)
    shards, counts, sizes = [], [], []
    for k, entry in enumerate(entries):
        url = entry.get("url") if isinstance(entry, dict) else None
        count = entry.get("nsamples") if isinstance(entry, dict) else None
        size = entry.get("filesize") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url or type(count) is not int or count < 0 or (
                size is not None and (type(size) is not int or size < 0)):
            raise PackFormatError(
                f"{shown}: shard {k} is {str(entry)[:200]}; each needs a 'url' and an "
                "'nsamples' (a non-negative integer), and a 'filesize' is an integer too")
        shards.append(_join(folder, url))
        counts.append(count)
        sizes.append(size)
    if is_url(text) and not all(is_url(s) for s in shards):
        raise PackFormatError(
            f"{shown} names local paths ({shards[[is_url(s) for s in shards].index(False)]}, "
            "...): a list read from object storage names its shards by URL or by file name; "
            "write it beside the shards (write_shard_list(folder, folder + '/shards.json'))")
    kinds = {is_url(s) for s in shards}
    if len(kinds) > 1:
        raise PackFormatError(f"{shown} lists both URLs and local paths; a list names shards "
                              "of one place")
    return ShardList(shown, shards, np.array(counts, np.int64), sizes)


def _join(folder: str, name: str) -> str:
    """``name`` as a shard of ``folder``: itself where it is a URL or an absolute path."""
    if is_url(name) or os.path.isabs(name):
        return name
    return join(folder, name) if is_url(folder) else os.path.join(folder, name)

"""Data where it lives: URLs (``s3://``, ``gs://``, ``http(s)://``, ``hf://``, any fsspec
protocol) read through a cache on the node's disk that every rank and worker of the node
shares (docs/object-storage.md).

One module per concept: ``urls`` (what a URL is, its secrets kept out of messages),
``options`` (``RemoteOptions``), ``filesystems`` (fsspec and its backends, imported on first
use), ``retry`` (which failures pass, the backoff, ``RemoteError``), ``download`` (one object
into a file), ``locks`` (flock, across threads and processes), ``cache`` (``ShardCache``),
``prefetch`` (downloads ahead of the reader), ``files`` (``RemoteFiles``: the objects a source
reads). The public names are exported by ``fastpipe.data``.
"""

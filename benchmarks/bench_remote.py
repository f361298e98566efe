"""Data in object storage: photo-like JPEGs served by one local S3-compatible server (moto's), read
through each library's own cache, half the size of the dataset, by fastpipe, MosaicML Streaming
and LitData.

Every row is a train pipeline to normalized float batches (RandomResizedCrop 224, flip, ImageNet
mean/std, float32) of 64 samples with 2 DataLoader workers, shuffled:

- fastpipe: WebDataset tar shards (``xxx.jpg`` + ``xxx.cls``) by URL, ``TarDataset(url,
  recipe=Recipe(size=224), remote=RemoteOptions(cache_limit=half))``, ``DataLoaderX`` with the
  shard-aware order (``window=2``) and ``fast_collate``, 2 worker threads or processes,
  ``DataPrefetcher(device="cpu")`` normalizing; the threads' row again with a cache that holds
  the whole dataset (its second epoch is the warm cache, to set against local files); and the
  same shards read as local files;
- MosaicML Streaming (its own venv, ``--streaming-python``): MDS shards written by its
  ``MDSWriter`` (the JPEG bytes, ``jpeg`` column), ``StreamingDataset(remote=s3://...,
  cache_limit=half, shuffle=True)``, torchvision's ``RandomResizedCrop``, ``RandomHorizontalFlip``,
  ``PILToTensor``, ``ToDtype``, ``Normalize``, ``DataLoader(num_workers=2)``;
- LitData (its own venv, ``--litdata-python``): the output of its ``optimize`` (each sample
  ``{"image": PIL JPEG, "label": int}``, chunks of about a tar shard's size; LitData decodes
  them with torchvision's ``decode_jpeg``),
  ``StreamingDataset(s3://..., max_cache_size=half, shuffle=True)``, the same torchvision
  transform, ``StreamingDataLoader(num_workers=2)``.

Streaming 0.13 pins numpy < 2.2, so each peer has a venv of its own, Streaming and LitData from
PyPI (``python3.11 -m venv /work/streaming-venv; /work/streaming-venv/bin/pip install
mosaicml-streaming==0.13.0 boto3``; ``... /work/litdata-venv ... litdata boto3 obstore``), and
every venv imports the same torch and torchvision as fastpipe's (a ``.pth`` naming a folder of
links to them: PyPI's torchvision does not load with another build of torch).

Each row runs in a fresh interpreter with an empty cache, in interleaved rounds (median,
min-max, ``_harness.run_rounds``; round r shuffles every loader with seed r); within it, two epochs:
the first with a cold cache, the second warm. Reported per epoch: samples/s, CPU ms per sample
(the process and its joined workers), and the bytes the server sent (counted by the server
process, around moto's application); the time from ``iter()`` to the first batch; and the setup
before it: the seconds to build the dataset and loader, and the bytes fetched meanwhile (a
remote ``TarDataset`` downloads every shard once per node to index it, where no index is cached
yet). The shards are written once per run.

    python -m benchmarks.bench_remote [--quick] [--images N] [--repeat R] [--markdown FILE]
        [--streaming-python /work/streaming-venv/bin/python]
        [--litdata-python /work/litdata-venv/bin/python] [--baseline CHECKOUT]

``--baseline`` measures the fastpipe rows again with another checkout's fastpipe, in the same
rounds, and prints each epoch's ratio.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

if not __package__:  # run as a file (python benchmarks/bench_remote.py): the repository's root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _harness  # noqa: E402

BATCH, WINDOW, PER_SHARD = 64, 2, 32
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ACCESS_KEY, SECRET_KEY = "fastpipe-bench", "fastpipe-bench-secret"
BUCKET = "bench"
STREAMING_ROW = "MosaicML Streaming, MDS, 2 workers"
LITDATA_ROW = "LitData, optimize output, 2 workers"
WHOLE_ROW = "fastpipe TarDataset s3, 2 threads, cache holds all"
LISTED_ROW = "fastpipe TarDataset s3 from a shard list, 2 threads"
ROWS = {
    "fastpipe TarDataset s3, 2 threads": "TarDataset(s3 URL, remote=...), DataLoaderX "
                                         "window=2, worker_method='thread'",
    "fastpipe TarDataset s3, 2 processes": "the same, worker_method='process'",
    LISTED_ROW: "the 2 threads' row built from a shard list (s3://.../shards.json): each shard "
                "indexed when first read, not all when the dataset is built",
    WHOLE_ROW: "the 2 threads' row with a cache that holds the dataset: epoch 2 reads the "
               "cache alone (the warm cache against local files)",
    STREAMING_ROW: "StreamingDataset(remote=s3 URL, cache_limit=half, shuffle=True) + "
                   "torchvision, DataLoader",
    LITDATA_ROW: "StreamingDataset(s3 URL, max_cache_size=half, shuffle=True) + torchvision, "
                 "StreamingDataLoader",
    "fastpipe TarDataset local files, 2 threads": "the same shards as local files (no cache)",
}
BYTES_PATH = "/__fastpipe_bench_bytes__"


def optional(name: str) -> bool:
    """The peers' rows: a failure there is a note in the table, not the end of the run."""
    return name in (STREAMING_ROW, LITDATA_ROW)


# ---------------------------------------------------------------- the server and its counter

def serve(port: int) -> None:
    """(A process of its own) moto's S3 server on ``port``, counting the bytes of the bodies it
    sends; ``GET BYTES_PATH`` answers the count so far."""
    import threading as threads

    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    moto = DomainDispatcherApplication(create_backend_app)
    counted, lock = [0], threads.Lock()

    def app(environ: dict, start_response: Any) -> Any:
        if environ.get("PATH_INFO") == BYTES_PATH:
            with lock:
                body = str(counted[0]).encode()
            start_response("200 OK", [("Content-Length", str(len(body)))])
            return [body]
        return counting(moto(environ, start_response))

    def counting(answer: Any) -> Any:
        try:
            for chunk in answer:
                with lock:
                    counted[0] += len(chunk)
                yield chunk
        finally:
            close = getattr(answer, "close", None)
            if callable(close):
                close()

    make_server("127.0.0.1", port, app, True, request_handler=MotoRequestHandler).serve_forever()


def bytes_served(endpoint: str) -> int:
    """What the server at ``endpoint`` has sent so far (bodies of its answers)."""
    with urllib.request.urlopen(endpoint + BYTES_PATH, timeout=10) as answer:
        return int(answer.read())


class Server:
    """moto's S3 server, counting what it sends (:func:`serve`), in a process of its own."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_remote", "serve", str(self.port)],
            cwd=_harness.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        _wait_for(self.port)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def upload(self, folder: Path, prefix: str) -> int:
        """Every file under ``folder`` into the bucket under ``prefix``; their total bytes."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        try:
            client.create_bucket(Bucket=BUCKET)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        total = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.put_object(Bucket=BUCKET, Key=prefix + path.relative_to(folder).as_posix(),
                              Body=path.read_bytes())
            total += path.stat().st_size
        return total

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# ---------------------------------------------------------------- the data, in three formats

def write_shards(root: Path, folder: Path) -> list[tuple[Path, int]]:
    """The photo set's JPEGs as WebDataset shards; returns (file, label) in shard order."""
    files = sorted(root.rglob("*.jpg"))
    classes = sorted({p.parent.name for p in files})
    labelled = [(p, classes.index(p.parent.name)) for p in files]
    folder.mkdir(parents=True)
    for start in range(0, len(labelled), PER_SHARD):
        with tarfile.open(folder / f"{start // PER_SHARD:06d}.tar", "w") as tar:
            for k, (path, label) in enumerate(labelled[start:start + PER_SHARD], start):
                for name, data in ((f"{k:07d}.jpg", path.read_bytes()),
                                   (f"{k:07d}.cls", b"%d" % label)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return labelled


def write_mds(listing: str, out: str, shard_bytes: int) -> None:
    """(Streaming's venv) MDS shards of the listed JPEGs, by Streaming's own writer."""
    from streaming import MDSWriter

    rows = json.loads(Path(listing).read_text())
    with MDSWriter(out=out, columns={"image": "jpeg", "label": "int"},
                   size_limit=shard_bytes) as writer:
        from PIL import Image

        for path, label in rows:
            writer.write({"image": Image.open(path), "label": label})


def _litdata_sample(row: list) -> dict:
    from PIL import Image

    return {"image": Image.open(row[0]), "label": row[1]}


def write_litdata(listing: str, out: str, shard_bytes: int) -> None:
    """(LitData's venv) LitData's ``optimize`` output of the listed JPEGs."""
    import litdata

    rows = json.loads(Path(listing).read_text())
    litdata.optimize(fn=_litdata_sample, inputs=rows, output_dir=out, chunk_bytes=shard_bytes,
                     num_workers=1, verbose=False)


# ---------------------------------------------------------------- in the measuring process

def _transform():
    import torch
    from torchvision.transforms import v2

    return v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip(),
                       v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                       v2.Normalize(MEAN, STD)])


def _seed(cfg: Any) -> int:
    """The round's number: every loader's shuffle seed in this round (and fastpipe's augmentation
    seed). Where indexing the shards leaves about half of them in fastpipe's cache, the shards an
    epoch starts with largely decide what it fetches, and one seed is one draw of them."""
    return int(getattr(cfg, "round", 0))


def _streaming(cfg: Any, cache: str) -> Any:
    import torch
    from streaming import StreamingDataset

    os.environ.update(S3_ENDPOINT_URL=cfg.endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY,
                      AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1")
    transform = _transform()

    class Train(StreamingDataset):
        def __getitem__(self, index: int) -> tuple:
            sample = super().__getitem__(index)
            return transform(sample["image"].convert("RGB")), sample["label"]

    # Its shuffle block (samples shuffled together) set to fastpipe's window: 2 shards' worth.
    dataset = Train(remote=f"s3://{BUCKET}/mds/", local=cache, shuffle=True,
                    batch_size=BATCH, cache_limit=cfg.cache_limits["mds"],
                    shuffle_block_size=WINDOW * PER_SHARD, shuffle_seed=_seed(cfg))
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=2)


def _allow_http_in_obstore() -> None:
    """obstore (LitData's downloads) refuses a plain-http endpoint, as the loopback server is,
    unless its store is built with ``allow_http``; LitData builds it without. The forked
    DataLoader workers inherit this."""
    try:
        import obstore.store as stores
    except ImportError:
        return  # LitData downloads through boto3 then
    original = stores.S3Store

    def store(bucket: str, config: Any = None, **kwargs: Any) -> Any:
        return original(bucket, config={**(config or {}), "allow_http": True}, **kwargs)

    stores.S3Store = store


def _litdata(cfg: Any, cache: str) -> Any:
    import litdata

    transform = _transform()

    class Train(litdata.StreamingDataset):
        def __getitem__(self, index: Any) -> tuple:
            sample = super().__getitem__(index)
            image = sample["image"]  # LitData decodes JPEGs with torchvision where it can
            if hasattr(image, "convert"):
                image = image.convert("RGB")
            elif image.shape[0] == 1:
                image = image.expand(3, -1, -1)
            return transform(image), sample["label"]

    _allow_http_in_obstore()
    storage = {"endpoint_url": cfg.endpoint, "aws_access_key_id": ACCESS_KEY,
               "aws_secret_access_key": SECRET_KEY, "region_name": "us-east-1"}
    dataset = Train(f"s3://{BUCKET}/litdata/", cache_dir=cache, shuffle=True,
                    max_cache_size=cfg.cache_limits["litdata"], storage_options=storage,
                    seed=_seed(cfg))
    return litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=2)


def _fastpipe(name: str, cfg: Any, cache: str) -> Any:
    import fastpipe
    from fastpipe import DataLoaderX, DataPrefetcher
    from fastpipe.data import RemoteOptions, TarDataset, fast_collate

    recipe, seed = fastpipe.Recipe(train=True, size=224), _seed(cfg)
    if "local" in name:
        dataset = TarDataset(cfg.shards, fields=["jpg", "cls"], recipe=recipe, seed=seed)
    else:
        storage = {"key": ACCESS_KEY, "secret": SECRET_KEY,
                   "client_kwargs": {"endpoint_url": cfg.endpoint, "region_name": "us-east-1"}}
        limit = cfg.sizes["tar"] * 2 if name == WHOLE_ROW else cfg.cache_limits["tar"]
        options = RemoteOptions(storage_options=storage, cache_dir=cache, cache_limit=limit)
        url = f"s3://{BUCKET}/tar/" + ("shards.json" if name == LISTED_ROW else "")
        dataset = TarDataset(url, fields=["jpg", "cls"], recipe=recipe, seed=seed, remote=options)
    loader = DataLoaderX(dataset, batch_size=BATCH, shuffle=True, seed=seed, window=WINDOW,
                         num_workers=2, collate_fn=fast_collate,
                         worker_method="thread" if "threads" in name else "process")
    return DataPrefetcher(loader, device="cpu", mean=MEAN, std=STD)


def measure(name: str, cfg: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fastpipe-bench-remote-cache-") as cache:
        sent, start = bytes_served(cfg.endpoint), time.perf_counter()
        if name == STREAMING_ROW:
            loader = _streaming(cfg, cache)
        elif name == LITDATA_ROW:
            loader = _litdata(cfg, cache)
        else:
            loader = _fastpipe(name, cfg, cache)
        out: dict[str, Any] = {"setup_s": time.perf_counter() - start,
                               "setup_bytes": bytes_served(cfg.endpoint) - sent}
        for epoch in (1, 2):
            sent = bytes_served(cfg.endpoint)
            cpu, start = _harness.cpu_seconds(), time.perf_counter()
            samples, first = 0, None
            for images, _ in loader:
                if first is None:
                    first = time.perf_counter() - start
                    if images.dtype.is_floating_point is False or images.shape[1:] != (
                            3, 224, 224):
                        raise RuntimeError(f"{name}: batches of {images.dtype} "
                                           f"{tuple(images.shape)}, not float (N, 3, 224, 224)")
                samples += images.shape[0]
            seconds = time.perf_counter() - start
            suffix = "" if epoch == 1 else "2"
            out[f"rate{suffix}"] = samples / seconds
            out[f"cpu_ms{suffix}"] = (_harness.cpu_seconds() - cpu) / samples * 1e3
            out[f"first_s{suffix}"] = first
            out[f"bytes{suffix}"] = bytes_served(cfg.endpoint) - sent
            out[f"samples{suffix}"] = samples
        return out


# ---------------------------------------------------------------- the parent

def prepare(work: Path, images: int, server: Server, pythons: dict[str, str | None]) -> dict:
    from benchmarks._photos import photo_set

    root = photo_set("imagenet", images, num_classes=10)
    labelled = write_shards(root, work / "tar")
    listing = work / "listing.json"
    listing.write_text(json.dumps([[str(p), label] for p, label in labelled]))
    shard_bytes = int(statistics.median(p.stat().st_size for p in (work / "tar").glob("*.tar")))
    sizes = {"tar": server.upload(work / "tar", "tar/")}
    from fastpipe.data import write_shard_list

    # The list names the shards by file name (written beside them), uploaded beside them alone.
    (work / "list").mkdir()
    os.replace(write_shard_list(work / "tar", work / "tar" / "shards.json"),
               work / "list" / "shards.json")
    server.upload(work / "list", "tar/")
    for kind, module_function in (("mds", "write-mds"), ("litdata", "write-litdata")):
        python = pythons.get(kind)
        if python is None:
            continue
        subprocess.run([python, "-m", "benchmarks.bench_remote", module_function,
                        str(listing), str(work / kind), str(shard_bytes)], check=True,
                       cwd=_harness.REPO)
        sizes[kind] = server.upload(work / kind, f"{kind}/")
    return {"sizes": sizes, "cache_limits": {k: v // 2 for k, v in sizes.items()},
            "shards": str(work / "tar"), "endpoint": server.endpoint, "images": len(labelled)}


def _median(runs: _harness.Runs, name: str, key: str) -> tuple[float, float, float] | None:
    values = [r[key] for r in runs.current.get(name, []) if key in r and r[key] is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def table(names: list[str], runs: _harness.Runs, config: dict) -> list[str]:
    lines = ["| loader | setup s (MB fetched) | epoch 1 (cold) samples/s | epoch 2 (warm) "
             "samples/s | CPU ms/sample 1st / 2nd | first batch s | MB fetched 1st / 2nd "
             "(dataset MB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        rate = _median(runs, name, "rate")
        if rate is None:
            lines.append(f"| {name} | {runs.note(name) or 'not run'} | | | | | |")
            continue
        setup, setup_bytes = _median(runs, name, "setup_s"), _median(runs, name, "setup_bytes")
        rate2 = _median(runs, name, "rate2")
        cpu, cpu2 = _median(runs, name, "cpu_ms"), _median(runs, name, "cpu_ms2")
        first = _median(runs, name, "first_s")
        sent, sent2 = _median(runs, name, "bytes"), _median(runs, name, "bytes2")
        kind = "mds" if name == STREAMING_ROW else "litdata" if name == LITDATA_ROW else "tar"
        size = config["sizes"].get(kind, 0) / 1e6
        lines.append(
            f"| {name} | {setup[0]:.2f} ({setup_bytes[0] / 1e6:.0f}) | "
            f"{rate[0]:.0f} ({rate[1]:.0f}-{rate[2]:.0f}) | {rate2[0]:.0f} "
            f"({rate2[1]:.0f}-{rate2[2]:.0f}) | {cpu[0]:.2f} / {cpu2[0]:.2f} | {first[0]:.2f} | "
            f"{sent[0] / 1e6:.0f} / {sent2[0] / 1e6:.0f} ({size:.0f}) |")
    return lines


def _ours(name: str) -> bool:
    """Whether row ``name`` is fastpipe's (measured again with a baseline checkout)."""
    return name.startswith("fastpipe")


def _second_epoch(runs: _harness.Runs) -> _harness.Runs:
    """The runs with each record's second epoch as its rate (none where it has no second)."""
    def second(side: dict[str, list[dict]]) -> dict[str, list[dict]]:
        return {name: [{**r, "rate": r["rate2"]} if "rate2" in r
                       else {k: v for k, v in r.items() if k != "rate"} for r in records]
                for name, records in side.items()}

    return _harness.Runs(second(runs.current), second(runs.baseline), runs.records)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve(int(argv[1]))
        return 0
    if argv[:1] == ["write-mds"]:
        write_mds(argv[1], argv[2], int(argv[3]))
        return 0
    if argv[:1] == ["write-litdata"]:
        write_litdata(argv[1], argv[2], int(argv[3]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_remote",
                                     description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--images", type=int, default=1024,
                        help="photo-like JPEGs in the dataset (default 1024)")
    parser.add_argument("--streaming-python", default=None,
                        help="MosaicML Streaming's interpreter (a venv of its own)")
    parser.add_argument("--litdata-python", default=None,
                        help="LitData's interpreter (a venv of its own)")
    _harness.add_arguments(parser, repeat=3)
    args = parser.parse_args(argv)
    _harness.check_baseline(parser, args.baseline)
    if args.quick:
        args.images = 512  # 16 shards: Streaming wants a cache of 4 shards at least
    rounds = _harness.rounds_of(args, 3)
    names = _harness.select(list(ROWS), args.only)
    pythons = {"mds": args.streaming_python if STREAMING_ROW in names else None,
               "litdata": args.litdata_python if LITDATA_ROW in names else None}
    server = Server()
    work = Path(tempfile.mkdtemp(prefix="fastpipe-bench-remote-"))
    try:
        config = prepare(work, args.images, server, pythons)

        def python(name: str) -> str:
            kind = "mds" if name == STREAMING_ROW else "litdata" if name == LITDATA_ROW else None
            if kind is None:
                return sys.executable
            if pythons[kind] is None:
                flag = "--streaming-python" if kind == "mds" else "--litdata-python"
                raise _harness.Skip(f"no {flag} (a venv of its own: see the module's docstring)")
            return pythons[kind]

        runs = _harness.run_rounds("bench_remote", names, config, rounds, unit="samples/s",
                                   python=python, baseline=args.baseline, twin=_ours)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"{config['images']} photo-like JPEGs (ImageNet sizes), served by moto's S3 server "
             f"on the loopback; caches of half the dataset (but the row whose cache holds all); "
             f"batch {BATCH}, 2 workers, RRC 224 + "
             f"flip to normalized float32; {rounds} interleaved rounds (median, min-max), each "
             f"row in a fresh process with an empty cache, round r shuffling with seed r (every "
             f"loader). Machine: {_harness.machine()}.", "",
             *table(names, runs, config)]
    if args.baseline is not None:
        ours = [n for n in names if _ours(n)]
        lines += ["", "The fastpipe rows against the fastpipe of "
                  f"{_harness.describe_checkout(args.baseline.resolve())}, the first epoch:", "",
                  *_harness.before_after(ours, runs, unit="samples/s"), "",
                  "The second epoch:", "",
                  *_harness.before_after(ours, _second_epoch(runs), unit="samples/s")]
    print("\n".join(lines))
    if args.markdown:
        args.markdown.write_text("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(json.dumps(runs.records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

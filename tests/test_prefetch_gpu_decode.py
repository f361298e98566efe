"""GPU decode on the CPU lane: DataPrefetcher decoding a dataset built with decode="gpu" through
the recording stand-in of the decoder library (tests/helpers/gpu_decode.py).

What is proven here, without a GPU: workers (the main process, threads, processes: pickled,
shared memory) hand over each sample's bytes with the CPU path's draw (the seed of (seed, epoch,
index), the box, the resize, the flip); the decode runs once per batch, on the side stream,
before the batch's event, with its buffers reused; the pixels are the CPU path's bit for bit
when the decode is the same libjpeg-turbo at full size (so every crop box and flip is the CPU
path's), for every source kind; images the decoder refuses are decoded on the CPU, counted and
reported; corrupt ones raise or are skipped as on_error says; resume replays the same batches;
the buffer cap and close(); the errors of a machine without a GPU decoder. The same checks on a
GPU, against nvImageCodec, are tests/cuda/test_gpu_decode.py.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastpipe.prefetch as prefetch_module
from fastpipe import DataLoaderX, DataPrefetcher, Recipe
from fastpipe.data import ImageDecoder, ImageFolder, fast_collate
from fastpipe.data.collate.encoded import EncodedBatch
from fastpipe.data.datasets._records import RecordDataset
from fastpipe.data.decode.budget import CorruptImageError
from fastpipe.data.decode.gpu import PLAN_FIELDS
from fastpipe.data.samples import sample_images
from fastpipe.data.sampling.seeds import reseeded, sample_seed
from fastpipe.data.sources.folder import ListSource
from fastpipe.gpu_decode import GpuDecode, GpuDecodeUnavailable, _backends, available_backends
from tests.helpers.cuda import RecordingStreams
from tests.helpers.gpu_decode import RecordingDecoder, use_stand_in

SIZE = 40
INF = float("inf")


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory) -> Path:
    """18 photo-like JPEGs in 3 classes, 3 PNGs (one with alpha) and a CMYK JPEG."""
    root = sample_images(tmp_path_factory.mktemp("gpu_decode") / "images", num_images=18,
                         num_classes=3)
    rng = np.random.default_rng(7)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    for k, (height, width) in enumerate([(90, 130), (150, 70), (64, 64)]):
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).convert("RGBA" if k == 1 else "RGB")
        image.save(root / classes[k] / f"z{k}.png")
    Image.fromarray(rng.integers(0, 256, (80, 100, 3), dtype=np.uint8)).convert("CMYK").save(
        root / classes[0] / "zz_cmyk.jpg", quality=90)
    return root


def _loader(dataset, **kwargs) -> DataLoaderX:
    kwargs.setdefault("batch_size", 5)
    return DataLoaderX(dataset, collate_fn=fast_collate, **kwargs)


def _pair(root: Path, train: bool, **kwargs):
    """The CPU path's dataset and the GPU decode's over the same folder and seed, both decoding
    at full size (reducing_gap=inf: what a GPU decoder decodes)."""
    options = dict(train=train, size=SIZE, seed=11, reducing_gap=INF, **kwargs)
    return ImageFolder(root, **options), ImageFolder(root, **options, decode="gpu")


# ---------------------------------------------------------------- the hand-off from the workers


def _expected_plan(dataset, index: int, epoch: int) -> tuple[int, list[int]]:
    """The seed and the plan the CPU path draws for sample ``index`` of ``epoch``."""
    seed = sample_seed(dataset.seed, epoch, index)
    with Image.open(dataset.path(index)) as image:
        width, height = image.size
    plan = dataset.decoder._plan(height, width, generator=reseeded(seed))
    resize = plan.resize or (0, 0)
    return seed, [height, width, *plan.box, *resize, int(plan.flip)]


@pytest.mark.parametrize("mode", ["main", "thread", "process"])
def test_workers_hand_over_the_bytes_and_the_cpu_paths_draw(mixed_root, mode, no_thread_leak):
    _, dataset = _pair(mixed_root, train=True)
    workers = {"main": {"num_workers": 0},
               "thread": {"num_workers": 2, "worker_method": "thread"},
               "process": {"num_workers": 2, "worker_method": "process"}}[mode]
    loader = _loader(dataset, shuffle=True, seed=3, **workers)
    seen = []
    try:
        for epoch in range(2):
            for batch, labels in loader:
                assert isinstance(batch, EncodedBatch)
                if mode == "process":  # pickled from the worker through shared memory
                    assert batch.data.is_shared()
                for i, index in enumerate(batch.indices.tolist()):
                    seed, plan = _expected_plan(dataset, index, epoch)
                    assert int(batch.seeds[i]) == seed
                    assert batch.plans[i].tolist()[:9] == plan, (epoch, index)
                    assert bytes(batch.bytes_of(i)) == Path(dataset.path(index)).read_bytes()
                    assert int(labels[i]) == int(dataset.targets[index])
                    seen.append((epoch, index, tuple(batch.plans[i].tolist())))
    finally:
        loader.close()
    assert sorted(i for e, i, _ in seen if e == 0) == list(range(len(dataset)))
    assert [i for e, i, _ in seen if e == 0] != [i for e, i, _ in seen if e == 1]  # reshuffled


def test_the_routes_name_the_images_the_cpu_decoder_takes(mixed_root):
    _, dataset = _pair(mixed_root, train=True)
    route = PLAN_FIELDS.index("route")
    routes = {Path(dataset.path(i)).name: dataset[i][0].plan[route] for i in range(len(dataset))}
    assert routes["zz_cmyk.jpg"] == 1
    assert {name for name, r in routes.items() if r == 1} == {"zz_cmyk.jpg"}


# ----------------------------------------------------------- the same pixels as the CPU path


def _epochs(prefetcher, epochs: int = 1) -> list:
    out = []
    for _ in range(epochs):
        out += [tuple(t.clone() for t in batch) for batch in prefetcher]
    return out


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_gpu_decode_gives_the_cpu_paths_batches_bit_for_bit(mixed_root, monkeypatch, train,
                                                            interpolation, no_thread_leak):
    """With the decode of the CPU path (libjpeg-turbo at full size), every pixel is the CPU
    path's: the same crop box, resize and flip for every sample, every format."""
    stand_in = use_stand_in(monkeypatch)
    cpu, gpu = _pair(mixed_root, train=train, interpolation=interpolation)
    options = dict(device="cpu", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25))
    expected = _epochs(DataPrefetcher(_loader(cpu, shuffle=True, seed=2), **options), 2)
    got = _epochs(DataPrefetcher(_loader(gpu, shuffle=True, seed=2), **options), 2)
    assert len(got) == len(expected) == 10
    for (images, labels), (want, want_labels) in zip(got, expected):
        assert images.dtype == torch.float32
        assert torch.equal(images, want) and torch.equal(labels, want_labels)
    assert stand_in.asked[0]["fancy_upsampling"] is (not train)  # the CPU path's upsampling


def test_the_decode_runs_once_per_batch_on_the_side_stream_with_its_buffers_reused(
        mixed_root, monkeypatch):
    streams = RecordingStreams()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    stand_in = use_stand_in(monkeypatch, streams=streams, log=streams.log)
    _, gpu = _pair(mixed_root, train=True)
    prefetcher = DataPrefetcher(_loader(gpu, batch_size=6), device="cpu", mean=(0.5,) * 3,
                                std=(0.25,) * 3)
    for k, (_images, _labels) in enumerate(prefetcher):
        log = streams.log
        decodes = [i for i, e in enumerate(log) if e[0] == "decode"]
        assert len(decodes) >= k + 1
        entry = log[decodes[k]]
        assert entry[2] == "side1", "decoded on the side stream"
        assert entry[3] is (k > 0), "buffers passed back for reuse from the second batch on"
        # Batch k's decode is queued before the event the step waits on for batch k.
        event = log.index(("event", f"event{k + 1}", "side1"))
        assert decodes[k] < event
        assert [e for e in log[:event] if e[0] == "decode"][-1] is entry
    assert len(stand_in.opened) == 1 and len([e for e in streams.log if e[0] == "decode"]) == 4
    decoder = stand_in.opened[0]
    # A buffer per slot, grown (as nvImageCodec's images are) when a larger crop comes: fewer
    # buffers made than images decoded, and fewer still over a second epoch.
    first = decoder.allocations
    assert len(decoder.buffers) == 6 and first < decoder.images
    list(prefetcher)
    assert decoder.allocations - first < first
    # The decoded batch stands for a GPU tensor: normalized on the side stream and recorded on
    # the consumer's, never copied as a host tensor.
    copies = [e for e in streams.log if e[0] == "copy"]
    assert copies and all(e[1] is None or e[1] < 3 for e in copies), "only the labels copied"
    assert any(e[0] == "record" and e[2] == torch.float32 and e[3] == "default"
               for e in streams.log)


def test_the_decode_runs_in_a_thread_of_its_own_not_the_training_loops(mixed_root, monkeypatch,
                                                                      no_thread_leak):
    """nvImageCodec's decode call returns only once its batch is decoded: made in the training
    thread, it would hold each step back by the decode's time (and a loop that waits for each
    step, as GradScaler's does, would leave the GPU idle meanwhile)."""
    streams = RecordingStreams()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    use_stand_in(monkeypatch, streams=streams)
    threads = []
    decode = RecordingDecoder.decode

    def recording(self, requests, stream):
        threads.append(threading.current_thread())
        return decode(self, requests, stream)

    monkeypatch.setattr(RecordingDecoder, "decode", recording)
    _, gpu = _pair(mixed_root, train=True)
    batches = list(DataPrefetcher(_loader(gpu, batch_size=6), device="cpu"))
    assert len(batches) == 4 and len(threads) == 4
    assert threading.current_thread() not in threads, "decoded in the training thread"


def test_gpu_tensors_beside_the_encoded_images_are_read_after_the_training_streams_writes(
        mixed_root, monkeypatch):
    """A batch with GPU tensors beside its encoded images (a loader that moved its labels): the
    side stream waits for the stream current in the training loop (a thread's own), although
    another thread decodes."""
    streams = RecordingStreams()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    use_stand_in(monkeypatch, streams=streams)
    _, gpu = _pair(mixed_root, train=True)

    def batches():
        for encoded, labels in _loader(gpu, batch_size=6):
            labels = labels.clone()
            streams.mark_on_gpu(labels)
            yield encoded, labels

    with streams.use("user"):
        got = list(DataPrefetcher(batches(), device="cpu"))
    user_events = [e[1] for e in streams.log if e[0] == "event" and e[2] == "user"]
    side_waits = [e[2] for e in streams.log if e[0] == "wait" and e[1] == "side1"]
    assert len(got) == 4 and len(user_events) == 4 and side_waits == user_events


def test_images_the_decoder_refuses_are_decoded_on_the_cpu_counted_and_reported(
        mixed_root, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch, refuse=lambda data: data[:4] == b"\x89PNG")
    cpu, gpu = _pair(mixed_root, train=True)
    expected = _epochs(DataPrefetcher(_loader(cpu), device="cpu"))
    prefetcher = DataPrefetcher(_loader(gpu), device="cpu")
    with pytest.warns(RuntimeWarning, match=r"decoded \d+ image\(s\) on the CPU instead"):
        got = _epochs(prefetcher)
    for (images, labels), (want, want_labels) in zip(got, expected):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)
    stats = prefetcher.gpu_decode_stats
    assert stats["cpu"] == 4 and stats["gpu"] == len(gpu) - 4 and stats["batches"] == 5
    reasons = stats["fallback_reasons"]
    assert reasons["stand-in decoder did not decode it on the GPU"] == 3  # the PNGs
    assert sum(n for r, n in reasons.items() if "CMYK" in r) == 1
    with warnings.catch_warnings():  # reported once, not every epoch
        warnings.simplefilter("error")
        _epochs(prefetcher)
    assert prefetcher.gpu_decode_stats["cpu"] == 8


@pytest.fixture
def corrupt_root(tmp_path, mixed_root) -> Path:
    """The mixed folder with one JPEG cut short: its header reads, its scan does not."""
    root = tmp_path / "corrupt"
    shutil.copytree(mixed_root, root)
    victim = sorted(root.rglob("*.jpg"))[4]
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) // 3])
    return root


def _refuse_cut_jpegs(data: bytes) -> bool:
    return data[:2] == b"\xff\xd8" and not data.endswith(b"\xff\xd9")


def test_a_jpeg_both_decoders_refuse_raises_naming_it(corrupt_root, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch, refuse=_refuse_cut_jpegs)
    _, gpu = _pair(corrupt_root, train=True)
    with pytest.raises(CorruptImageError, match=r"does not decode: only the CPU path decodes "
                                                r"it as the CPU path does \(.*cut short.*\), and "
                                                r"the CPU decoder refuses it too"):
        _epochs(DataPrefetcher(_loader(gpu), device="cpu"))


def test_with_on_error_skip_the_corrupt_sample_leaves_its_batch_as_the_loader_would(
        corrupt_root, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch, refuse=_refuse_cut_jpegs)
    cpu, gpu = _pair(corrupt_root, train=True)
    expected = _epochs(DataPrefetcher(_loader(cpu, on_error="skip"), device="cpu"))
    prefetcher = DataPrefetcher(_loader(gpu, on_error="skip"), device="cpu")
    with pytest.warns(RuntimeWarning, match=r"DataPrefetcher\(on_error='skip'\) skipped 1 "
                                            r"corrupt sample"):
        got = _epochs(prefetcher)
    assert [len(labels) for _, labels in got] == [len(labels) for _, labels in expected]
    for (images, labels), (want, want_labels) in zip(got, expected):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)
    (entry,) = prefetcher.skipped
    assert entry["index"] == 4 and "CPU decoder refuses it too" in entry["reason"]
    assert prefetcher.state_dict()["gpu_decode_skipped"] == [entry]
    assert prefetcher.gpu_decode_stats["skipped"] == 1


def test_a_batch_of_nothing_but_corrupt_samples_is_passed_over(corrupt_root, monkeypatch):
    use_stand_in(monkeypatch, refuse=_refuse_cut_jpegs)
    _, gpu = _pair(corrupt_root, train=True)
    prefetcher = DataPrefetcher(_loader(gpu, batch_size=1, on_error="skip"), device="cpu")
    with pytest.warns(RuntimeWarning, match="skipped 1 corrupt"):
        got = _epochs(prefetcher)
    assert len(got) == len(gpu) - 1


def test_resume_replays_the_same_batches(mixed_root, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch)
    _, gpu = _pair(mixed_root, train=True)
    whole = _epochs(DataPrefetcher(_loader(gpu, shuffle=True, seed=9), device="cpu"))
    first = DataPrefetcher(_loader(gpu, shuffle=True, seed=9), device="cpu")
    epoch = iter(first)
    head = [tuple(t.clone() for t in next(epoch)) for _ in range(2)]
    state = first.state_dict()
    first.close()
    again = DataPrefetcher(_loader(gpu, shuffle=True, seed=9), device="cpu")
    again.load_state_dict(state)
    rest = _epochs(again)
    assert len(head) + len(rest) == len(whole)
    for (images, labels), (want, want_labels) in zip(head + rest, whole):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)


# ------------------------------------------------------------------ memory: the cap and close()


def test_buffers_past_the_cap_are_let_go_and_close_keeps_nothing(mixed_root, monkeypatch):
    stand_in = use_stand_in(monkeypatch)
    _, gpu = _pair(mixed_root, train=True)
    kept = DataPrefetcher(_loader(gpu), device="cpu")
    _epochs(kept, 2)
    assert kept.gpu_decode_stats["released"] == 0 and kept.gpu_decode_stats["kept_bytes"] > 0
    capped = DataPrefetcher(_loader(gpu), device="cpu", gpu_decode=GpuDecode(memory_cap=0))
    _epochs(capped)
    assert capped.gpu_decode_stats["released"] == 5 and capped.gpu_decode_stats["kept_bytes"] == 0
    for prefetcher, decoder in ((kept, stand_in.opened[0]), (capped, stand_in.opened[1])):
        prefetcher.close()
        assert decoder.closed and decoder.buffers == []
        assert prefetcher.gpu_decode_stats is None and prefetcher._decoders == {}


def test_the_options_reach_the_decoder_and_are_checked(mixed_root, monkeypatch):
    stand_in = use_stand_in(monkeypatch)
    _, gpu = _pair(mixed_root, train=False)
    _epochs(DataPrefetcher(_loader(gpu), device="cpu",
                           gpu_decode=GpuDecode(backend="torchvision", hardware=False)))
    assert stand_in.asked == [{"name": "torchvision", "device": torch.device("cpu"),
                               "hardware": False, "fancy_upsampling": True}]
    with pytest.raises(ValueError, match="backend"):
        GpuDecode(backend="dali")
    with pytest.raises(TypeError, match="GpuDecode"):
        DataPrefetcher([], device="cpu", gpu_decode={"backend": "auto"})


# ------------------------------------------------------------- every source kind hands over


def _sources(root: Path, tmp: Path) -> dict[str, tuple]:
    """Each source kind holding images and labels (the folder; a list file; HDF5 and LMDB packs
    of it, as (image, label) pairs and as records; tar shards of its JPEGs), as a (CPU
    dataset, GPU dataset) pair with the same decoder settings and seed."""
    from fastpipe.data import H5Dataset, TarDataset
    from fastpipe.pack import pack

    decoder = ImageDecoder(recipe=Recipe(train=True, size=SIZE), reducing_gap=INF)
    kinds = {"folder": lambda decode: ImageFolder(root, train=True, size=SIZE, seed=4,
                                                  reducing_gap=INF, decode=decode)}
    pytest.importorskip("h5py", exc_type=ImportError)
    pack(str(root), str(tmp / "images.h5"), num_workers=1, progress=False)
    kinds["hdf5"] = lambda decode: H5Dataset(tmp / "images.h5", decoder=decoder, seed=4,
                                             decode=decode)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted(p for p in root.rglob("*.jpg") if p.parent.name in classes)
    try:
        import lmdb  # noqa: F401
    except ImportError:
        pass
    else:
        from fastpipe.data import LMDBDataset

        pack(str(root), str(tmp / "images.lmdb"), num_workers=1, progress=False, format="lmdb")
        kinds["lmdb"] = lambda decode: LMDBDataset(tmp / "images.lmdb", decoder=decoder, seed=4,
                                                   decode=decode)
    shards = tmp / "shards"
    shards.mkdir()
    with tarfile.open(shards / "000000.tar", "w") as tar:
        for k, path in enumerate(files):
            for name, data in ((f"{k:05d}{path.suffix}", path.read_bytes()),
                               (f"{k:05d}.cls", b"%d" % classes.index(path.parent.name))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    kinds["tar"] = lambda decode: TarDataset(shards, decoder=decoder, seed=4, fields=["jpg", "cls"],
                                             decode=decode)
    from fastpipe.data.format.fields import ImageField, IntField, StrField

    records = [{"image": path.read_bytes(), "label": classes.index(path.parent.name),
                "name": path.name} for path in files]
    pack(records, str(tmp / "records.h5"), progress=False,
         fields={"image": ImageField(), "label": IntField(), "name": StrField()})
    kinds["records"] = lambda decode: H5Dataset(tmp / "records.h5", decoder=decoder, seed=4,
                                                decode=decode)
    listing = root.parent / "gpu_decode_list.txt"  # paths relative to the list file
    listing.write_text("".join(f"{path.relative_to(root.parent)} "
                               f"{classes.index(path.parent.name)}\n" for path in files))
    kinds["list"] = lambda decode: RecordDataset(ListSource(listing), decoder=decoder, seed=4,
                                                 decode=decode)
    return {kind: (make("cpu"), make("gpu")) for kind, make in kinds.items()}


def test_every_source_kind_hands_over_and_decodes_to_the_cpu_paths_pixels(
        mixed_root, tmp_path, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch)
    for kind, (cpu, gpu) in _sources(mixed_root, tmp_path).items():
        expected = fast_collate([cpu[i] for i in range(len(cpu))])
        encoded = fast_collate([gpu[i] for i in range(len(gpu))])
        got = next(iter(DataPrefetcher([encoded], device="cpu")))
        if isinstance(expected, dict):  # records: a dict of fields
            assert isinstance(encoded["image"], EncodedBatch), kind
            assert torch.equal(got["image"], expected["image"]), kind
            assert torch.equal(got["label"], expected["label"]), kind
            assert got["name"] == expected["name"], kind
        else:
            assert isinstance(encoded[0], EncodedBatch), kind
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), kind


# ------------------------------------------------------------------------------ refusals, errors


@pytest.mark.parametrize("kwargs, message", [
    ({"auto_augment": "ra"}, "decode='cpu'"),
    ({"transform": lambda image: image}, "transform= runs on decoded pixels"),
    ({"decode": "auto"}, "image_loader's"),
])
def test_datasets_refuse_what_gpu_decode_cannot_run(mixed_root, kwargs, message):
    kwargs = {"decode": "gpu", **kwargs}
    with pytest.raises(ValueError, match=message):
        ImageFolder(mixed_root, train=True, size=SIZE, **kwargs)


def test_a_decoder_of_ones_own_decodes_on_the_cpu(mixed_root):
    from fastpipe.data.sources.folder import FolderSource

    with pytest.raises(ValueError, match="needs recipe="):
        RecordDataset(FolderSource(mixed_root), decoder=lambda data, source: data, decode="gpu")


def test_without_a_gpu_the_decode_names_the_device_and_the_extra(mixed_root, monkeypatch,
                                                                no_thread_leak):
    _, gpu = _pair(mixed_root, train=True)
    with pytest.raises(GpuDecodeUnavailable, match="needs a CUDA device.*decode='cpu'"):
        _epochs(DataPrefetcher(_loader(gpu), device="cpu"))
    monkeypatch.setattr(_backends, "_installed", lambda module: False)
    with pytest.raises(GpuDecodeUnavailable, match=r"nvimgcodec: not installed: pip install "
                                                   r"'fastpipe\[gpu-decode\]'.*torchvision"):
        _backends.open_backend("auto", torch.device("cuda"), hardware=True,
                               fancy_upsampling=False)
    assert available_backends()["nvimgcodec"].startswith("not installed")


def test_here_no_gpu_decoder_can_run_and_says_why():
    problems = available_backends()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    assert all(problem is not None for problem in problems.values())
    with pytest.raises(GpuDecodeUnavailable, match="no CUDA device visible"):
        _backends.open_backend("nvimgcodec", torch.device("cuda"), hardware=True,
                               fancy_upsampling=False)


# ----------------------------------------------------------------- issue 39's review: the fixes


@pytest.fixture(scope="module")
def twenty_root(tmp_path_factory) -> Path:
    """20 JPEGs, the 18th cut short: batches of 5 hold it in the fourth."""
    root = sample_images(tmp_path_factory.mktemp("twenty") / "images", num_images=20,
                         num_classes=2)
    victim = sorted(root.rglob("*.jpg"))[17]
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) // 3])
    return root


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("path", ["thread", "streams"])
def test_a_corrupt_image_raises_after_every_batch_before_it(twenty_root, monkeypatch, path,
                                                            depth, no_thread_leak):
    """The decode runs inside the side stream's work on CUDA: an error there, as an error of the
    loader, comes after the batches already prepared, as on the CPU path's thread."""
    if path == "streams":
        streams = RecordingStreams()
        monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
        use_stand_in(monkeypatch, refuse=_refuse_cut_jpegs, streams=streams)
    else:
        use_stand_in(monkeypatch, refuse=_refuse_cut_jpegs)
    dataset = ImageFolder(twenty_root, train=True, size=SIZE, seed=11, decode="gpu")
    prefetcher = DataPrefetcher(_loader(dataset), device="cpu", prefetch_depth=depth)
    got = []
    with pytest.raises(CorruptImageError, match="CPU decoder refuses it too"):
        for images, _labels in prefetcher:
            got.append(images)
    assert len(got) == 3, f"{len(got)} of the 3 batches before the corrupt one"


def test_the_encoded_bytes_live_until_the_side_streams_event_has_passed(mixed_root,
                                                                        monkeypatch):
    """nvImageCodec may read a batch's bytes (host memory) after its decode call returns: they
    are let go only once the event after the batch's work has passed, never before."""
    import gc
    import weakref

    streams = RecordingStreams()
    streams.pending = set()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    use_stand_in(monkeypatch, streams=streams)
    _, gpu = _pair(mixed_root, train=True)
    data: list[weakref.ref] = []

    def batches():
        for batch in _loader(gpu):
            data.append(weakref.ref(batch[0].data))
            yield batch
            del batch

    record_event = streams.record_event

    def pending_event(stream):  # the side stream's events have not run yet
        event = record_event(stream)
        if stream != "default":
            streams.pending.add(event)
        return event

    streams.record_event = pending_event
    epoch = iter(DataPrefetcher(batches(), device="cpu"))
    next(epoch)
    next(epoch)
    gc.collect()
    assert [ref() is not None for ref in data] == [True] * len(data), "freed before the event"
    streams.pending.clear()  # the work has run
    next(epoch)
    gc.collect()
    alive = [ref() is not None for ref in data]
    assert alive[0] is False and alive[1] is False, alive
    for _ in epoch:  # the events recorded from here on are pending again
        pass
    assert not streams.pending, "the epoch ended without waiting for the events of its bytes"
    gc.collect()
    assert not any(ref() is not None for ref in data)


def _pending_streams(mixed_root, monkeypatch):
    """The stand-in streams, whose side-stream events stay pending until a test says they
    passed (``streams.pending``), and the GPU-decode dataset of ``mixed_root``."""
    streams = RecordingStreams()
    streams.pending = set()
    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: streams)
    use_stand_in(monkeypatch, streams=streams)
    _, gpu = _pair(mixed_root, train=True)
    record_event = streams.record_event

    def pending_event(stream):
        event = record_event(stream)
        if stream != "default":
            streams.pending.add(event)
        return event

    streams.record_event = pending_event
    return streams, gpu


def test_an_epoch_that_ends_waits_for_the_events_of_the_bytes_it_holds(mixed_root, monkeypatch,
                                                                       no_thread_leak):
    streams, gpu = _pending_streams(mixed_root, monkeypatch)
    epoch = iter(DataPrefetcher(_loader(gpu), device="cpu", prefetch_depth=2))
    next(epoch)
    epoch.close()  # a loop that breaks early
    # The batch handed over and those decoded ahead (how many: as far as the thread got).
    waited = [e[1] for e in streams.log if e[0] == "synchronize"]
    assert waited and not streams.pending, (waited, streams.pending)


def test_without_rows_cuts_every_list_of_the_batchs_length():
    from fastpipe.gpu_decode._batches import without_rows

    boxes = [torch.full((k + 1, 4), k) for k in range(4)]
    meta = [{"name": f"n{k}"} for k in range(4)]
    batch = {"image": torch.zeros(3), "label": torch.arange(4), "boxes": boxes, "meta": meta,
             "names": ["a", "b", "c", "d"], "array": np.arange(8).reshape(4, 2),
             "fields": ("image", "label")}
    out = without_rows(batch, [0, 2, 3], 4, [("image",)])
    assert out["label"].tolist() == [0, 2, 3]
    assert [int(b[0, 0]) for b in out["boxes"]] == [0, 2, 3]
    assert out["meta"] == [meta[0], meta[2], meta[3]] and out["names"] == ["a", "c", "d"]
    assert out["array"].tolist() == [[0, 1], [4, 5], [6, 7]]
    assert out["fields"] == ("image", "label") and out["image"] is batch["image"]


def test_without_rows_keeps_the_list_that_holds_the_encoded_entry():
    from fastpipe.gpu_decode._batches import without_rows

    images, labels = torch.zeros((1, 3)), torch.arange(2)
    out = without_rows([images, labels], [1], 2, [(0,)])  # a batch of 2 as a list of 2 entries
    assert isinstance(out, list) and len(out) == 2 and out[0] is images
    assert out[1].tolist() == [1]


@pytest.mark.parametrize("entry, kind", [
    (("x", "y", "z", "w"), "tuple"),
    (type("Rows", (), {"__len__": lambda self: 4})(), "Rows"),
])
def test_without_rows_refuses_what_it_cannot_cut_naming_it(entry, kind):
    from fastpipe.gpu_decode._batches import without_rows

    batch = {"image": torch.zeros(3), "label": torch.arange(4), "odd": entry}
    with pytest.raises(TypeError, match=rf"batch\['odd'\], a {kind} of 4 values.*make it a list"):
        without_rows(batch, [0, 1, 3], 4, [("image",)])


def test_eval_regions_take_the_margin_on_every_side():
    """A region decode's edge rows may upsample chroma as its edge columns do: the eval region
    takes EVAL_REGION_MARGIN rows too, and the plan places it in the whole image."""
    from fastpipe.data.decode.image import EVAL_REGION_MARGIN
    from fastpipe.gpu_decode._decoder import _region_and_plan
    from fastpipe.ops._resize import input_span

    recipe = Recipe(train=False, size=SIZE)
    for interpolation, filter_ in (("bilinear", 0), ("bicubic", 1)):
        recipe = recipe.replace(interpolation=interpolation)
        height, width, resize = 300, 400, (60, 80)
        top, left = 10, 20
        plan = [height, width, top, left, SIZE, SIZE, *resize, 0, 0]
        region, row = _region_and_plan(plan, recipe)
        rows = input_span(height, resize[0], top, SIZE, filter_)
        cols = input_span(width, resize[1], left, SIZE, filter_)
        m = EVAL_REGION_MARGIN
        assert region == (rows[0] - m, cols[0] - m, rows[1] + 2 * m, cols[1] + 2 * m)
        assert row == [rows[0] - m, cols[0] - m, height, width, top, left, *resize, 0]
        # At the image's edges the margin stops there.
        region, _ = _region_and_plan([40, 50, 0, 0, SIZE, SIZE, SIZE, SIZE, 1, 0], recipe)
        assert region == (0, 0, 40, 50)


def test_gpu_decode_resizes_without_the_python_check_of_each_plan(mixed_root, monkeypatch):
    """resize_crops' Python wrapper checks every image's plan; the kernel checks it again in
    C++: GPU decode's own call (once per batch) leaves the Python loop out."""
    from fastpipe.ops import _extension
    from fastpipe.ops import _resize as resize_module

    if not _extension.has_kernel("resize_crops", torch.device("cpu")):
        pytest.skip("fastpipe._C is built without resize_crops")
    use_stand_in(monkeypatch)
    _, gpu = _pair(mixed_root, train=False)
    expected = _epochs(DataPrefetcher(_loader(gpu), device="cpu"))

    def checked(*args):
        raise AssertionError("the plan was checked in Python")

    monkeypatch.setattr(resize_module, "_plan_problem", checked)
    got = _epochs(DataPrefetcher(_loader(gpu), device="cpu"))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, expected))
    image = torch.zeros((4, 4, 3), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="does not fit"):  # the kernel's own check
        resize_module.resize_planned([image], torch.tensor([[1, 0, 4, 4, 0, 0, 4, 4, 0]]),
                                     (4, 4), 0)


def test_the_counts_add_up_to_every_image(corrupt_root, monkeypatch, no_thread_leak):
    use_stand_in(monkeypatch, refuse=lambda data: data[:4] == b"\x89PNG" or _refuse_cut_jpegs(
        data))
    _, gpu = _pair(corrupt_root, train=True)
    prefetcher = DataPrefetcher(_loader(gpu, on_error="skip"), device="cpu")
    with pytest.warns(RuntimeWarning, match=r"decoded \d image\(s\) on the CPU instead"):
        _epochs(prefetcher)
    stats = prefetcher.gpu_decode_stats
    assert stats["gpu"] + stats["cpu"] + stats["skipped"] == len(gpu)
    assert stats["skipped"] == 1 and stats["cpu"] == 4
    assert sum(stats["fallback_reasons"].values()) == stats["cpu"]


def test_gpu_decode_options_over_batches_without_encoded_images_warn_once(mixed_root,
                                                                         no_thread_leak):
    cpu, _ = _pair(mixed_root, train=True)
    prefetcher = DataPrefetcher(_loader(cpu), device="cpu", gpu_decode=GpuDecode())
    with pytest.warns(UserWarning, match=r"gpu_decode=.*no encoded images.*decode='gpu'"):
        _epochs(prefetcher)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _epochs(prefetcher)  # once
        _epochs(DataPrefetcher(_loader(cpu), device="cpu"))  # not asked for: nothing said


def test_each_chroma_upsampling_has_its_backend(mixed_root, monkeypatch, no_thread_leak):
    """A train batch (chroma replicated, as the CPU path's train decode) and an eval batch
    (smooth) through one prefetcher: each decoded with its own upsampling."""
    stand_in = use_stand_in(monkeypatch)
    cpu_train, gpu_train = _pair(mixed_root, train=True)
    cpu_eval, gpu_eval = _pair(mixed_root, train=False)
    encoded = [fast_collate([gpu_train[i] for i in range(6)]),
               fast_collate([gpu_eval[i] for i in range(6)]),
               fast_collate([gpu_train[i] for i in range(6, 12)])]
    expected = [fast_collate([cpu_train[i] for i in range(6)]),
                fast_collate([cpu_eval[i] for i in range(6)]),
                fast_collate([cpu_train[i] for i in range(6, 12)])]
    prefetcher = DataPrefetcher(encoded, device="cpu")
    got = list(prefetcher)
    for (images, labels), (want, want_labels) in zip(got, expected):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)
    assert [a["fancy_upsampling"] for a in stand_in.asked] == [False, True]
    assert prefetcher.gpu_decode_stats["kept_bytes"] == sum(d.kept_bytes()
                                                            for d in stand_in.opened)
    prefetcher.close()
    assert all(d.closed for d in stand_in.opened)


def test_a_joint_crop_with_gpu_decode_is_refused_naming_the_joint_crop(mixed_root):
    from fastpipe.data import JointCrop
    from fastpipe.data.sources.folder import FolderSource

    with pytest.raises(ValueError, match=r"decode='gpu'\): joint= crops.*decode='cpu' with "
                                         r"joint="):
        RecordDataset(FolderSource(mixed_root), joint=JointCrop(size=SIZE), decode="gpu")


def test_an_error_after_the_decode_queued_its_work_keeps_the_bytes_until_the_side_stream_ran(
        mixed_root, monkeypatch, no_thread_leak):
    """An error inside the side stream's work (here batch_transform, after the decode) is raised
    after the batches before it, and the failed batch's bytes, which the queued decode may still
    read, are let go only after an event recorded on the side stream has passed."""
    import gc
    import weakref

    streams, gpu = _pending_streams(mixed_root, monkeypatch)
    data: list[weakref.ref] = []
    calls = []

    def batches():
        for batch in _loader(gpu):
            data.append(weakref.ref(batch[0].data))
            yield batch
            del batch

    def transform(images, labels):
        calls.append(len(calls))
        if len(calls) == 3:
            raise RuntimeError("the third batch's transform fails")
        return images, labels

    prefetcher = DataPrefetcher(batches(), device="cpu", prefetch_depth=2,
                                batch_transform=transform)
    epoch = iter(prefetcher)
    got = [next(epoch), next(epoch)]
    gc.collect()
    assert data[2]() is not None, "the failed batch's bytes were let go before its event"
    with pytest.raises(RuntimeError, match="third batch"):
        next(epoch)
    assert len(got) == 2 and not streams.pending, "the epoch's end waits for every event"
    side_events = [e[1] for e in streams.log if e[0] == "event" and e[2] != "default"]
    waited = [e[1] for e in streams.log if e[0] == "synchronize"]
    assert len(side_events) == 3, "no event recorded after the failed batch's queued decode"
    assert side_events[-1] in waited, "the epoch ended before the failed batch's work had run"
    gc.collect()
    assert not any(ref() is not None for ref in data)


@pytest.mark.parametrize("train", [True, False])
def test_torchvisions_backend_end_to_end_on_the_cpu(mixed_root, monkeypatch, train,
                                                    no_thread_leak):
    """TorchvisionBackend itself (decode_jpeg decodes on the CPU too) behind DataPrefetcher, in
    place of the stand-in: the JPEGs decoded by it, whole, then cut to each region; the PNGs and
    the CMYK JPEG decoded on the CPU, counted with the reason; the batches within the decoder
    tolerance of the CPU path's (libjpeg-turbo's upsampling and IDCT against torchvision's
    libjpeg build), with the same labels and order."""
    pytest.importorskip("torchvision", exc_type=ImportError)
    opened = []

    def open_backend(name, device, *, hardware, fancy_upsampling):
        opened.append(_backends.TorchvisionBackend(device))
        return opened[-1]

    monkeypatch.setattr(_backends, "open_backend", open_backend)
    cpu, gpu = _pair(mixed_root, train=train)
    expected = _epochs(DataPrefetcher(_loader(cpu), device="cpu"))
    prefetcher = DataPrefetcher(_loader(gpu), device="cpu")
    with pytest.warns(RuntimeWarning, match="torchvision decode_jpeg did not decode it"):
        got = _epochs(prefetcher)
    assert len(opened) == 1
    images, want = torch.cat([b[0] for b in got]), torch.cat([b[0] for b in expected])
    assert torch.equal(torch.cat([b[1] for b in got]), torch.cat([b[1] for b in expected]))
    diff = (images.int() - want.int()).abs().float().flatten(1).mean(1)
    assert diff.max() <= 2.0, diff
    stats = prefetcher.gpu_decode_stats
    assert stats["backend"] == "torchvision decode_jpeg"
    assert stats["gpu"] == 18 and stats["cpu"] == 4 and stats["skipped"] == 0, stats
    assert stats["fallback_reasons"]["torchvision decode_jpeg did not decode it on the GPU"] == 3
    # The images it decoded differ from the CPU path's, where the PNGs (decoded on the CPU) do not.
    names = [Path(gpu.path(i)).suffix for i in range(len(gpu))]
    pngs = [k for k, suffix in enumerate(names) if suffix == ".png"]
    assert all(float(diff[k]) == 0 for k in pngs)

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
from tests.helpers.gpu_decode import use_stand_in

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

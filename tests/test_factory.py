"""fastpipe.image_loader: one set of arguments, the same batch semantics on both CPU backends
(DALI's CPU mode and the fast CPU path). Nothing here ran on a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe import IMAGENET_MEAN, IMAGENET_STD, DataPrefetcher, Recipe, image_loader
from fastpipe import factory as factory_module

BACKENDS = [
    "cpu",
    pytest.param("dali", marks=pytest.mark.skipif(
        not factory_module._dali_installed(), reason="needs the dali extra")),
]
NUM_INDEXED = 24


def _write_jpeg(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, "RGB").save(path, quality=95)


def _index_colour(i: int) -> int:
    return 20 + 9 * i


@pytest.fixture(scope="module")
def indexed_root(tmp_path_factory) -> Path:
    """24 flat-colour JPEGs in 2 classes; the red level of image i encodes i under any crop,
    resize or flip."""
    root = tmp_path_factory.mktemp("indexed")
    for i in range(NUM_INDEXED):
        label = i % 2
        pixels = np.empty((60, 80, 3), np.uint8)
        pixels[..., 0] = _index_colour(i)
        pixels[..., 1] = 128
        pixels[..., 2] = 60 + 100 * label
        _write_jpeg(root / f"class_{label}" / f"img_{i:03d}.jpg", pixels)
    return root


@pytest.fixture(scope="module")
def gradient_root(tmp_path_factory) -> Path:
    """96 JPEGs whose red rises left to right and green top to bottom, so the red and green
    ranges of an output image are the width and height of its crop, as fractions."""
    root = tmp_path_factory.mktemp("gradient")
    height, width = 120, 160
    red = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    green = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    pixels = np.stack([red, green, np.full_like(red, 128)], axis=2).round().astype(np.uint8)
    for i in range(96):
        _write_jpeg(root / f"class_{i % 2}" / f"img_{i:03d}.jpg", pixels)
    return root


def _loader(root, backend, **kwargs):
    options = dict(train=True, size=32, backend=backend, num_workers=2, device="cpu")
    options.update(kwargs)
    return image_loader(root, options.pop("batch_size", 5), **options)


def _epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images, labels) for images, labels in loader]


def _indices(batches) -> list[int]:
    """The sample index of every image, from its red level (unnormalized float output)."""
    found = []
    for images, _ in batches:
        red = images[:, 0].float().mean(dim=(1, 2)) * 255
        found += [int(round((float(r) - 20) / 9)) for r in red]
    return found


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "dtype, channels_last, normalized",
    [(torch.float32, False, True), (torch.float16, True, True), (torch.float32, True, False),
     (torch.uint8, False, False)],
)
@pytest.mark.slow
def test_batches_have_the_same_format_on_every_backend(sample_root, backend, dtype,
                                                       channels_last, normalized,
                                                       no_thread_leak):
    norm = {} if normalized else {"mean": None, "std": None}
    loader = _loader(sample_root, backend, batch_size=16, size=32, dtype=dtype,
                     channels_last=channels_last, **norm)
    try:
        batches = _epoch(loader)
    finally:
        loader.close()
    assert len(loader) == len(batches) == 3
    for images, labels in batches:
        assert images.shape == (16, 3, 32, 32)
        assert images.dtype == dtype and images.device.type == "cpu"
        assert images.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert labels.dtype == torch.int64 and labels.shape == (16,)
        assert 0 <= int(labels.min()) and int(labels.max()) < 4
        pixels = images.float()
        if dtype == torch.uint8:
            assert float(pixels.max()) > 200
        elif normalized:
            mean = torch.tensor(IMAGENET_MEAN)[None, :, None, None]
            std = torch.tensor(IMAGENET_STD)[None, :, None, None]
            pixels = pixels * std + mean
            assert float(pixels.min()) > -0.01 and float(pixels.max()) < 1.01
            assert float(pixels.max()) > 0.8  # 0-1 scale, not 0-255 nor already squashed
        else:
            assert float(pixels.min()) >= 0 and float(pixels.max()) <= 1.0
            assert float(pixels.max()) > 0.8


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_takes_height_and_width(sample_root, backend, no_thread_leak):
    loader = _loader(sample_root, backend, batch_size=16, size=(32, 40))
    try:
        images, _ = next(iter(loader))
    finally:
        loader.close()
    assert images.shape == (16, 3, 32, 40)


def test_eval_images_agree_across_backends(sample_root, no_thread_leak):
    pytest.importorskip("nvidia.dali")
    outputs = {}
    for backend in ("cpu", "dali"):
        loader = _loader(sample_root, backend, train=False, batch_size=16, size=48,
                         mean=None, std=None)
        try:
            outputs[backend] = _epoch(loader)
        finally:
            loader.close()
    for (cpu_images, cpu_labels), (dali_images, dali_labels) in zip(outputs["cpu"],
                                                                    outputs["dali"]):
        assert torch.equal(cpu_labels, dali_labels)  # same order without shuffling
        # Different JPEG decoders and resize filters: close, not equal. A flipped, shifted or
        # differently scaled image is ~0.2 away.
        assert float((cpu_images - dali_images).abs().mean()) < 0.06
        colour = (cpu_images.mean(dim=(2, 3)) - dali_images.mean(dim=(2, 3))).abs()
        assert float(colour.max()) < 0.02


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_sample_once_per_epoch_reshuffled(indexed_root, backend, no_thread_leak):
    loader = _loader(indexed_root, backend, mean=None, std=None)
    try:
        first, second = _epoch(loader), _epoch(loader)
    finally:
        loader.close()
    assert len(loader) == len(first) == len(second) == math.ceil(NUM_INDEXED / 5)
    assert [len(labels) for _, labels in first] == [5, 5, 5, 5, 4]
    for batches in (first, second):
        assert sorted(_indices(batches)) == list(range(NUM_INDEXED))
        labels = torch.cat([labels for _, labels in batches]).tolist()
        assert labels == [i % 2 for i in _indices(batches)]
    assert _indices(first) != _indices(second)


@pytest.mark.parametrize("backend", BACKENDS)
def test_drop_last_and_no_shuffle(indexed_root, backend, no_thread_leak):
    loader = _loader(indexed_root, backend, mean=None, std=None, drop_last=True, shuffle=False)
    try:
        batches = _epoch(loader)
    finally:
        loader.close()
    assert len(loader) == len(batches) == NUM_INDEXED // 5
    assert all(len(labels) == 5 for _, labels in batches)
    # ImageFolder order: class_0 first (the even indices), then class_1.
    order = [i for i in range(NUM_INDEXED) if i % 2 == 0] + [i for i in range(NUM_INDEXED) if i % 2]
    assert _indices(batches) == order[:20]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size, drop_last", [(2, False), (5, False), (5, True)])
@pytest.mark.slow
def test_ranks_share_an_epoch_like_distributed_sampler(indexed_root, backend, world_size,
                                                       drop_last, no_thread_leak):
    per_rank = []
    for rank in range(world_size):
        loader = _loader(indexed_root, backend, mean=None, std=None, rank=rank,
                         world_size=world_size, drop_last=drop_last, batch_size=2)
        try:
            batches = _epoch(loader)
        finally:
            loader.close()
        assert len(loader) == len(batches)
        per_rank.append(_indices(batches))
    counts = {len(seen) for seen in per_rank}
    assert len(counts) == 1  # every rank runs the same number of samples (and steps)
    everything = [i for seen in per_rank for i in seen]
    if drop_last:
        assert len(everything) == len(set(everything)) == NUM_INDEXED - NUM_INDEXED % world_size
    else:
        assert set(everything) == set(range(NUM_INDEXED))
        assert len(everything) == math.ceil(NUM_INDEXED / world_size) * world_size


def _crop_areas(batches) -> torch.Tensor:
    """Each image's crop area as a fraction of the source, from the gradient ranges."""
    areas = []
    for images, _ in batches:
        red = images[:, 0].float()
        green = images[:, 1].float()
        width = (red[:, :, -1].mean(1) - red[:, :, 0].mean(1)).abs()  # flips swap the ends
        height = green[:, -1, :].mean(1) - green[:, 0, :].mean(1)
        areas.append(width * height)
    return torch.cat(areas)


def _torchvision_area_mean(scale, ratio, height=120, width=160, draws=4000) -> float:
    transforms = pytest.importorskip("torchvision.transforms")
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    total = 0.0
    for _ in range(draws):
        _, _, h, w = transforms.RandomResizedCrop.get_params(image, list(scale), list(ratio))
        total += (h * w) / ((height - 1) * (width - 1))
    return total / draws


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_crop_scale_statistics_match_random_resized_crop(gradient_root, backend,
                                                         no_thread_leak):
    loader = _loader(gradient_root, backend, batch_size=32, size=48, mean=None, std=None,
                     seed=3)
    try:
        areas = _crop_areas(_epoch(loader))
    finally:
        loader.close()
    expected = _torchvision_area_mean((0.08, 1.0), (3 / 4, 4 / 3))
    # 96 crops: the standard error of the mean area is about 0.03.
    assert abs(float(areas.mean()) - expected) < 0.1, (float(areas.mean()), expected)
    assert float(areas.min()) > 0.04 and float(areas.max()) < 1.05


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_scale_and_ratio_are_honoured(gradient_root, backend, no_thread_leak):
    loader = _loader(gradient_root, backend, batch_size=32, size=48, mean=None, std=None,
                     scale=(0.25, 0.25), ratio=(4 / 3, 4 / 3))
    try:
        areas = _crop_areas(_epoch(loader))
    finally:
        loader.close()
    assert torch.allclose(areas, torch.full_like(areas, 0.25), atol=0.05), areas


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hflip", [0.0, 1.0])
def test_hflip_is_a_probability_on_every_backend(gradient_root, backend, hflip, no_thread_leak):
    loader = _loader(gradient_root, backend, batch_size=32, size=32, mean=None, std=None,
                     hflip=hflip)
    try:
        batches = _epoch(loader)
    finally:
        loader.close()
    red = torch.cat([images[:, 0].float() for images, _ in batches])
    rising = (red[:, :, -1].mean(1) - red[:, :, 0].mean(1)) > 0  # red rises left to right
    assert bool(rising.all()) if hflip == 0.0 else not bool(rising.any())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("crop_pct", [1.0, 0.5])
@pytest.mark.slow
def test_eval_centre_crop_keeps_crop_pct_of_the_shorter_side(gradient_root, backend, crop_pct,
                                                            no_thread_leak):
    loader = _loader(gradient_root, backend, train=False, batch_size=32, size=48, mean=None,
                     std=None, crop_pct=crop_pct)
    try:
        images, _ = next(iter(loader))
    finally:
        loader.close()
    green = images[:, 1].float()
    height = green[:, -1, :].mean(1) - green[:, 0, :].mean(1)  # the shorter side is the height
    assert torch.allclose(height, torch.full_like(height, crop_pct), atol=0.06), height


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("option", [{"interpolation": "bicubic"}, {"auto_augment": "ra"}])
@pytest.mark.slow
def test_augmentation_options_change_the_images(sample_root, backend, option, no_thread_leak):
    outputs = []
    # The option first: a build that refuses it fails before any worker starts.
    for extra in (option, {}):
        loader = _loader(sample_root, backend, batch_size=16, size=48, mean=None, std=None,
                         seed=5, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, **extra)
        try:
            outputs.append(next(iter(loader))[0])
        finally:
            loader.close()
    assert outputs[0].shape == outputs[1].shape
    assert not torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_batches(indexed_root, backend, no_thread_leak):
    orders = []
    for _ in range(2):
        loader = _loader(indexed_root, backend, mean=None, std=None, seed=7)
        try:
            orders.append(_indices(_epoch(loader)))
        finally:
            loader.close()
    assert orders[0] == orders[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_pack_file_gives_the_same_epochs_as_its_folder(sample_root, tmp_path, backend,
                                                          no_thread_leak):
    pytest.importorskip("h5py")
    from fastpipe.pack import pack

    path = tmp_path / "sample.h5"
    pack(str(sample_root), str(path), storage="bytes", num_workers=1, progress=False)
    loader = _loader(path, backend, batch_size=16, shuffle=False)
    try:
        batches = _epoch(loader)
    finally:
        loader.close()
    assert len(loader) == len(batches) == 3
    labels = torch.cat([labels for _, labels in batches])
    assert sorted(labels.tolist()) == sorted([i % 4 for i in range(48)])


def test_the_cpu_backend_is_the_fast_path(sample_root, no_thread_leak):
    loader = _loader(sample_root, "auto", batch_size=16)
    try:
        assert isinstance(loader, DataPrefetcher)  # no CUDA here: the CPU path
        assert type(loader.loader).__name__ == "DataLoaderX"
        assert type(loader.loader.dataset).__name__ == "ImageFolder"
    finally:
        loader.close()


@pytest.mark.parametrize("cuda, dali, expected", [
    (True, True, "dali"), (True, False, "cpu"), (False, True, "cpu"),
])
def test_auto_picks_dali_gpu_decode_only_with_cuda_and_dali(monkeypatch, sample_root, cuda,
                                                            dali, expected):
    # Stand-ins for a CUDA machine: what "auto" would choose there (no GPU here).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(factory_module, "_dali_installed", lambda: dali)
    monkeypatch.setattr(factory_module, "_dali_sees_a_gpu", lambda: True)
    options = factory_module._Options.check(
        source=sample_root, batch_size=8, recipe=Recipe(train=True), device=None,
        backend="auto", rank=None, world_size=None, seed=0, shuffle=None, drop_last=False,
        num_workers=2, worker_method="process", prefetch_depth=2,
    )
    assert options.backend == expected
    assert options.device.type == ("cuda" if cuda else "cpu")


def test_auto_falls_back_to_the_cpu_path_when_dali_sees_no_gpu(monkeypatch, sample_root):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory_module, "_dali_installed", lambda: True)
    monkeypatch.setattr(factory_module, "_dali_sees_a_gpu", lambda: False)
    with pytest.warns(RuntimeWarning, match="DALI is installed but sees no GPU"):
        options = factory_module._Options.check(
            source=sample_root, batch_size=8, recipe=Recipe(train=True), device=None,
            backend="auto", rank=None, world_size=None, seed=0, shuffle=None, drop_last=False,
            num_workers=2, worker_method="process", prefetch_depth=2,
        )
    assert options.backend == "cpu"


def test_dali_sees_no_gpu_here():
    pytest.importorskip("nvidia.dali")
    assert factory_module._dali_sees_a_gpu() is False  # the real query, on a machine without one


@pytest.mark.parametrize("kwargs, error, match", [
    ({"backend": "dali", "dtype": torch.bfloat16}, ValueError, "backend='cpu'"),
    ({"backend": "dali", "num_workers": 0}, ValueError, "num_workers >= 1"),
    ({"train": False, "auto_augment": "ra"}, ValueError, "auto_augment=None"),
    ({"dtype": torch.uint8}, ValueError, "mean=None"),
    ({"mean": None}, ValueError, "both mean and std"),
    ({"num_workers": True}, TypeError, "not a flag"),
    ({"hflip": True}, TypeError, "hflip"),
    ({"batch_size": 0}, ValueError, "batch_size"),
    ({"backend": "gpu"}, ValueError, "'auto', 'cpu', 'dali'"),
    ({"device": "cuda"}, ValueError, "CUDA is not available"),
    ({"rank": 2, "world_size": 2}, ValueError, "rank < world_size"),
    ({"rank": 0}, ValueError, "both rank and world_size"),
    ({"interpolation": "lanczos"}, ValueError, "'bilinear', 'bicubic'"),
    ({"size": (32, 0)}, ValueError, "size"),
    ({"scale": (0.5, 0.1)}, ValueError, "scale"),
])
def test_options_a_backend_cannot_honour_fail_at_construction(sample_root, kwargs, error,
                                                              match):
    options = dict(batch_size=4, train=True, device="cpu", backend="cpu")
    options.update(kwargs)
    batch_size = options.pop("batch_size")
    with pytest.raises(error, match=match):
        image_loader(sample_root, batch_size, **options)


def test_a_missing_source_is_named(tmp_path):
    # The one resolver's words (fastpipe.data.sources.resolve), naming the path and what it
    # could have been.
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist \(expected an image "
                                                r"folder, a pack"):
        image_loader(tmp_path / "nowhere", 4, train=True, backend="cpu", device="cpu")
    with pytest.raises(TypeError, match="path to an image folder"):
        image_loader(object(), 4, train=True, backend="cpu", device="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_attributes_and_set_epoch(indexed_root, backend, no_thread_leak):
    loader = _loader(indexed_root, backend, mean=None, std=None, seed=11, drop_last=True)
    reference = _loader(indexed_root, backend, mean=None, std=None, seed=11, drop_last=True)
    try:
        assert loader.batch_size == 5 and loader.drop_last is True
        assert len(loader.dataset) == NUM_INDEXED
        for _ in range(3):
            _epoch(reference)
        loader.set_epoch(3)
        assert _indices(_epoch(loader)) == _indices(_epoch(reference))
    finally:
        loader.close()
        reference.close()


def test_image_loader_is_in_the_package_namespace():
    assert fastpipe.image_loader is image_loader
    assert "image_loader" in fastpipe.__all__


@pytest.mark.slow
def test_fastpipe_bench_has_a_row_for_the_factory(sample_root, no_thread_leak):
    from fastpipe.bench import run_bench

    report = run_bench(sample_root, batch_size=8, num_workers=0, size=32, seconds=0.2,
                       rounds=1, variants=("dataloader", "factory"), min_batches=2)
    row = next(r for r in report.rows if r.key == "factory")
    assert row.skipped is None and row.images_per_second > 0
    assert row.output.startswith("float32")


@pytest.mark.parametrize("world_size, drop_last, shuffle", [
    (1, False, True), (4, False, True), (4, True, True), (3, False, False),
])
def test_cpu_backend_orders_and_shards_like_distributed_sampler(indexed_root, world_size,
                                                                drop_last, shuffle):
    from torch.utils.data.distributed import DistributedSampler

    for rank in range(world_size):
        loader = image_loader(indexed_root, 4, train=True, size=16, backend="cpu", device="cpu",
                              num_workers=0, rank=rank, world_size=world_size, seed=9,
                              shuffle=shuffle, drop_last=drop_last)
        ours = loader.sampler  # the DataPrefetcher reads like its DataLoaderX
        theirs = DistributedSampler(range(len(loader.dataset)), num_replicas=world_size,
                                    rank=rank, shuffle=shuffle, seed=ours.seed,
                                    drop_last=drop_last)
        for epoch in range(3):  # ours advances by itself, DistributedSampler is told
            theirs.set_epoch(epoch)
            assert [int(i) for i in ours] == list(theirs)
            assert len(ours) == len(theirs)
        loader.close()


@pytest.mark.parametrize("given, expected", [
    (dict(num_workers=2), "thread"),
    (dict(num_workers=4), "thread"),
    (dict(num_workers=5), "process"),
    (dict(num_workers=0), "process"),
    (dict(num_workers=2, auto_augment="ra"), "process"),
    (dict(num_workers=2, worker_method="process"), "process"),
    (dict(num_workers=8, worker_method="thread"), "thread"),
])
def test_the_cpu_backend_loads_with_threads_for_a_few_workers(sample_root, given, expected):
    loader = image_loader(sample_root, 8, train=True, size=32, backend="cpu", device="cpu",
                          seed=0, **given)
    try:
        assert loader.loader.worker_method == expected
        assert loader.loader.num_workers == given["num_workers"]
    finally:
        loader.close()


def test_thread_workers_give_the_same_batches_and_dali_refuses_them(sample_root, no_thread_leak):
    batches = {}
    for method in ("process", "thread"):
        loader = image_loader(sample_root, 8, train=True, size=32, backend="cpu", device="cpu",
                              num_workers=2, seed=4, worker_method=method)
        batches[method] = [(images.clone(), labels.clone()) for images, labels in loader]
        loader.close()
    assert len(batches["thread"]) == len(batches["process"]) == 6
    for (a, la), (b, lb) in zip(batches["thread"], batches["process"], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(ValueError, match="worker_method='thread' is the CPU backend's"):
        image_loader(sample_root, 8, train=True, backend="dali", device="cpu",
                     worker_method="thread")


@pytest.fixture(scope="module")
def root_with_corrupt_files(indexed_root, tmp_path_factory) -> Path:
    """The indexed images, two of them damaged (one not an image, one truncated)."""
    import shutil

    root = tmp_path_factory.mktemp("corrupt") / "images"
    shutil.copytree(indexed_root, root)
    files = sorted(root.glob("*/*.jpg"))
    files[3].write_bytes(b"not a JPEG at all")
    files[17].write_bytes(files[17].read_bytes()[:200])
    return root


@pytest.mark.parametrize("num_workers, worker_method", [(0, None), (2, "thread"),
                                                        (2, "process")])
def test_on_error_skip_leaves_corrupt_images_out(root_with_corrupt_files, num_workers,
                                                 worker_method):
    loader = image_loader(root_with_corrupt_files, batch_size=8, train=False, size=32,
                          device="cpu", backend="auto", num_workers=num_workers,
                          worker_method=worker_method, on_error="skip")
    try:
        with pytest.warns(RuntimeWarning, match="skipped 2 corrupt samples this epoch"):
            sizes = [len(labels) for _, labels in loader]
        assert sizes == [7, 8, 7]
        assert [s["index"] for s in loader.skipped] == [3, 17]
        assert loader.skipped == loader.loader.skipped
    finally:
        loader.close()


def test_on_error_raise_stops_at_the_corrupt_image(root_with_corrupt_files):
    from fastpipe.data import CorruptImageError

    loader = image_loader(root_with_corrupt_files, batch_size=8, train=False, size=32,
                          device="cpu", num_workers=0)
    try:
        with pytest.raises(CorruptImageError):
            list(loader)
    finally:
        loader.close()


def test_on_error_skip_is_the_cpu_paths(monkeypatch, sample_root):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(factory_module, "_dali_installed", lambda: True)
    monkeypatch.setattr(factory_module, "_dali_sees_a_gpu", lambda: True)
    given = dict(source=sample_root, batch_size=8, recipe=Recipe(train=True), device=None,
                 rank=None, world_size=None, seed=0, shuffle=None, drop_last=False,
                 num_workers=2, worker_method=None, prefetch_depth=2)
    assert factory_module._Options.check(backend="auto", **given).backend == "dali"
    # DALI cannot leave a sample out of its batch: "auto" takes the CPU path, "dali" refuses.
    assert factory_module._Options.check(backend="auto", on_error="skip",
                                         **given).backend == "cpu"
    with pytest.raises(ValueError, match="on_error='skip' is the CPU backend's"):
        factory_module._Options.check(backend="dali", on_error="skip", **given)
    with pytest.raises(ValueError, match="on_error must be"):
        factory_module._Options.check(backend="auto", on_error="ignore", **given)

"""cuda lane: GPU decode in DataPrefetcher (datasets built with decode="gpu"), against the CPU
path on the same samples. Run on an H200, decoding in the training thread (docs/gpu.md, "What
ran on a GPU"); the decode in a thread of its own has not run on a GPU yet.

- fastpipe.ops.resize_crops on the GPU equals its CPU kernel (and so fastpipe._resize) bit for
  bit, on a side stream after queued work.
- nvImageCodec's decode (and torchvision's, the stand-in where nvImageCodec is absent) against
  the CPU path decoding at full size (reducing_gap=inf: what a GPU decoder decodes), for the
  same samples: every crop box and flip the CPU path's (the plans handed over equal the CPU
  decoder's), pixels within the decoder tolerance (nvJPEG or the hardware engine against
  libjpeg-turbo: a mean absolute difference of at most 2.0 levels per image, at most 1% of
  pixels off by more than 24); nothing fell back to the CPU. Identical pixels are no sign of a
  CPU decode here (nvImageCodec is opened without a CPU backend, tests/gpu_decode/test_backends;
  the H200's train-mode decode equals libjpeg-turbo's bit for bit): the decoder's own count is
  the proof. The report line prints the measured differences.
- Every test that decodes asserts that every image was decoded on the GPU (gpu_decode_stats: none
  on the CPU), so a decode that fell back to the CPU without a word fails it, also where the
  pixels are compared with another GPU decode's (resume, DDP shards) and not with the CPU path's.
- Every source kind (folder, list file, HDF5 and LMDB packs, tar shards, records), resume (the
  same batches), DDP shards (two processes on one GPU: each rank's images are the single
  process's images of its shard), a corrupt JPEG skipped as on_error says, and memory flat over
  50 epochs (torch's reserved memory, and the device's free memory for nvImageCodec's own),
  nothing kept after close().

Skipped without a GPU, or without nvImageCodec and nvJPEG (torchvision's test: without its CUDA
decode); FASTPIPE_REQUIRE_CUDA=1 makes that a failure.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from tests.helpers.cuda import require_cuda_part

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]

MEAN_ABS_LIMIT = 2.0
FAR_LEVELS, FAR_SHARE = 24, 0.01
SIZE = 96
INF = float("inf")


@pytest.fixture
def nvimgcodec():
    """nvImageCodec with nvJPEG (without it nvImageCodec decodes no JPEG on the GPU)."""
    from fastpipe.gpu_decode import available_backends

    problem = available_backends()["nvimgcodec"]
    require_cuda_part(problem is None, f"nvImageCodec cannot run GPU decode here: {problem}")
    from fastpipe._doctor import nvjpeg_state

    nvjpeg = nvjpeg_state()
    require_cuda_part(nvjpeg["loads"] is not False, f"nvJPEG: {nvjpeg['problem']}")


def compare_decodes(gpu_images: torch.Tensor, cpu_images: torch.Tensor) -> str:
    """GPU decode against the CPU path: within the decoder tolerance. Returns the report line;
    raises AssertionError with it."""
    assert gpu_images.shape == cpu_images.shape and gpu_images.dtype == torch.uint8
    diff = (gpu_images.int() - cpu_images.int()).abs().float()
    per_image = diff.flatten(1).mean(1)
    far = (diff > FAR_LEVELS).float().flatten(1).mean(1)
    report = (f"mean |GPU - CPU| per image: max {per_image.max():.3f}, median "
              f"{per_image.median():.3f}; share off by more than {FAR_LEVELS}: max "
              f"{far.max():.4f}; images differing: {int((per_image > 0).sum())} of "
              f"{len(per_image)}")
    print(report)
    assert per_image.max() <= MEAN_ABS_LIMIT, report
    assert far.max() <= FAR_SHARE, report
    return report


def _pair(root: Path, train: bool, **kwargs):
    from fastpipe.data import ImageFolder

    options = dict(train=train, size=SIZE, seed=11, reducing_gap=INF, **kwargs)
    return ImageFolder(root, **options), ImageFolder(root, **options, decode="gpu")


def _loader(dataset, **kwargs):
    from fastpipe import DataLoaderX
    from fastpipe.data import fast_collate

    kwargs.setdefault("batch_size", 16)
    kwargs.setdefault("num_workers", 2)
    return DataLoaderX(dataset, collate_fn=fast_collate, pin_memory=True, **kwargs)


def _epoch(prefetcher) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = [], []
    for x, y in prefetcher:
        assert x.is_cuda and y.is_cuda and x.dtype == torch.uint8
        images.append(x.cpu())
        labels.append(y.cpu())
    return torch.cat(images), torch.cat(labels)


def assert_all_on_the_gpu(prefetcher, images: int, skipped: int = 0) -> None:
    """Every image of the run decoded on the GPU: none fell back to the CPU decoder."""
    stats = prefetcher.gpu_decode_stats
    assert stats is not None, "no encoded batch reached the GPU decode"
    assert stats["cpu"] == 0 and stats["gpu"] == images and stats["skipped"] == skipped, stats


def _cpu_epoch(dataset, **kwargs):
    from fastpipe import DataPrefetcher

    return _epoch(DataPrefetcher(_loader(dataset, **kwargs), device="cuda"))


# ------------------------------------------------------------------------ the resize kernel


def test_resize_crops_on_the_gpu_equals_the_cpu_kernel_on_a_busy_side_stream():
    from fastpipe.ops import _extension, resize_crops
    from tests.helpers.cuda import gpu_sleep

    require_cuda_part(_extension.has_kernel("resize_crops", torch.device("cuda")),
                      "fastpipe._C has no CUDA resize_crops for this GPU (rebuild)")
    rng = np.random.default_rng(0)
    images, plans = [], []
    for k in range(24):
        h, w = (int(v) for v in rng.integers(20, 700, 2))
        pixels = torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        images.append(pixels if k % 2 else pixels.permute(2, 0, 1).contiguous().permute(1, 2, 0))
        resized = (int(rng.integers(SIZE, 400)), int(rng.integers(SIZE, 400))) if k % 3 else (
            SIZE, SIZE)
        top = int(rng.integers(0, resized[0] - SIZE + 1))
        left = int(rng.integers(0, resized[1] - SIZE + 1))
        plans.append([0, 0, h, w, top, left, *resized, k % 2])
    plan = torch.tensor(plans)
    for interpolation in ("bilinear", "bicubic"):
        expected = resize_crops(images, plan, SIZE, interpolation)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            gpu_sleep(0.1)  # the images are written after queued work: the kernel must follow
            on_gpu = [image.cuda(non_blocking=False) for image in images]
            got = resize_crops(on_gpu, plan, SIZE, interpolation)
        side.synchronize()
        assert got.is_cuda and torch.equal(got.cpu(), expected), interpolation


# -------------------------------------------------------- against the CPU path, same samples


@pytest.mark.parametrize("train", [True, False])
def test_gpu_decode_equals_the_cpu_path_within_the_decoder_tolerance(sample_root, train,
                                                                     nvimgcodec):
    from fastpipe import DataPrefetcher
    from fastpipe.data.sampling.seeds import reseeded, sample_seed

    cpu, gpu = _pair(sample_root, train)
    # The plans handed over are the CPU decoder's: the same crop box and flip per sample.
    for index in range(len(gpu)):
        encoded, _ = gpu[index]
        plan = cpu.decoder._plan(*encoded.plan[:2], generator=reseeded(
            sample_seed(cpu.seed, 0, index)))
        assert list(encoded.plan[2:6]) == list(plan.box) and encoded.plan[8] == int(plan.flip)
    expected, expected_labels = _cpu_epoch(cpu)
    prefetcher = DataPrefetcher(_loader(gpu), device="cuda")
    images, labels = _epoch(prefetcher)
    assert torch.equal(labels, expected_labels)
    compare_decodes(images, expected)
    assert prefetcher.gpu_decode_stats["backend"] == "nvImageCodec"
    assert_all_on_the_gpu(prefetcher, len(gpu))
    prefetcher.close()


def test_torchvision_stands_in_where_nvimagecodec_is_absent(sample_root):
    """Needs torchvision's CUDA decode only (not nvImageCodec: it is what stands in for it)."""
    pytest.importorskip("torchvision", exc_type=ImportError)
    from fastpipe import DataPrefetcher
    from fastpipe.gpu_decode import GpuDecode, available_backends

    problem = available_backends()["torchvision"]
    require_cuda_part(problem is None, f"torchvision cannot run GPU decode here: {problem}")

    cpu, gpu = _pair(sample_root, train=False)
    expected, _ = _cpu_epoch(cpu)
    prefetcher = DataPrefetcher(_loader(gpu), device="cuda",
                                gpu_decode=GpuDecode(backend="torchvision"))
    images, _ = _epoch(prefetcher)
    compare_decodes(images, expected)
    assert prefetcher.gpu_decode_stats["backend"] == "torchvision decode_jpeg"
    assert_all_on_the_gpu(prefetcher, len(gpu))
    prefetcher.close()


def _kinds(root: Path, tmp: Path) -> dict:
    """(CPU dataset, GPU dataset) of each source kind that imports here, on the same JPEGs."""
    from fastpipe import Recipe
    from fastpipe.data import ImageDecoder, TarDataset
    from fastpipe.data.datasets._records import RecordDataset
    from fastpipe.data.sources.folder import ListSource

    decoder = ImageDecoder(recipe=Recipe(train=True, size=SIZE), reducing_gap=INF)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = sorted(p for p in root.rglob("*.jpg") if p.parent.name in classes)
    kinds = {}
    listing = tmp / "list.txt"
    listing.write_text("".join(f"{p} {classes.index(p.parent.name)}\n" for p in files))
    kinds["list"] = lambda decode: RecordDataset(ListSource(listing), decoder=decoder, seed=4,
                                                 decode=decode)
    (tmp / "shards").mkdir()
    with tarfile.open(tmp / "shards" / "000000.tar", "w") as tar:
        for k, path in enumerate(files):
            for name, data in ((f"{k:05d}.jpg", path.read_bytes()),
                               (f"{k:05d}.cls", b"%d" % classes.index(path.parent.name))):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    kinds["tar"] = lambda decode: TarDataset(tmp / "shards", decoder=decoder, seed=4,
                                             fields=["jpg", "cls"], decode=decode)
    try:
        import h5py  # noqa: F401
    except ImportError:
        return kinds
    from fastpipe.data import H5Dataset
    from fastpipe.data.format.fields import ImageField, IntField
    from fastpipe.pack import pack

    pack(str(root), str(tmp / "images.h5"), num_workers=1, progress=False)
    kinds["hdf5"] = lambda decode: H5Dataset(tmp / "images.h5", decoder=decoder, seed=4,
                                             decode=decode)
    records = [{"image": p.read_bytes(), "label": classes.index(p.parent.name)} for p in files]
    pack(records, str(tmp / "records.h5"), progress=False,
         fields={"image": ImageField(), "label": IntField()})
    kinds["records"] = lambda decode: H5Dataset(tmp / "records.h5", decoder=decoder, seed=4,
                                                decode=decode)
    try:
        import lmdb  # noqa: F401
    except ImportError:
        return kinds
    from fastpipe.data import LMDBDataset

    pack(str(root), str(tmp / "images.lmdb"), num_workers=1, progress=False, format="lmdb")
    kinds["lmdb"] = lambda decode: LMDBDataset(tmp / "images.lmdb", decoder=decoder, seed=4,
                                               decode=decode)
    return kinds


def test_every_source_kind_decodes_on_the_gpu_within_the_tolerance(sample_root, tmp_path,
                                                                   nvimgcodec):
    from fastpipe import DataPrefetcher

    for kind, make in _kinds(sample_root, tmp_path).items():
        cpu, gpu = make("cpu"), make("gpu")
        expected = [b for b in DataPrefetcher(_loader(cpu, num_workers=0), device="cuda")]
        prefetcher = DataPrefetcher(_loader(gpu, num_workers=0), device="cuda")
        got = [b for b in prefetcher]
        key = "image" if isinstance(expected[0], dict) else 0
        images = torch.cat([b[key].cpu() for b in got])
        print(kind, end=": ")
        compare_decodes(images, torch.cat([b[key].cpu() for b in expected]))
        print(kind, prefetcher.gpu_decode_stats)
        assert_all_on_the_gpu(prefetcher, len(gpu))


def test_resume_replays_the_same_batches(sample_root, nvimgcodec):
    from fastpipe import DataPrefetcher

    _, gpu = _pair(sample_root, train=True)
    whole = _epoch(DataPrefetcher(_loader(gpu, shuffle=True, seed=3), device="cuda"))[0]
    first = DataPrefetcher(_loader(gpu, shuffle=True, seed=3), device="cuda")
    batches = iter(first)
    head = [next(batches)[0].cpu() for _ in range(2)]
    state = first.state_dict()
    first.close()
    again = DataPrefetcher(_loader(gpu, shuffle=True, seed=3), device="cuda")
    again.load_state_dict(state)
    rest = _epoch(again)[0]
    assert torch.equal(torch.cat([*head, rest]), whole), "nvImageCodec's decode is deterministic"
    assert_all_on_the_gpu(again, len(rest))  # a replay decoded on the CPU would equal it too


def _rank(rank: int, world_size: int, root: str, out_dir: str) -> None:
    from fastpipe import image_loader

    loader = image_loader(root, 8, train=True, size=SIZE, decode="gpu", rank=rank,
                          world_size=world_size, shuffle=False, seed=5, num_workers=2,
                          mean=None, std=None, dtype=torch.uint8)
    images = torch.cat([x.cpu() for x, _ in loader])
    torch.save({"images": images, "stats": loader.gpu_decode_stats},
               Path(out_dir) / f"rank{rank}.pt")
    loader.close()


def test_ddp_shards_on_one_gpu_decode_each_ranks_share(sample_root, tmp_path, nvimgcodec):
    from fastpipe import image_loader

    mp.spawn(_rank, args=(2, str(sample_root), str(tmp_path)), nprocs=2, join=True)
    single = image_loader(sample_root, 8, train=True, size=SIZE, decode="gpu", shuffle=False,
                          seed=5, num_workers=2, mean=None, std=None, dtype=torch.uint8)
    everything = torch.cat([x.cpu() for x, _ in single])
    assert_all_on_the_gpu(single, len(everything))
    single.close()
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt")
        shard, stats = saved["images"], saved["stats"]
        # DistributedSampler without shuffling: rank r reads samples r, r + 2, ...
        assert torch.equal(shard, everything[rank::2]), f"rank {rank}"
        assert stats["cpu"] == 0 and stats["gpu"] == len(shard), (rank, stats)


def test_a_corrupt_jpeg_is_skipped_as_on_error_says(sample_root, tmp_path, nvimgcodec):
    from fastpipe import DataPrefetcher
    from fastpipe.data.decode.budget import CorruptImageError

    root = tmp_path / "corrupt"
    shutil.copytree(sample_root, root)
    victim = sorted(root.rglob("*.jpg"))[5]
    data = victim.read_bytes()
    victim.write_bytes(data[:len(data) // 3])
    _, gpu = _pair(root, train=True)
    with pytest.raises(CorruptImageError, match="CPU decoder refuses it too"):
        _epoch(DataPrefetcher(_loader(gpu), device="cuda"))
    prefetcher = DataPrefetcher(_loader(gpu, on_error="skip"), device="cuda")
    with pytest.warns(RuntimeWarning, match="skipped 1 corrupt sample"):
        images, labels = _epoch(prefetcher)
    assert len(images) == len(labels) == len(gpu) - 1
    assert [s["index"] for s in prefetcher.skipped] == [5]
    # The cut JPEG goes to the CPU decoder (it has no end-of-image marker), which refuses it.
    assert_all_on_the_gpu(prefetcher, len(gpu) - 1, skipped=1)


def test_memory_stays_flat_over_50_epochs_and_close_keeps_nothing(sample_root, nvimgcodec):
    from fastpipe import DataPrefetcher

    _, gpu = _pair(sample_root, train=True)
    prefetcher = DataPrefetcher(_loader(gpu, worker_method="thread"), device="cuda",
                                mean=(0.5,) * 3, std=(0.25,) * 3)
    reserved, free = [], []
    for _ in range(50):
        for images, _labels in prefetcher:
            del images
        torch.cuda.synchronize()
        reserved.append(torch.cuda.memory_reserved())
        free.append(torch.cuda.mem_get_info()[0])
    report = (f"reserved after epochs 2 and 50: {reserved[1]} and {reserved[-1]} bytes; free "
              f"device memory {free[1]} and {free[-1]}; stats {prefetcher.gpu_decode_stats}")
    print(report)
    assert reserved[-1] <= reserved[1], report
    assert free[1] - free[-1] <= 64 << 20, report  # nvImageCodec's own buffers: no growth
    assert prefetcher.gpu_decode_stats["released"] == 0, report
    assert_all_on_the_gpu(prefetcher, 50 * len(gpu))
    prefetcher.close()
    assert prefetcher.gpu_decode_stats is None

"""DALILoader on DALI's CPU mode (the real nvidia-dali package): epochs, last batches, errors,
threads.

Where DALI does not import, every module of tests/dali skips with the reason (run with -rs to
see it), so that it never stops the collection of the other tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastpipe import IMAGENET_MEAN, IMAGENET_STD
from fastpipe.data import CorruptImageError
from tests.helpers.dali import (
    DALI_MISSING,
    JpegBytes,
    image_files,
    native_threads,
    wait_native_threads,
)

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import DALILoader, FileList  # noqa: E402
from fastpipe.data import shard_order  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.timeout(60)]

SIZE = 48  # small outputs keep the suite fast; decoding the ~500x400 JPEGs dominates anyway


def run_epoch(loader) -> tuple[list[int], list[torch.Tensor]]:
    labels, images = [], []
    for batch_images, batch_labels in loader:
        labels.extend(batch_labels.tolist())
        images.append(batch_images)
    return labels, images


@pytest.mark.slow
def test_one_epoch_yields_every_sample_once_with_shapes_and_dtypes(index_list, no_thread_leak):
    with DALILoader(index_list, batch_size=10, size=SIZE, device="cpu", seed=0) as loader:
        assert loader.device == torch.device("cpu")
        assert len(loader) == 5
        sizes, seen = [], []
        for images, labels in loader:
            assert images.shape[1:] == (3, SIZE, SIZE)
            assert images.dtype == torch.float32 and images.device.type == "cpu"
            assert labels.dtype == torch.int64 and labels.dim() == 1
            assert labels.shape[0] == images.shape[0]
            assert torch.isfinite(images).all()
            sizes.append(len(labels))
            seen.extend(labels.tolist())
    assert sizes == [10, 10, 10, 10, 8]
    assert sorted(seen) == list(range(48))
    assert seen != sorted(seen), "train mode shuffles by default"


def pil_eval_reference(
    path: Path, size: int, crop_pct: float = 0.875, resample: int = Image.BILINEAR
) -> torch.Tensor:
    """Eval transform with PIL: shorter side to floor(size / crop_pct), centre crop, normalize.

    Output sizes and the crop offset are torchvision's ``Resize(int)`` + ``CenterCrop`` (long
    side truncated, crop start rounded half to even), the geometry of fastpipe.Recipe on every
    backend, so that the comparison measures decoding and resampling, not a one-pixel shift.
    """
    image = Image.open(path).convert("RGB")
    width, height = image.size
    short = int(size / crop_pct)
    if width < height:
        new_w, new_h = short, int(short * height / width)
    else:
        new_w, new_h = int(short * width / height), short
    resized = image.resize((new_w, new_h), resample)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    pixels = np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.float32) / 255
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    return (torch.from_numpy(pixels).permute(2, 0, 1) - mean) / std


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_output_matches_a_pil_reference(sample_root, interpolation):
    # Tolerance, in pixel levels of 255: both decoders are libjpeg-turbo and agree exactly (0
    # difference measured), so what remains is DALI's antialiased resize against PIL's (the
    # measurements are on docs/dali.md); the same bound holds for both filters.
    files = image_files(sample_root)[:12]
    with DALILoader(FileList(files, range(12)), batch_size=6, train=False, size=64, device="cpu",
                    mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation=interpolation) as loader:
        images = torch.cat([batch for batch, _ in loader])
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    resample = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}[interpolation]
    for image, path in zip(images, files, strict=True):
        levels = (image - pil_eval_reference(path, 64, resample=resample)).abs() * std * 255
        assert levels.mean() < 2.5, f"{path.name}: mean difference {levels.mean():.2f} levels"
        assert levels.flatten().quantile(0.99) < 16, f"{path.name}: 99th percentile too large"


def test_two_epochs_reshuffle_and_follow_the_documented_order(index_list):
    with DALILoader(index_list, batch_size=16, size=SIZE, device="cpu", seed=7) as loader:
        first, _ = run_epoch(loader)
        second, _ = run_epoch(loader)
    assert sorted(first) == sorted(second) == list(range(48))
    assert first != second
    assert first == shard_order(48, epoch=0, seed=7, shuffle=True)
    assert second == shard_order(48, epoch=1, seed=7, shuffle=True)


def test_eval_without_shuffle_reads_in_file_order_every_epoch(index_list):
    with DALILoader(index_list, batch_size=20, train=False, size=SIZE, device="cpu") as loader:
        assert run_epoch(loader)[0] == list(range(48))
        assert run_epoch(loader)[0] == list(range(48))


def test_early_break_then_a_new_full_epoch(index_list, no_thread_leak):
    with DALILoader(index_list, batch_size=8, size=SIZE, device="cpu", seed=1) as loader:
        for _, labels in loader:
            assert labels.tolist() == shard_order(48, epoch=0, seed=1, shuffle=True)[:8]
            break
        epoch1, _ = run_epoch(loader)
        # Two breaks in a row, the second at the very first batch.
        for _ in loader:
            break
        for _ in loader:
            break
        epoch4, _ = run_epoch(loader)
    assert epoch1 == shard_order(48, epoch=1, seed=1, shuffle=True)
    assert epoch4 == shard_order(48, epoch=4, seed=1, shuffle=True)


def test_batches_stay_valid_while_later_batches_are_produced(index_list):
    # CPU batches are DALI's own output buffers (zero-copy through DLPack): they must not be
    # reused for later batches while the caller still holds them.
    with DALILoader(index_list, batch_size=8, size=SIZE, device="cpu", seed=3) as loader:
        kept = []
        for _ in range(2):
            for images, labels in loader:
                kept.append((images, images.clone(), labels, labels.clone()))
    assert len(kept) == 12
    for images, snapshot, labels, label_snapshot in kept:
        assert torch.equal(images, snapshot) and torch.equal(labels, label_snapshot)


def test_prefetch_depth_one(index_list, no_thread_leak):
    with DALILoader(index_list, batch_size=16, size=SIZE, device="cpu", prefetch_depth=1,
                    seed=0) as loader:
        for _ in loader:
            break
        assert sorted(run_epoch(loader)[0]) == list(range(48))


def test_set_epoch_replays_an_epoch(index_list):
    with DALILoader(index_list, batch_size=12, size=SIZE, device="cpu", seed=2) as loader:
        run_epoch(loader)
        loader.set_epoch(5)
        assert loader.epoch == 5
        assert run_epoch(loader)[0] == shard_order(48, epoch=5, seed=2, shuffle=True)
        loader.set_epoch(0)
        assert run_epoch(loader)[0] == shard_order(48, epoch=0, seed=2, shuffle=True)


def test_partial_last_batch_and_drop_last(index_list):
    with DALILoader(index_list, batch_size=20, size=SIZE, device="cpu", seed=0) as loader:
        sizes = [len(labels) for _, labels in loader]
        assert sizes == [20, 20, 8] and len(loader) == 3
    with DALILoader(index_list, batch_size=20, size=SIZE, device="cpu", seed=0,
                    drop_last=True) as loader:
        assert len(loader) == 2
        for _ in range(2):
            labels, _ = run_epoch(loader)
            assert len(labels) == 40 and len(set(labels)) == 40
    # One batch bigger than the dataset: one partial batch, or none at all with drop_last.
    with DALILoader(index_list, batch_size=64, size=SIZE, device="cpu") as loader:
        assert [len(labels) for _, labels in loader] == [48]
    with pytest.raises(ValueError, match="fewer than batch_size=64"):
        DALILoader(index_list, batch_size=64, size=SIZE, device="cpu", drop_last=True)


def test_epoch_iterator_len_and_a_superseded_iterator(index_list):
    with DALILoader(index_list, batch_size=16, train=False, size=SIZE, device="cpu") as loader:
        iterator = iter(loader)
        assert len(iterator) == 3
        next(iterator)
        assert len(iterator) == 2
        newer = iter(loader)
        with pytest.raises(RuntimeError, match="newer iter"):
            next(iterator)
        assert [len(labels) for _, labels in newer] == [16, 16, 16]


def test_same_seed_gives_the_same_batches(index_list):
    def first_batches(seed):
        with DALILoader(index_list, batch_size=8, size=SIZE, device="cpu", seed=seed,
                        color_jitter=0.3) as loader:
            iterator = iter(loader)
            return [next(iterator) for _ in range(2)]

    a, b, c = first_batches(11), first_batches(11), first_batches(12)
    for (images_a, labels_a), (images_b, labels_b) in zip(a, b, strict=True):
        assert torch.equal(labels_a, labels_b) and torch.equal(images_a, images_b)
    assert not torch.equal(a[0][0], c[0][0])


def test_float16_channels_last_uint8_and_unnormalized_outputs(index_list):
    files = [line.split()[0] for line in index_list.read_text().splitlines()[:8]]
    sources = FileList(files, range(8))
    normalize = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}

    def batch(**kwargs):
        with DALILoader(sources, batch_size=8, train=False, size=SIZE, device="cpu",
                        **kwargs) as loader:
            (images, _), = list(loader)
        return images

    half = batch(dtype=torch.float16, channels_last=True, **normalize)
    raw = batch(dtype=torch.uint8)
    full = batch(**normalize)
    plain = batch()
    # channels_last: NCHW shape with channels_last strides (DALI's HWC output, not copied).
    assert half.shape == (8, 3, SIZE, SIZE) and half.dtype == torch.float16
    assert half.is_contiguous(memory_format=torch.channels_last) and not half.is_contiguous()
    assert raw.shape == (8, 3, SIZE, SIZE) and raw.dtype == torch.uint8 and raw.is_contiguous()
    mean = torch.tensor(IMAGENET_MEAN)[:, None, None]
    std = torch.tensor(IMAGENET_STD)[:, None, None]
    # uint8 output is the same crop, unnormalized: normalizing it gives the float32 output.
    torch.testing.assert_close((raw.float() / 255 - mean) / std, full, atol=1e-4, rtol=0)
    torch.testing.assert_close(half.float(), full, atol=2e-2, rtol=0)
    # No mean/std (the default): 0-1 floats.
    assert 0 <= plain.min() and plain.max() <= 1 and plain.max() > 0.9
    torch.testing.assert_close(raw.float() / 255, plain, atol=1e-6, rtol=0)


def test_cutout_erases_a_square_per_sample(index_list):
    normalize = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}  # erased pixels: exactly 0
    with DALILoader(index_list, batch_size=16, size=SIZE, device="cpu", seed=0, cutout_holes=1,
                    cutout_size=24, **normalize) as loader:
        images = torch.cat(run_epoch(loader)[1])
    with DALILoader(index_list, batch_size=16, size=SIZE, device="cpu", seed=0,
                    **normalize) as loader:
        plain = torch.cat(run_epoch(loader)[1])
    erased = (images == 0).all(dim=1)  # (N, H, W): pixels zero in all three channels
    # The square's centre is uniform and the square is clipped at the borders, so at least a
    # quarter of it (a 12x12 corner of a 24x24 square) stays inside.
    assert (erased.flatten(1).sum(1) >= 12 * 12).all()
    assert (erased.flatten(1).sum(1) <= 24 * 24).all()
    anchors = {tuple(erased[i].nonzero().min(0).values.tolist()) for i in range(len(erased))}
    assert len(anchors) > 10, "cutout windows should move from sample to sample"
    assert (plain == 0).all(dim=1).sum() < 20


def test_encoded_dataset_source(sample_root):
    dataset = JpegBytes(image_files(sample_root))
    with DALILoader(dataset, batch_size=10, size=SIZE, device="cpu", seed=4) as loader:
        first, _ = run_epoch(loader)
        second, _ = run_epoch(loader)
    assert sorted(first) == sorted(second) == list(range(48)) and first != second
    # Any dataset, through fetch=: here a plain list of (bytes, label) pairs.
    pairs = [(dataset.blobs[i].tobytes(), i) for i in range(20)]
    with DALILoader(pairs, batch_size=8, train=False, size=SIZE, device="cpu",
                    fetch=pairs.__getitem__) as loader:
        assert run_epoch(loader)[0] == list(range(20))


@pytest.mark.slow
def test_threads_end_after_close_break_and_garbage_collection(index_list, no_thread_leak):
    def loader():
        return DALILoader(index_list, batch_size=8, size=SIZE, device="cpu", num_workers=2)

    # DALI keeps a few process-wide threads after its first pipeline; measure after one.
    warm = loader()
    run_epoch(warm)
    warm.close()
    baseline = wait_native_threads(0, timeout=0.5)

    first = loader()
    run_epoch(first)
    assert native_threads() > baseline  # the pipeline and the reader are running
    first.close()
    assert wait_native_threads(baseline) == baseline

    second = loader()
    for _ in second:
        break
    del second
    assert wait_native_threads(baseline) == baseline

    third = loader()
    iterator = iter(third)
    next(iterator)
    del third  # the epoch iterator keeps the loader alive ...
    next(iterator)
    del iterator  # ... and its end releases everything
    assert wait_native_threads(baseline) == baseline

    # A closed loader can iterate again: a new pipeline is built.
    fourth = loader()
    run_epoch(fourth)
    fourth.close()
    assert len(run_epoch(fourth)[0]) == 48
    fourth.close()
    assert wait_native_threads(baseline) == baseline


@pytest.mark.slow
def test_many_loaders_do_not_accumulate_threads(index_list):
    counts = []
    for _ in range(4):
        with DALILoader(index_list, batch_size=24, train=False, size=SIZE, device="cpu") as loader:
            run_epoch(loader)
        counts.append(wait_native_threads(0, timeout=0.5))
    assert counts[-1] <= counts[0]


# ---- bad input -----------------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DALILoader(tmp_path / "nowhere", batch_size=4, device="cpu")


def test_empty_folder_and_folder_without_images(tmp_path):
    with pytest.raises(ValueError, match="no class folders"):
        DALILoader(tmp_path, batch_size=4, device="cpu")
    (tmp_path / "cats").mkdir()
    (tmp_path / "cats" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="no images found"):
        DALILoader(tmp_path, batch_size=4, device="cpu")


def test_list_file_naming_a_missing_image(tmp_path, sample_root):
    good = image_files(sample_root)[0]
    list_file = tmp_path / "train.txt"
    list_file.write_text(f"{good} 0\n\nmissing/cat.jpg 1\n")
    with pytest.raises(FileNotFoundError, match=r"line 3: .*missing/cat\.jpg"):
        DALILoader(list_file, batch_size=4, device="cpu")


def test_list_file_with_a_malformed_line(tmp_path, sample_root):
    list_file = tmp_path / "train.txt"
    list_file.write_text(f"{image_files(sample_root)[0]} zero\n")
    with pytest.raises(ValueError, match=r"train\.txt:1: expected 'path label'"):
        DALILoader(list_file, batch_size=4, device="cpu")


@pytest.mark.parametrize("content", [b"this is not an image", b"\xff\xd8\xff\xe0" + b"\x00" * 200])
def test_unreadable_image_names_the_file(tmp_path, sample_root, content, no_thread_leak):
    files = image_files(sample_root)[:10]
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(content)
    sources = FileList([*files[:5], broken, *files[5:]], range(11))
    loader = DALILoader(sources, batch_size=4, train=False, size=SIZE, device="cpu")
    with pytest.raises(CorruptImageError, match=r"broken\.jpg"):
        run_epoch(loader)
    # The failed pipeline is gone; the loader reports the same problem again, not a hang.
    with pytest.raises(CorruptImageError, match=r"broken\.jpg"):
        run_epoch(loader)
    loader.close()


def test_empty_encoded_sample_is_named(sample_root):
    dataset = JpegBytes(image_files(sample_root)[:4])
    dataset.blobs[2] = np.zeros(0, dtype=np.uint8)
    with DALILoader(dataset, batch_size=4, train=False, size=SIZE, device="cpu") as loader:
        with pytest.raises(CorruptImageError, match="sample 2 of JpegBytes.*empty"):
            run_epoch(loader)


def test_dataset_errors_reach_the_caller_unchanged(sample_root, no_thread_leak):
    dataset = JpegBytes(image_files(sample_root)[:12])

    def fetch(index):
        if index == 9:
            raise KeyError("sample 9 is gone")
        return dataset.encoded(index)

    loader = DALILoader(dataset, batch_size=4, train=False, size=SIZE, device="cpu", fetch=fetch)
    with pytest.raises(KeyError, match="sample 9 is gone"):
        run_epoch(loader)
    loader.close()


def test_gpu_request_without_gpu_is_a_clear_fastpipe_error(index_list):
    for device in ("gpu", "cuda", "cuda:0", 0):
        with pytest.raises(RuntimeError, match="torch sees no CUDA device") as info:
            DALILoader(index_list, batch_size=4, device=device)
        assert "device='cpu'" in str(info.value)
        assert "cuInit" not in str(info.value) and "Assert" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 4, "channels_last": "NHWC"}, "channels_last"),
        ({"batch_size": 4, "mean": IMAGENET_MEAN}, "both mean and std"),
        ({"batch_size": 4, "dtype": torch.uint8, "mean": IMAGENET_MEAN, "std": IMAGENET_STD},
         "float dtype"),
        ({"batch_size": 4, "cutout_holes": -1}, "cutout_holes"),
        ({"batch_size": 4, "cutout_size": 0.5}, "cutout_size"),
        ({"batch_size": 4, "prefetch_depth": 0}, "prefetch_depth"),
        ({"batch_size": 4, "num_workers": 0}, "num_workers"),
        ({"batch_size": 4, "interpolation": "lanczos"}, "interpolation"),
        ({"batch_size": 4, "dtype": torch.float64}, "dtype"),
        ({"batch_size": 4, "scale": (0.5, 0.1)}, "scale"),
        ({"batch_size": 4, "hflip": 2}, "hflip"),
        ({"batch_size": 4, "color_jitter": (0.4, 0.4)}, "color_jitter"),
        ({"batch_size": 4, "rank": 2, "world_size": 2}, "rank"),
        ({"batch_size": 4, "rank": 0}, "both rank and world_size"),
        ({"batch_size": 4, "device": "auto"}, "device must be None"),
        ({"batch_size": 4, "device": "tpu"}, "device must be"),
    ],
)
def test_bad_arguments(index_list, kwargs, message):
    with pytest.raises(ValueError, match=message):
        DALILoader(index_list, **kwargs)


# ---- optional dependency -------------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_import_fastpipe_does_not_import_dali():
    result = _python("import sys, fastpipe; print('nvidia.dali' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_import_fastpipe_dali_without_dali_names_the_extra():
    # sys.modules[name] = None makes the import fail as if the package were not installed.
    result = _python(
        "import sys; sys.modules['nvidia.dali'] = None\n"
        "from fastpipe._optional import MissingDependencyError\n"
        "try:\n    import fastpipe.dali\nexcept MissingDependencyError as e:\n    print(e)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'fastpipe[dali]'" in result.stdout
    assert "nvidia-dali-cuda130" in result.stdout


# ---- what code around a DataLoader reads ---------------------------------------------------


def evaluate(model, data_loader) -> float:
    """The shape of torchvision's reference evaluate(): it reads data_loader.dataset."""
    correct = 0
    for images, labels in data_loader:
        correct += int((model(images) == labels).sum())
    return correct / len(data_loader.dataset)


def test_loader_attributes_like_a_dataloader(index_list):
    with DALILoader(index_list, batch_size=10, size=SIZE, device="cpu", seed=4, num_workers=1,
                    drop_last=True, rank=1, world_size=2) as loader:
        assert len(loader.dataset) == 48 and isinstance(loader.dataset, FileList)
        assert (loader.batch_size, loader.drop_last, loader.num_workers) == (10, True, 1)
        assert loader.batch_sampler is None
        assert len(loader) == 2 and len(loader.sampler) == 24
        assert evaluate(lambda images: torch.zeros(len(images), dtype=torch.int64), loader) == 0
        # The sampler describes the order of the next epoch, as DistributedSampler would.
        assert list(loader.sampler) == shard_order(
            48, epoch=1, seed=4, shuffle=True, rank=1, world_size=2, drop_last=True
        )
        # Lightning calls sampler.set_epoch(epoch) before each epoch.
        loader.sampler.set_epoch(3)
        assert loader.epoch == 3
        labels = torch.cat([labels for _, labels in loader]).tolist()
        assert labels == shard_order(
            48, epoch=3, seed=4, shuffle=True, rank=1, world_size=2, drop_last=True
        )[:20]
        assert "rank 1/2" in repr(loader.sampler)


@pytest.mark.slow
def test_lightning_sets_the_epoch_and_accelerate_leaves_the_loader_as_it_is(index_list):
    # Lightning calls set_epoch on loader.sampler before every epoch (its own helper here).
    from accelerate import Accelerator
    from lightning.fabric.utilities.data import _set_sampler_epoch

    with DALILoader(index_list, batch_size=16, size=SIZE, device="cpu", seed=6) as loader:
        _set_sampler_epoch(loader, 4)
        assert loader.epoch == 4
        assert run_epoch(loader)[0] == shard_order(48, epoch=4, seed=6, shuffle=True)
        # accelerate re-creates only DataLoaders; a DALILoader shards itself from
        # torch.distributed, so prepare() must hand it back untouched.
        assert Accelerator(cpu=True).prepare(loader) is loader


def test_loader_built_before_the_process_group_is_not_silently_unsharded(index_list, monkeypatch):
    # Under torchrun every process has WORLD_SIZE; a loader built before init_process_group
    # would read the whole dataset on every rank.
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(RuntimeWarning, match="reads the whole dataset on every rank"):
        loader = DALILoader(index_list, batch_size=8, size=SIZE, device="cpu")
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    with pytest.raises(RuntimeError, match="built as rank 0 of 1.*now says rank 1 of 2"):
        iter(loader)
    # Explicit shards are the user's choice: no check.
    with DALILoader(index_list, batch_size=8, size=SIZE, device="cpu", rank=0, world_size=1) as ok:
        next(iter(ok))
    loader.close()

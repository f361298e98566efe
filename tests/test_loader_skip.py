"""DataLoaderX(on_error="skip"): corrupt samples left out of their batches, counted, reported at
the end of the epoch and carried through a resume, in every worker mode; "raise" unchanged."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from fastpipe import DataLoaderX
from fastpipe.data import CorruptImageError, ImageFolder, fast_collate

pytestmark = pytest.mark.timeout(120)

CORRUPT = (2, 13)  # dataset indices of the two corrupt files among the 20 images
MODES = [(0, "process"), (2, "process"), (2, "thread")]


@pytest.fixture(scope="module")
def corrupt_root(sample_root, tmp_path_factory):
    """20 images in 2 classes, the files at CORRUPT damaged: one not an image, one truncated."""
    root = tmp_path_factory.mktemp("corrupt") / "images"
    sources = sorted(sample_root.glob("*/*.jpg"))[:20]
    for k, source in enumerate(sources):
        folder = root / f"class_{k // 10}"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, folder / f"{k:02d}.jpg")
    (root / "class_0" / "02.jpg").write_bytes(b"this is text, not a JPEG\n" * 10)
    truncated = (root / "class_1" / "13.jpg")
    truncated.write_bytes(truncated.read_bytes()[:400])
    return root


@pytest.fixture(scope="module")
def corrupt_pack(corrupt_root, tmp_path_factory):
    """The same 20 files packed as they are (check=False keeps the corrupt bytes)."""
    pytest.importorskip("h5py", exc_type=ImportError)
    from fastpipe.pack import pack

    out = tmp_path_factory.mktemp("corrupt_pack") / "images.h5"
    report = pack(corrupt_root, out, check=False, progress=False)
    assert report.count == 20
    return out


def _epoch(loader) -> tuple[list, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    return batches, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def _good_images(dataset, indices) -> torch.Tensor:
    return torch.stack([dataset[i][0] for i in indices])


@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.slow
def test_a_folder_epoch_skips_the_corrupt_files(corrupt_root, num_workers, worker_method,
                                                drop_last, no_thread_leak):
    dataset = ImageFolder(corrupt_root, train=False, size=32)
    loader = DataLoaderX(dataset, batch_size=6, num_workers=num_workers,
                         worker_method=worker_method, collate_fn=fast_collate,
                         drop_last=drop_last, on_error="skip")
    batches, warned = _epoch(loader)
    # Batches [0-5] [6-11] [12-17] [18-19]: the first and the third lose one sample each; the
    # last, short one is dropped with drop_last as without skipping.
    assert [len(labels) for _, labels in batches] == ([5, 6, 5] if drop_last else [5, 6, 5, 2])
    read = range(18 if drop_last else 20)
    good = [i for i in read if i not in CORRUPT]
    assert torch.equal(torch.cat([images for images, _ in batches]), _good_images(dataset, good))
    assert torch.cat([labels for _, labels in batches]).tolist() == [i // 10 for i in good]
    assert [s["index"] for s in loader.skipped] == list(CORRUPT)
    assert [s["sample"] for s in loader.skipped] == [
        str(corrupt_root / "class_0" / "02.jpg"), str(corrupt_root / "class_1" / "13.jpg")]
    assert all("cannot decode image" in s["reason"] for s in loader.skipped)
    assert not any("BytesIO" in s["reason"] for s in loader.skipped), loader.skipped
    assert len(warned) == 1, warned
    assert "skipped 2 corrupt samples this epoch" in warned[0]
    assert "02.jpg" in warned[0] and "13.jpg" in warned[0] and "DataLoaderX.skipped" in warned[0]


@pytest.mark.hdf5
@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
@pytest.mark.slow
def test_a_pack_epoch_skips_the_corrupt_samples(corrupt_root, corrupt_pack, num_workers,
                                                worker_method, no_thread_leak):
    # H5Dataset reads a batch at once (__getitems__): the failed batch is read again sample by
    # sample to find the corrupt ones.
    from fastpipe import Recipe
    from fastpipe.data import H5Dataset

    dataset = H5Dataset(corrupt_pack, recipe=Recipe(train=False, size=32))
    loader = DataLoaderX(dataset, batch_size=4, num_workers=num_workers,
                         worker_method=worker_method, collate_fn=fast_collate, on_error="skip")
    batches, warned = _epoch(loader)
    assert [len(labels) for _, labels in batches] == [3, 4, 4, 3, 4]
    good = [i for i in range(20) if i not in CORRUPT]
    assert torch.equal(torch.cat([images for images, _ in batches]), _good_images(dataset, good))
    assert [s["index"] for s in loader.skipped] == list(CORRUPT)
    assert loader.skipped[0]["sample"] == f"{corrupt_pack}[2] (packed from class_0/02.jpg)"
    assert len(warned) == 1 and "skipped 2 corrupt samples" in warned[0]


@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
def test_raise_is_unchanged(corrupt_root, num_workers, worker_method, no_thread_leak):
    loader = DataLoaderX(ImageFolder(corrupt_root, train=False, size=32), batch_size=4,
                         num_workers=num_workers, worker_method=worker_method,
                         collate_fn=fast_collate)
    assert loader.on_error == "raise"
    seen = 0
    with pytest.raises(CorruptImageError, match="02.jpg"):
        for _ in loader:
            seen += 1
    assert seen == 0 and loader.skipped == []


class _Samples(Dataset):
    """Numbers; CorruptImageError at ``corrupt``, ``other`` (an exception) at ``fail_at``."""

    def __init__(self, n: int, corrupt=(), fail_at=None, other=ValueError) -> None:
        self.n, self.corrupt, self.fail_at, self.other = n, set(corrupt), fail_at, other

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        if index in self.corrupt:
            raise CorruptImageError(f"cannot decode image number {index}")
        if index == self.fail_at:
            raise self.other(f"sample {index} is broken otherwise")
        return torch.tensor([index])


@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
def test_a_batch_with_nothing_left_is_passed_over(num_workers, worker_method, no_thread_leak):
    loader = DataLoaderX(_Samples(20, corrupt=range(4, 8)), batch_size=4, on_error="skip",
                         num_workers=num_workers, worker_method=worker_method)
    batches, warned = _epoch(loader)
    assert [b.flatten().tolist() for b in batches] == [
        [0, 1, 2, 3], [8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]]
    assert [s["index"] for s in loader.skipped] == [4, 5, 6, 7]
    assert loader.skipped[0] == {"index": 4, "sample": None,
                                 "reason": "cannot decode image number 4"}
    assert "skipped 4 corrupt samples" in warned[0]
    # The passed-over batch counts as received: the state is the next epoch's.
    assert loader.state_dict()["sampler"]["epoch"] == 1 and loader.state_dict()["skipped"] == []


def test_without_batch_size_a_corrupt_sample_is_left_out(no_thread_leak):
    loader = DataLoaderX(_Samples(6, corrupt={1, 4}), batch_size=None, on_error="skip")
    batches, warned = _epoch(loader)
    assert [b.tolist() for b in batches] == [[0], [2], [3], [5]]
    assert [s["index"] for s in loader.skipped] == [1, 4] and len(warned) == 1


@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
def test_other_exceptions_still_raise(num_workers, worker_method, no_thread_leak):
    loader = DataLoaderX(_Samples(20, corrupt={1}, fail_at=9), batch_size=4, on_error="skip",
                         num_workers=num_workers, worker_method=worker_method)
    seen = []
    with pytest.raises(ValueError, match="sample 9 is broken otherwise"):
        for batch in loader:
            seen.append(batch.flatten().tolist())
    assert seen == [[0, 2, 3], [4, 5, 6, 7]]


def test_an_epoch_without_corrupt_samples_warns_nothing(no_thread_leak):
    loader = DataLoaderX(_Samples(10), batch_size=4, on_error="skip", num_workers=0)
    batches, warned = _epoch(loader)
    assert len(batches) == 3 and warned == [] and loader.skipped == []


@pytest.mark.parametrize(("num_workers", "worker_method"), MODES)
@pytest.mark.slow
def test_a_resumed_epoch_reports_the_whole_epochs_skips(corrupt_root, num_workers,
                                                        worker_method, no_thread_leak):
    def build():
        return DataLoaderX(ImageFolder(corrupt_root, train=True, size=32, seed=1), batch_size=4,
                           shuffle=True, seed=7, num_workers=num_workers,
                           worker_method=worker_method, collate_fn=fast_collate,
                           on_error="skip")

    whole, _ = _epoch(reference := build())
    expected = reference.skipped
    assert sorted(s["index"] for s in expected) == list(CORRUPT)
    # Stop after the batch that holds the first corrupt sample, before the second one's.
    first = min(range(len(whole)), key=lambda k: len(whole[k][1]))
    loader = build()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning mid-epoch
        epoch = iter(loader)
        for _ in range(first + 1):
            next(epoch)
        state = loader.state_dict()
        epoch.close()
    assert [s["index"] for s in state["skipped"]] == [expected[0]["index"]]
    assert loader.skipped == state["skipped"]

    resumed = build()
    resumed.load_state_dict(state)
    rest, warned = _epoch(resumed)
    assert len(rest) == len(whole) - first - 1
    for (a, la), (b, lb) in zip(rest, whole[first + 1:], strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert resumed.skipped == expected
    assert len(warned) == 1 and "skipped 2 corrupt samples" in warned[0]
    # The next epoch starts a new record.
    assert resumed.state_dict()["skipped"] == []


def test_a_state_taken_before_the_loop_saw_the_end_reports_on_the_empty_rest(no_thread_leak):
    loader = DataLoaderX(_Samples(8, corrupt={6}), batch_size=4, on_error="skip")
    epoch = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(epoch), next(epoch)
        state = loader.state_dict()
    resumed = DataLoaderX(_Samples(8, corrupt={6}), batch_size=4, on_error="skip")
    resumed.load_state_dict(state)
    assert resumed.state_dict()["skipped"] == state["skipped"] != []
    rest, warned = _epoch(resumed)
    assert rest == [] and [s["index"] for s in resumed.skipped] == [6] and len(warned) == 1


def test_on_error_is_checked():
    with pytest.raises(ValueError, match="on_error must be 'raise' .* or 'skip'"):
        DataLoaderX(_Samples(4), batch_size=2, on_error="ignore")

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match="on_error='skip' needs a map-style dataset"):
        DataLoaderX(Stream(), batch_size=2, on_error="skip")
    loader = DataLoaderX(_Samples(4), batch_size=2, on_error="skip")
    state = loader.state_dict()
    with pytest.raises(TypeError, match="'skipped' must be a list"):
        loader.load_state_dict(dict(state, skipped="none"))
    assert "skipped" not in DataLoaderX(_Samples(4), batch_size=2).state_dict()


def test_the_loader_keeps_its_own_dataset_and_collate_fn(corrupt_root, no_thread_leak):
    # The skipping wrappers are handed to DataLoader's iterator only.
    dataset = ImageFolder(corrupt_root, train=False, size=32)
    loader = DataLoaderX(dataset, batch_size=4, num_workers=2, collate_fn=fast_collate,
                         on_error="skip")
    epoch = iter(loader)
    assert loader.dataset is dataset and loader.collate_fn is fast_collate
    next(epoch)
    epoch.close()

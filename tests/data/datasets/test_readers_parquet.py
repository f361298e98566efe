"""ParquetDataset as a training loop uses it: a Hub-layout image dataset through the fast decode
and fast_collate, with worker processes and threads, a partial last batch, corrupt and missing
images skipped and named, image_loader over it, and the extra named when pyarrow is missing."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch

pytest.importorskip("pyarrow")
pytest.importorskip("datasets", exc_type=ImportError)

import fastpipe  # noqa: E402
from fastpipe import DataLoaderX  # noqa: E402
from fastpipe.data import ParquetDataset, SampleIndex, fast_collate  # noqa: E402
from tests.helpers.parquet import CLASSES, hub_dataset  # noqa: E402

RECIPE = fastpipe.Recipe(train=True, size=24)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    rows = hub_dataset(root, rows=50, shards=3, row_group=7)
    return root, rows


def _epoch(loader) -> list[dict]:
    return [{k: v.clone() for k, v in batch.items()} for batch in loader]


def test_one_call_opens_a_hub_dataset_with_its_labels_and_classes(hub):
    root, rows = hub
    dataset = ParquetDataset(root, recipe=RECIPE, seed=3)
    assert len(dataset) == 50 and dataset.classes == list(CLASSES)
    assert dataset.targets.tolist() == [r["label"] for r in rows]
    sample = dataset[SampleIndex(7, 2)]
    assert sample["image"].shape == (3, 24, 24) and sample["image"].dtype == torch.uint8
    assert sample["label"] == rows[7]["label"]
    pair = ParquetDataset(root, fields=["image", "label"])
    image, label = pair[4]
    assert image.shape[0] == 3 and label == rows[4]["label"]  # the full decode without a recipe
    assert "3 files, samples=50" in repr(dataset)


@pytest.mark.slow
def test_batches_are_the_same_with_processes_threads_or_none_and_the_last_is_partial(hub):
    root, rows = hub
    dataset = ParquetDataset(root, recipe=RECIPE, seed=3)
    epochs = {}
    for workers, method in ((0, "process"), (2, "process"), (2, "thread")):
        loader = DataLoaderX(dataset, batch_size=16, shuffle=True, seed=1, window=2,
                             num_workers=workers, worker_method=method, collate_fn=fast_collate)
        epochs[(workers, method)] = _epoch(loader)
    reference = epochs[(0, "process")]
    assert [len(b["label"]) for b in reference] == [16, 16, 16, 2]
    order = list(DataLoaderX(dataset, batch_size=16, shuffle=True, seed=1, window=2).sampler)
    assert sorted(int(i) for i in order) == list(range(50))
    for key, batches in epochs.items():
        for got, want in zip(batches, reference, strict=True):
            assert torch.equal(got["image"], want["image"]), key
            assert torch.equal(got["label"], want["label"]), key
    # Each sample's pixels are its own (seed, epoch, index) draw, whatever loaded it.
    first = order[:16]
    want = torch.stack([dataset[i]["image"] for i in first])
    assert torch.equal(reference[0]["image"], want)
    assert reference[0]["label"].tolist() == [rows[int(i)]["label"] for i in first]


@pytest.mark.slow
def test_corrupt_and_missing_images_are_skipped_counted_and_named(tmp_path):
    hub_dataset(tmp_path, rows=30, shards=2, row_group=4, broken=(5,), missing=(21,))
    dataset = ParquetDataset(tmp_path, recipe=RECIPE, seed=0)
    loader = DataLoaderX(dataset, batch_size=8, shuffle=True, seed=2, num_workers=2,
                         collate_fn=fast_collate, on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        seen = sum(len(b["label"]) for b in loader)
    assert seen == 28
    skipped = sorted(loader.skipped, key=lambda s: s["index"])
    assert [s["index"] for s in skipped] == [5, 21]
    assert skipped[0]["sample"] == "data/train-00000-of-00002.parquet[row 5] (img_00005.JPEG)"
    assert skipped[1]["sample"] == ("data/train-00001-of-00002.parquet[row 6] "
                                    "(no image stored in 'image')")
    message = " ".join(str(w.message) for w in caught if w.category is RuntimeWarning)
    assert "skipped 2 corrupt samples" in message and "img_00005.JPEG" in message
    with pytest.raises(fastpipe.data.CorruptImageError, match=r"row 5\] \(img_00005.JPEG\)"):
        dataset[5]


@pytest.mark.slow
def test_image_loader_reads_a_split_of_a_hub_folder(hub):
    root, rows = hub
    loader = fastpipe.image_loader(str(root / "data" / "train-*.parquet"), 16, train=False,
                                   size=24, num_workers=2, device="cpu")
    labels = []
    for images, batch_labels in loader:
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 24, 24)
        labels += batch_labels.tolist()
    assert labels == [r["label"] for r in rows]


def test_without_pyarrow_the_error_names_the_extra(hub, monkeypatch):
    root, _ = hub
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'fastpipe\[parquet\]'"):
        ParquetDataset(root)

"""FileList, the shard order (fastpipe.data.shard_order) and EncodedSource: the inputs of the DALI
pipelines."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from fastpipe.data import CorruptImageError
from tests.helpers.dali import DALI_MISSING, JpegBytes, image_files

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)
pytest.importorskip("torchvision", exc_type=ImportError)

from torchvision.datasets import ImageFolder  # noqa: E402

from fastpipe.dali import EncodedSource, FileList  # noqa: E402
from fastpipe.data import shard_order  # noqa: E402

pytestmark = pytest.mark.dali


def test_folder_scan_matches_torchvision_imagefolder(sample_root):
    files = FileList.from_folder(sample_root)
    reference = ImageFolder(str(sample_root))
    assert files.classes == reference.classes
    assert files.files == [path for path, _ in reference.samples]
    assert files.targets.tolist() == [label for _, label in reference.samples]
    assert files.targets.dtype == np.int64


def test_list_file_paths_relative_to_the_list_or_root_with_spaces(tmp_path, sample_root):
    first, second = image_files(sample_root)[:2]
    folder = tmp_path / "my images"
    folder.mkdir()
    (folder / "a b.jpg").write_bytes(first.read_bytes())
    (tmp_path / "list.txt").write_text("my images/a b.jpg 3\n\n  \n" + f"{second} 1\n")
    listed = FileList.from_list_file(tmp_path / "list.txt")
    assert listed.files == [str(folder / "a b.jpg"), str(second)]
    assert listed.targets.tolist() == [3, 1] and listed.classes is None
    (tmp_path / "elsewhere.txt").write_text("a b.jpg 0\n")
    assert (FileList.from_path(tmp_path / "elsewhere.txt", root=folder).files
            == [str(folder / "a b.jpg")])
    data, label = listed.encoded(0)
    assert data.dtype == np.uint8 and data.tobytes() == first.read_bytes() and label == 3


def test_list_file_errors(tmp_path, sample_root):
    image = image_files(sample_root)[0]
    cases = {
        "empty.txt": ("\n\n", ValueError, "no 'path label' lines"),
        "negative.txt": (f"{image} -1\n", ValueError, r"negative\.txt:1: labels must be >= 0"),
        "nolabel.txt": (f"{image}\n", ValueError, r"nolabel\.txt:1: expected 'path label'"),
    }
    for name, (text, error, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(error, match=message):
            FileList.from_list_file(tmp_path / name)
    many = tmp_path / "many.txt"
    many.write_text("".join(f"gone{i}.jpg {i}\n" for i in range(20)))
    with pytest.raises(FileNotFoundError, match=r"names 20 image\(s\).*and 15 more"):
        FileList.from_list_file(many)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FileList.from_path(tmp_path / "nope.txt")


def test_file_disappearing_after_the_scan_is_named(tmp_path, sample_root):
    copy = tmp_path / "x.jpg"
    copy.write_bytes(image_files(sample_root)[0].read_bytes())
    files = FileList([copy], [0])
    copy.unlink()
    with pytest.raises(FileNotFoundError, match=r"x\.jpg disappeared"):
        files.encoded(0)


@pytest.mark.parametrize("num_samples, num_shards", [(48, 2), (47, 2), (10, 3), (2, 4)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_are_even_and_match_distributed_sampler_without_shuffle(num_samples, num_shards,
                                                                       drop_last):
    shards = [
        np.asarray(shard_order(num_samples, rank=k, world_size=num_shards, drop_last=drop_last))
        for k in range(num_shards)
    ]
    for k, shard in enumerate(shards):
        sampler = DistributedSampler(range(num_samples), num_replicas=num_shards, rank=k,
                                     shuffle=False, drop_last=drop_last)
        assert shard.tolist() == list(sampler)
    assert len({len(shard) for shard in shards}) == 1, "every rank runs the same number of steps"
    together = np.concatenate(shards)
    if num_samples % num_shards == 0:
        assert sorted(together.tolist()) == list(range(num_samples))  # disjoint and covering
    elif drop_last:
        assert (len(set(together.tolist())) == len(together)
                == num_samples - num_samples % num_shards)
    else:
        assert set(together.tolist()) == set(range(num_samples))
        assert len(together) - num_samples == num_shards - num_samples % num_shards  # repeats


def test_shuffled_shards_change_every_epoch_and_stay_disjoint():
    orders = []
    for epoch in range(3):
        shards = [np.asarray(shard_order(48, epoch=epoch, seed=9, shuffle=True, rank=k,
                                         world_size=2)) for k in range(2)]
        assert sorted(np.concatenate(shards).tolist()) == list(range(48))
        orders.append(shards[0].tolist())
    assert orders[0] != orders[1] != orders[2]
    assert (shard_order(48, epoch=1, seed=9, shuffle=True)
            != shard_order(48, epoch=1, seed=10, shuffle=True))


def test_encoded_source_epochs_batches_and_shards(sample_root):
    dataset = JpegBytes(image_files(sample_root)[:10])
    source = EncodedSource(dataset, batch_size=4, shuffle=True, seed=1)
    assert len(source) == 3 and source.num_samples == 10
    epochs = []
    for _ in range(2):
        batches = list(source)
        assert [len(data) for data, _ in batches] == [4, 4, 2]
        order = np.concatenate([labels for _, labels in batches])
        assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(10))
        for data, labels in batches:
            for blob, label in zip(data, labels, strict=True):
                assert blob is dataset.blobs[label]
        epochs.append(order.tolist())
    assert epochs[0] != epochs[1]
    source.set_epoch(0)
    assert np.concatenate([labels for _, labels in source]).tolist() == epochs[0]

    dropped = EncodedSource(dataset, batch_size=4, drop_last=True, rank=1, world_size=2)
    assert [labels.tolist() for _, labels in dropped] == [[1, 3, 5, 7]]


def test_encoded_source_accepts_bytes_and_checks_what_fetch_returns(sample_root):
    blob = image_files(sample_root)[0].read_bytes()
    pairs = [(blob, 0), (bytearray(blob), 1)]
    (data, labels), = EncodedSource(pairs, batch_size=2, fetch=pairs.__getitem__)
    assert (all(d.dtype == np.uint8 and d.tobytes() == blob for d in data)
            and labels.tolist() == [0, 1])

    def read(fetch, size=1):
        return list(EncodedSource(list(range(size)), batch_size=1, fetch=fetch))

    with pytest.raises(TypeError, match="1-D uint8 array or bytes"):
        read(lambda i: (np.zeros((2, 2), np.uint8), 0))
    with pytest.raises(TypeError, match="not an int"):
        read(lambda i: (blob, "cat"))
    with pytest.raises(TypeError, match="pair"):
        read(lambda i: blob)
    with pytest.raises(CorruptImageError, match="sample 0 of list.*empty"):
        read(lambda i: (b"", 0))
    with pytest.raises(TypeError, match="no encoded"):
        EncodedSource([1, 2], batch_size=1)
    with pytest.raises(ValueError, match="empty"):
        EncodedSource([], batch_size=1, fetch=lambda i: (blob, 0))

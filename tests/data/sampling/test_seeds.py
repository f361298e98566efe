"""Per-sample randomness (contract 2; fastpipe.data.sampling.seeds), transform= and
size=/interpolation= on the CPU path's datasets: draws are a pure function of (seed, epoch, index),
the same batches whatever num_workers, and what cannot run is refused at construction. The
auto_augment policies (fastpipe.data.datasets.per_sample) are in test_augment.py."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader

from fastpipe.data import H5Dataset, ImageDecoder, ImageFolder, fast_collate
from fastpipe.data.sampling.seeds import SampleIndex, sample_generator, sample_seed
from fastpipe.pack import pack

pytestmark = pytest.mark.timeout(180)

SIZE = 48


def _noise(image: torch.Tensor) -> torch.Tensor:
    """A user transform drawing from torch's global generator (as torchvision's do)."""
    return image ^ torch.randint(0, 2, image.shape, dtype=torch.uint8)


def _batches(dataset, num_workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = DataLoader(dataset, batch_size=8, num_workers=num_workers, collate_fn=fast_collate)
    return list(loader)


# ---------------------------------------------------------------- _random


def test_sample_index_is_an_int_with_an_epoch_and_pickles():
    index = SampleIndex(7, epoch=3)
    assert index == 7 and int(index) == 7 and index.epoch == 3
    clone = pickle.loads(pickle.dumps(index))
    assert type(clone) is SampleIndex and clone == 7 and clone.epoch == 3
    assert "epoch=3" in repr(index)


def test_sample_seed_is_a_pure_function_that_separates_its_arguments():
    assert sample_seed(1, 2, 3) == sample_seed(1, 2, 3)
    seeds = {sample_seed(s, e, i, k) for s in range(3) for e in range(3) for i in range(30)
             for k in range(2)}
    assert len(seeds) == 3 * 3 * 30 * 2
    assert all(0 <= s < 2**63 for s in seeds)
    a = torch.rand(4, generator=sample_generator(5, 1, 9))
    assert torch.equal(a, torch.rand(4, generator=sample_generator(5, 1, 9)))
    assert not torch.equal(a, torch.rand(4, generator=sample_generator(5, 2, 9)))


# ---------------------------------------------------------------- datasets


@pytest.mark.parametrize("auto_augment, transform", [(None, None), ("ra", _noise)])
@pytest.mark.slow
def test_same_batches_with_0_1_and_2_workers(sample_root, auto_augment, transform, no_thread_leak):
    """Crops, flips, the policy and the user transform's torch draws do not depend on the
    worker: torch.equal batches with num_workers 0, 1 and 2."""
    dataset = ImageFolder(sample_root, size=SIZE, seed=11, auto_augment=auto_augment,
                          transform=transform)
    runs = [_batches(dataset, workers) for workers in (0, 1, 2)]
    for other in runs[1:]:
        for (a, la), (b, lb) in zip(runs[0], other, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)


def test_same_seed_epoch_and_index_give_the_same_crop_and_another_epoch_another(sample_root):
    dataset = ImageFolder(sample_root, size=SIZE, seed=3)
    again = ImageFolder(sample_root, size=SIZE, seed=3)
    first = [dataset[i][0] for i in range(8)]
    torch.rand(100)  # the global generator does not matter
    assert all(torch.equal(a, again[i][0]) for i, a in enumerate(first))
    assert all(torch.equal(a, dataset[SampleIndex(i, 0)][0]) for i, a in enumerate(first))
    dataset.set_epoch(1)
    second = [dataset[i][0] for i in range(8)]
    assert sum(not torch.equal(a, b) for a, b in zip(first, second)) >= 7
    assert all(torch.equal(b, again[SampleIndex(i, 1)][0]) for i, b in enumerate(second))
    other_seed = ImageFolder(sample_root, size=SIZE, seed=4)
    assert sum(not torch.equal(a, other_seed[i][0]) for i, a in enumerate(first)) >= 7


def test_global_generator_is_left_as_it_was(sample_root):
    dataset = ImageFolder(sample_root, size=SIZE, seed=0, auto_augment="ra", transform=_noise)
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    dataset[0], dataset[1]
    assert torch.equal(torch.rand(3), expected)


def test_seed_none_is_drawn_from_torch_at_construction(sample_root):
    torch.manual_seed(8)
    a = ImageFolder(sample_root, size=SIZE)
    torch.manual_seed(8)
    b = ImageFolder(sample_root, size=SIZE)
    assert a.seed == b.seed and torch.equal(a[3][0], b[3][0])
    with pytest.raises(TypeError, match="seed"):
        ImageFolder(sample_root, seed=1.5)


@pytest.fixture(scope="module")
def bytes_pack(sample_root, tmp_path_factory):
    path = tmp_path_factory.mktemp("pack") / "images.h5"
    pack(sample_root, path, num_workers=1, progress=False)
    return path


@pytest.mark.hdf5
@pytest.mark.slow
def test_pack_dataset_same_batches_with_0_and_2_workers_and_matches_image_folder(
        bytes_pack, sample_root, no_thread_leak):
    """H5Dataset with an ImageDecoder draws what ImageFolder draws for the same sample."""
    decoder = ImageDecoder(train=True, size=SIZE)
    dataset = H5Dataset(bytes_pack, decoder=decoder, seed=21, auto_augment="ta_wide")
    runs = [_batches(dataset, workers) for workers in (0, 2)]
    for (a, la), (b, lb) in zip(*runs, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    folder = ImageFolder(sample_root, size=SIZE, seed=21, auto_augment="ta_wide")
    assert [folder.path(i).endswith(dataset.path(i)) for i in range(3)] == [True] * 3
    assert torch.equal(torch.stack([folder[i][0] for i in range(8)]), runs[0][0][0])
    dataset.set_epoch(2)
    assert not torch.equal(torch.stack([dataset[i][0] for i in range(8)]), runs[0][0][0])


@pytest.mark.hdf5
def test_a_custom_decoder_runs_under_the_per_sample_generator(bytes_pack):
    def decoder(data, source):
        return torch.randint(0, 255, (3, 4, 4), dtype=torch.uint8)

    dataset = H5Dataset(bytes_pack, decoder=decoder, seed=1)
    assert torch.equal(dataset[5][0], dataset[5][0])
    assert not torch.equal(dataset[5][0], dataset[6][0])


# ---------------------------------------------------------------- transform


def test_transform_runs_on_the_uint8_tensor_and_a_later_assignment_is_applied(sample_root):
    seen = []

    def record(image):
        seen.append((image.dtype, tuple(image.shape)))
        return image.flip(-1)

    dataset = ImageFolder(sample_root, train=False, size=SIZE)
    plain = dataset[2][0]
    dataset.transform = record
    assert torch.equal(dataset[2][0], plain.flip(-1))
    assert seen == [(torch.uint8, (3, SIZE, SIZE))]
    dataset.transform = None
    assert torch.equal(dataset[2][0], plain)


def test_timm_create_loader_is_refused_with_the_fastpipe_spelling(sample_root):
    """timm.data.create_loader sets dataset.transform to a PIL pipeline; fastpipe would otherwise
    hand it tensors (or, before, ignore it): refused, naming auto_augment= and transform=."""
    timm_data = pytest.importorskip("timm.data")
    dataset = ImageFolder(sample_root, size=SIZE)
    with pytest.raises(TypeError, match=r"auto_augment=.*transform="):
        timm_data.create_loader(dataset, input_size=(3, 64, 64), batch_size=4, is_training=True,
                                auto_augment="rand-m9-mstd0.5", use_prefetcher=False)
    with pytest.raises(TypeError, match="PIL pipeline"):
        dataset.transform = timm_data.create_transform(64, is_training=False)
    assert dataset.transform is None


def test_torchvision_v1_pil_conversions_are_refused(sample_root):
    import torchvision.transforms as T

    with pytest.raises(TypeError, match="ToTensor"):
        ImageFolder(sample_root, transform=T.Compose([T.RandomHorizontalFlip(), T.ToTensor()]))
    with pytest.raises(TypeError, match="callable"):
        ImageFolder(sample_root, transform=3)


# ---------------------------------------------------------------- size and interpolation


@pytest.mark.parametrize("train", [True, False])
def test_size_as_height_width(sample_root, train):
    dataset = ImageFolder(sample_root, train=train, size=(40, 56))
    image, _ = dataset[0]
    assert image.shape == (3, 40, 56) and image.is_contiguous()


def test_interpolation_takes_torchvision_modes_and_refuses_others(sample_root):
    from torchvision.transforms import InterpolationMode

    decoder = ImageDecoder(interpolation=InterpolationMode.BICUBIC)
    assert decoder.interpolation == "bicubic"
    with pytest.raises(ValueError, match="interpolation"):
        ImageFolder(sample_root, interpolation=InterpolationMode.NEAREST)
    with pytest.raises(ValueError, match="interpolation"):
        ImageDecoder(interpolation="lanczos")


@pytest.mark.parametrize("train", [True, False])
def test_bicubic_torch_fallback_within_bound_of_the_extension(sample_root, monkeypatch, train):
    """Without fastpipe._resize, torch's antialiased bicubic: within the bilinear path's bound
    (mean <= 0.5 grey levels, max <= 2) of the C++ resize for the same plan."""
    from fastpipe.data.decode import image as _decode

    if _decode._resize_pixels is None:
        pytest.skip("fastpipe._resize not built")
    data = sorted(sample_root.rglob("*.jpg"))[0].read_bytes()
    decoder = ImageDecoder(train=train, size=SIZE, interpolation="bicubic",
                           reducing_gap=float("inf"))
    fast = decoder(data, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(_decode, "_resize_pixels", None)
    monkeypatch.setattr(_decode, "_input_box", None)
    monkeypatch.setattr(_decode, "_decode_region", None)
    monkeypatch.setattr(_decode, "_decode_resize", None)
    slow = decoder(data, generator=torch.Generator().manual_seed(1))
    diff = (fast.int() - slow.int()).abs()
    assert diff.float().mean() <= 0.5 and diff.max() <= 2, (diff.float().mean(), diff.max())


@pytest.mark.parametrize("policy", ["ra", "rand-m9-mstd0.5-inc1"])
def test_pickled_dataset_with_a_policy_gives_the_same_samples(sample_root, policy):
    """Spawned workers get a pickled copy: the policy, transform and seed travel with it."""
    dataset = ImageFolder(sample_root, size=SIZE, auto_augment=policy, transform=_noise, seed=9)
    dataset.set_epoch(4)
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone.seed == 9 and clone.epoch == 4 and clone.transform is _noise
    assert all(torch.equal(dataset[i][0], clone[i][0]) for i in range(4))


class _EpochSampler(torch.utils.data.Sampler):
    """A stand-in for fastpipe's samplers: yields SampleIndex(i, epoch), epoch advanced by
    set_epoch, as DistributedSampler's."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return (SampleIndex(i, self.epoch) for i in range(self.n))

    def __len__(self) -> int:
        return self.n


def test_sample_index_reaches_persistent_workers(sample_root, no_thread_leak):
    """Persistent workers never see the main process's set_epoch; the epoch carried by each
    SampleIndex gives them the same batches as set_epoch gives num_workers=0."""
    dataset = ImageFolder(sample_root, size=SIZE, seed=5)
    sampler = _EpochSampler(16)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2,
                        persistent_workers=True, collate_fn=fast_collate)
    got = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        got.append(torch.cat([images for images, _ in loader]))
    del loader
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        expected = torch.stack([dataset[i][0] for i in range(16)])
        assert torch.equal(got[epoch], expected)
    assert not torch.equal(got[0], got[1])

"""fastpipe/data/collate/encoded.py: encoded images batched by fast_collate (decode="gpu")."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fastpipe import Recipe
from fastpipe.data import fast_collate
from fastpipe.data.collate.encoded import EncodedBatch, EncodedImage, collate_encoded
from fastpipe.data.decode.image import ImageDecoder

DECODER = ImageDecoder(recipe=Recipe(train=True, size=16))


def _images(count: int) -> list[EncodedImage]:
    rng = np.random.default_rng(count)
    return [EncodedImage(rng.integers(0, 256, 10 + 7 * i, dtype=np.uint8), tuple(range(i, i + 10)),
                         1000 + i, 40 + i, f"sample {i}", DECODER) for i in range(count)]


def test_pairs_collate_into_one_encoded_batch_and_labels():
    images = _images(5)
    batch, labels = fast_collate([(image, k % 2) for k, image in enumerate(images)])
    assert isinstance(batch, EncodedBatch) and len(batch) == 5
    assert labels.tolist() == [0, 1, 0, 1, 0]
    for i, image in enumerate(images):
        assert np.array_equal(batch.bytes_of(i), image.data)
    assert batch.plans.tolist() == [list(image.plan) for image in images]
    assert batch.seeds.tolist() == [1000 + i for i in range(5)]
    assert batch.indices.tolist() == [40 + i for i in range(5)]
    assert batch.sources == [f"sample {i}" for i in range(5)]
    assert batch.decoder is DECODER
    assert batch.data.dtype == torch.uint8 and batch.data.dim() == 1


def test_records_collate_their_encoded_field():
    images = _images(3)
    out = fast_collate([{"image": image, "label": k, "name": f"n{k}"}
                        for k, image in enumerate(images)])
    assert isinstance(out["image"], EncodedBatch) and len(out["image"]) == 3
    assert out["label"].tolist() == [0, 1, 2] and out["name"] == ["n0", "n1", "n2"]


def test_bytes_and_memoryviews_collate_like_arrays():
    image = _images(1)[0]
    as_bytes = EncodedImage(bytes(image.data), image.plan, image.seed, image.index, "b", DECODER)
    as_view = EncodedImage(memoryview(bytes(image.data)), image.plan, image.seed, image.index,
                           "m", DECODER)
    batch = collate_encoded([as_bytes, as_view])
    assert np.array_equal(batch.bytes_of(0), image.data)
    assert np.array_equal(batch.bytes_of(1), image.data)


def test_a_batch_mixing_encoded_and_decoded_images_is_refused():
    with pytest.raises(TypeError, match="one dataset decodes one way"):
        collate_encoded([_images(1)[0], torch.zeros(3, 4, 4)])


def test_it_pickles_with_its_tensors():
    batch = collate_encoded(_images(4))
    copy = pickle.loads(pickle.dumps(batch))
    assert torch.equal(copy.data, batch.data) and copy.sources == batch.sources
    assert torch.equal(copy.plans, batch.plans) and copy.decoder.recipe == DECODER.recipe


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_without_collate_fn_batches_encoded_images_as_fast_collate_does(workers):
    """DataLoader's default collate met EncodedImage as a type it did not know (a TypeError that
    named no fix): it now gathers them into the EncodedBatch fast_collate makes."""
    images = _images(6)
    samples = [(image, k % 3) for k, image in enumerate(images)]
    loader = torch.utils.data.DataLoader(samples, batch_size=3, num_workers=workers)
    batches = list(loader)
    assert len(batches) == 2
    for (batch, labels), start in zip(batches, (0, 3)):
        expected, expected_labels = fast_collate(samples[start:start + 3])
        assert isinstance(batch, EncodedBatch) and labels.tolist() == expected_labels.tolist()
        assert torch.equal(batch.data, expected.data)
        assert torch.equal(batch.offsets, expected.offsets)
        assert torch.equal(batch.plans, expected.plans)
        assert batch.sources == expected.sources

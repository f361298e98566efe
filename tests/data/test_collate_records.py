"""fast_collate on records: dicts and tuples of fields, stacked in their dtype, padded if asked."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from fastpipe.data import fast_collate


def _records(n=3, variable=False):
    out = []
    for i in range(n):
        t = 4 + i if variable else 5
        out.append({"image": torch.full((3, 2, 2), i, dtype=torch.uint8),
                    "frames": torch.arange(t * 2, dtype=torch.int64).reshape(t, 2) + i,
                    "weight": np.float32(i) / 2, "label": i, "name": f"s{i}", "raw": b"%d" % i})
    return out


def test_dicts_of_fields_stack_in_their_dtype():
    batch = fast_collate(_records())
    assert list(batch) == ["image", "frames", "weight", "label", "name", "raw"]
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (3, 3, 2, 2)
    assert batch["frames"].dtype == torch.int64 and batch["frames"].shape == (3, 5, 2)
    assert batch["weight"].dtype == torch.float32 and batch["weight"].tolist() == [0, 0.5, 1]
    assert batch["label"].dtype == torch.int64 and batch["label"].tolist() == [0, 1, 2]
    assert batch["name"] == ["s0", "s1", "s2"] and batch["raw"] == [b"0", b"1", b"2"]


def test_a_varying_length_is_refused_unless_padding_was_asked_for():
    records = _records(variable=True)
    with pytest.raises(ValueError, match=r"'frames' varies in length.*pad=True.*frames_lengths"):
        fast_collate(records)
    batch = functools.partial(fast_collate, pad=True)(records)
    assert batch["frames"].shape == (3, 6, 2) and batch["frames_lengths"].tolist() == [4, 5, 6]
    for i, record in enumerate(records):
        assert torch.equal(batch["frames"][i, :4 + i], record["frames"])
        assert not batch["frames"][i, 4 + i:].any()
    only = fast_collate(records, pad=["frames"])
    assert torch.equal(only["frames"], batch["frames"])


def test_tuples_of_two_arrays_are_records_not_image_label_pairs():
    mix = [torch.randn(4, 8) for _ in range(3)]
    zone0 = [torch.randn(8) for _ in range(3)]
    a, b = fast_collate(list(zip(mix, zone0, strict=True)))
    assert torch.equal(a, torch.stack(mix)) and torch.equal(b, torch.stack(zone0))
    x, y, label = fast_collate([(m, z, i) for i, (m, z) in enumerate(zip(mix, zone0))])
    assert label.tolist() == [0, 1, 2]


def test_image_label_pairs_are_unchanged():
    images, labels = fast_collate([(torch.zeros(3, 2, 2, dtype=torch.uint8), 3)] * 2)
    assert images.shape == (2, 3, 2, 2) and labels.tolist() == [3, 3]


def test_records_that_differ_name_the_field():
    records = _records()
    records[1]["image"] = records[1]["image"].float()
    with pytest.raises(ValueError, match="field 'image' of sample 1 is torch.float32"):
        fast_collate(records)
    with pytest.raises(ValueError, match="same fields"):
        fast_collate([{"a": 1}, {"b": 2}])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float16, torch.float32,
                                   torch.bfloat16, torch.bool, torch.complex64])
def test_stack_into_equals_torch_stack_for_every_dtype_and_layout(dtype):
    from fastpipe.data._collate_records import stack_into

    base = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5) % 7
    strided = base[1].to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    values = [base[0].to(dtype), strided, base[1].to(dtype)]
    out = torch.empty((3, 3, 4, 5), dtype=dtype)
    assert stack_into(values, out) is out
    assert torch.equal(out, torch.stack(values))


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
    from fastpipe.data.collate.records import stack_into

    base = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5) % 7
    strided = base[1].to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    assert not strided.is_contiguous()
    values = [base[0].to(dtype), strided, base[1].to(dtype)]
    out = torch.empty((3, 3, 4, 5), dtype=dtype)
    assert stack_into(values, out) is out
    assert torch.equal(out, torch.stack(values))



# --- batches read straight into one block (PackDataset.__getitems__) -------------------------

h5py = pytest.importorskip("h5py", exc_type=ImportError)


@pytest.fixture(scope="module")
def speech_pack(tmp_path_factory):
    from fastpipe.data import ArrayField
    from fastpipe.pack import pack

    rng = np.random.default_rng(0)
    records = [{"mix": rng.standard_normal((4, 160), dtype=np.float32),
                "zone0": rng.integers(0, 9, 160).astype(np.int64),
                "frames": rng.standard_normal((3 + i % 4, 5), dtype=np.float32), "id": i}
               for i in range(40)]
    path = tmp_path_factory.mktemp("blocks") / "speech.h5"
    pack(records, path, progress=False, fields={"frames": ArrayField("float32", (None, 5))})
    return path, records


@pytest.mark.parametrize("fields", [None, ["zone0", "id", "mix"]], ids=["dict", "tuple"])
def test_fixed_arrays_are_read_into_the_batch_itself(speech_pack, fields):
    """The fixed-shape arrays of a batch are read into one block each, which fast_collate returns
    as the batch (no second copy), in the order asked; other fields are collated as ever."""
    from fastpipe.data import H5Dataset
    from fastpipe.data.collate.records import Rows

    path, records = speech_pack
    dataset = H5Dataset(path, fields=fields)
    indices = [17, 3, 30, 3, 0]
    samples = dataset.__getitems__(indices)
    assert isinstance(samples, Rows)
    batch = functools.partial(fast_collate, pad=True)(samples)
    expected = functools.partial(fast_collate, pad=True)([dataset[i] for i in indices])
    names = fields or list(records[0])
    for position, name in enumerate(names):
        key = position if fields else name
        got, want = batch[key], expected[key]
        if isinstance(want, tuple):
            got, want = got[0], want[0]
        assert torch.equal(got, want), name
    blocks = samples.blocks
    assert sorted(map(str, blocks)) == sorted(map(str, [0, 2] if fields else ["mix", "zone0"]))
    for key, block in blocks.items():
        assert batch[key].data_ptr() == block.data_ptr()  # the block is the batch
    assert torch.equal(batch[2 if fields else "mix"][0], torch.from_numpy(records[17]["mix"]))


def test_a_block_whose_rows_were_replaced_is_copied(speech_pack, monkeypatch):
    from fastpipe.data import H5Dataset
    from fastpipe.data.collate import batch as collate_module

    path, records = speech_pack
    collate = functools.partial(fast_collate, pad=True)
    samples = H5Dataset(path).__getitems__([1, 2, 3])
    samples[1] = dict(samples[1], mix=samples[1]["mix"] + 1)  # a wrapper replaced a row
    batch = collate(samples)
    assert batch["mix"].data_ptr() != samples.blocks["mix"].data_ptr()
    assert torch.equal(batch["mix"][1], torch.from_numpy(records[2]["mix"]) + 1)
    assert batch["zone0"].data_ptr() == samples.blocks["zone0"].data_ptr()
    # Pinned memory asked for: the block (kept memory) is copied into it.
    pinned = []
    monkeypatch.setattr(collate_module, "_PINNED", collate_module.Memory(
        lambda shape, dtype: pinned.append(shape) or torch.empty(shape, dtype=dtype),
        lambda tensor: False))
    monkeypatch.setattr(collate_module.torch.cuda, "is_available", lambda: True)
    batch = collate(H5Dataset(path).__getitems__([4, 5]), pin_memory=True)
    assert (2, 4, 160) in pinned
    assert torch.equal(batch["mix"][0], torch.from_numpy(records[4]["mix"]))


def test_rows_of_a_users_array_are_always_copied():
    """Only a dataset's own block (named in Rows) is returned uncopied: consecutive rows of a
    user's tensor are stacked into a new batch, so the batch never aliases the user's data."""
    data = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    batch = fast_collate([{"x": data[k]} for k in range(4)])
    assert torch.equal(batch["x"], data) and batch["x"].data_ptr() != data.data_ptr()
    images = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    stacked, _ = fast_collate([(images[0], 0), (images[1], 1)])
    assert stacked.data_ptr() != images.data_ptr()


def test_blocks_under_worker_processes_and_threads(speech_pack):
    from fastpipe import DataLoaderX
    from fastpipe.data import H5Dataset

    path, records = speech_pack
    dataset = H5Dataset(path, fields=["mix", "zone0"])
    for method in ("process", "thread"):
        loader = DataLoaderX(dataset, batch_size=8, shuffle=True, num_workers=2,
                             collate_fn=fast_collate, worker_method=method, generator=None)
        seen = 0
        for mix, zone0 in loader:
            for k in range(len(mix)):
                match = [i for i, r in enumerate(records) if np.array_equal(r["mix"], mix[k])]
                assert len(match) == 1 and np.array_equal(records[match[0]]["zone0"], zone0[k])
            seen += len(mix)
        assert seen == 40


def _collate_and_say_where_the_rows_were(batch):
    """torch's default_collate, and whether the reader's rows were in shared memory."""
    return torch.utils.data.default_collate(list(batch)), batch[0][0].is_shared()


def _fast_collate_and_say_where_the_rows_were(batch):
    return fast_collate(batch), batch[0][0].is_shared()


@pytest.mark.timeout(120)
def test_in_a_plain_dataloader_worker_the_batch_is_shared_memory_once(speech_pack):
    """torch's DataLoader worker (no fastpipe arena): the collate function makes the batch's
    shared memory. The reader's block is ordinary memory there, so torch's default_collate
    (which stacks into a new segment) makes one segment a batch, not two; fast_collate copies
    the block into shared memory once."""
    from fastpipe.data import H5Dataset

    path, records = speech_pack
    dataset = H5Dataset(path, fields=["mix", "zone0"])
    for collate in (_collate_and_say_where_the_rows_were,
                    _fast_collate_and_say_where_the_rows_were):
        loader = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=1,
                                             collate_fn=collate)
        for k, ((mix, zone0), rows_shared) in enumerate(loader):
            assert not rows_shared, collate.__name__
            assert mix.is_shared() and zone0.is_shared()
            for j in range(len(mix)):
                assert np.array_equal(mix[j].numpy(), records[8 * k + j]["mix"])
                assert np.array_equal(zone0[j].numpy(), records[8 * k + j]["zone0"])

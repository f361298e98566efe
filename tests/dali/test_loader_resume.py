"""DALILoader.state_dict / load_state_dict in DALI's CPU mode: exact resumes, refusals."""

from __future__ import annotations

import random

import pytest
import torch

from tests.helpers.dali import DALI_MISSING, restore_in_fresh_process

pytest.importorskip("nvidia.dali", reason=DALI_MISSING, exc_type=ImportError)

from fastpipe.dali import DALILoader, FileList  # noqa: E402
from fastpipe.data import shard_order  # noqa: E402

pytestmark = [pytest.mark.dali, pytest.mark.timeout(240)]

# Every random draw DALI makes: crop window, flip, colour jitter, cutout position.
KWARGS = {
    "batch_size": 7, "size": 32, "device": "cpu", "seed": 5, "color_jitter": 0.4,
    "cutout_holes": 2, "cutout_size": 8, "num_workers": 2, "prefetch_depth": 2,
}


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for number, ((images, labels), (want_images, want_labels)) in enumerate(
        zip(got, expected, strict=True)
    ):
        assert torch.equal(labels, want_labels), f"batch {number}: other samples"
        assert torch.equal(images, want_images), f"batch {number}: other pixels"


@pytest.mark.slow
def test_resume_in_a_fresh_process_gives_the_uninterrupted_batches(index_list, tmp_path):
    steps = random.Random(0).sample(range(1, 6), 1)[0]  # a random step inside epoch 0
    states, batches = {}, []
    with DALILoader(index_list, **KWARGS) as loader:
        assert len(loader) == 7
        for epoch in range(3):
            for number, (images, labels) in enumerate(loader, start=1):
                batches.append((images.clone(), labels.clone()))
                runtime = loader._state.runtime
                if (epoch, number) == (0, steps):
                    # DALI's prefetch queue is full: these batches were produced, not seen.
                    assert len(runtime.feeder.in_flight) == KWARGS["prefetch_depth"]
                    states["random step"] = loader.state_dict()
                if (epoch, number) == (1, 1):
                    states["first batch of epoch 1"] = loader.state_dict()
            if epoch == 0:
                # Right after the epoch boundary: epoch 1's first batches are already in flight.
                assert len(runtime.feeder.in_flight) == KWARGS["prefetch_depth"]
                states["epoch boundary"] = loader.state_dict()
    expected = {
        "random step": batches[steps:14],
        "epoch boundary": batches[7:21],
        "first batch of epoch 1": batches[8:21],
    }
    boundary = states["epoch boundary"]
    assert (boundary["epoch"], boundary["batches_yielded"]) == (1, 0)
    for name, state in states.items():
        got = restore_in_fresh_process(index_list, state, KWARGS, tmp_path, name.replace(" ", "-"))
        assert_same_batches(got, expected[name])


def test_restored_loader_continues_the_epoch_then_runs_the_next(index_list):
    with DALILoader(index_list, **KWARGS) as loader:
        iterator = iter(loader)
        reference = [next(iterator) for _ in range(3)]
        state = loader.state_dict()
        rest = list(iterator)
        after = list(loader)
    restored = DALILoader(index_list, **{**KWARGS, "seed": 99})  # the state brings the seeds
    restored.load_state_dict(state)
    assert restored.epoch == 0
    iterator = iter(restored)
    assert len(iterator) == 4
    assert_same_batches(list(iterator), rest)
    assert restored.epoch == 1
    assert_same_batches(list(restored), after)
    restored.close()
    order = torch.cat([labels for _, labels in reference + rest]).tolist()
    assert order == shard_order(48, epoch=0, seed=5, shuffle=True)


def test_state_after_close_and_before_any_epoch(index_list):
    fresh = DALILoader(index_list, **KWARGS)
    state = fresh.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (0, 0)
    assert state["dali_checkpoint"].numel() == 0
    with DALILoader(index_list, **KWARGS) as other:
        other.load_state_dict(state)
        assert_same_batches(list(other), list(fresh))
    fresh.close()

    # close() keeps DALI's state: a rebuilt pipeline continues the randomness, so a state
    # taken after close() resumes like one taken before it.
    with DALILoader(index_list, **KWARGS) as loader:
        list(loader)
        before = loader.state_dict()
        loader.close()
        after_close = loader.state_dict()
        assert torch.equal(before["dali_checkpoint"], after_close["dali_checkpoint"])
        next_epoch = list(loader)
    with DALILoader(index_list, **KWARGS) as other:
        other.load_state_dict(after_close)
        assert_same_batches(list(other), next_epoch)


def test_state_is_plain_and_loads_with_weights_only(index_list, tmp_path):
    with DALILoader(index_list, **KWARGS) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["version"] == 1 and state["dataset"]["length"] == 48
    assert isinstance(state["dataset"]["fingerprint"], str)
    for value in [*state.values(), *state["dataset"].values()]:
        assert isinstance(value, (int, str, bool, dict, torch.Tensor)), type(value)
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    with DALILoader(index_list, **KWARGS) as other:
        other.load_state_dict(loaded)


@pytest.fixture(scope="module")
def saved_state(index_list):
    with DALILoader(index_list, **KWARGS) as loader:
        next(iter(loader))
        return loader.state_dict()


def test_state_of_another_dataset_is_refused(index_list, saved_state, tmp_path):
    files = [line.split()[0] for line in index_list.read_text().splitlines()]
    same_length_other_files = FileList(files[::-1], range(48))
    with pytest.raises(ValueError, match="saved for another dataset: saved .*'length': 48, "
                                         "'fingerprint': '[0-9a-f]+'"):
        DALILoader(same_length_other_files, **KWARGS).load_state_dict(saved_state)
    shorter = FileList(files[:40], range(40))
    with pytest.raises(ValueError, match="another dataset.*this dataset .*'length': 40"):
        DALILoader(shorter, **KWARGS).load_state_dict(saved_state)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"batch_size": 8}, "batch_size is 7, this loader's is 8"),
        ({"rank": 1, "world_size": 2}, "rank is 0, this loader's is 1"),
        ({"color_jitter": 0.2}, "recipe is"),
        ({"drop_last": True}, "drop_last"),
    ],
)
def test_state_of_another_loader_setup_is_refused(index_list, saved_state, change, message):
    loader = DALILoader(index_list, **{**KWARGS, **change})
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(saved_state)


def test_other_world_size_and_version_are_refused(index_list, saved_state):
    loader = DALILoader(index_list, **KWARGS)
    with pytest.raises(ValueError, match="version 2.*cannot be resumed"):
        loader.load_state_dict({**saved_state, "version": 2})
    with pytest.raises(ValueError, match="world_size is 2.*same world size"):
        loader.load_state_dict({**saved_state, "world_size": 2})
    with pytest.raises(TypeError, match="takes a dict from DALILoader.state_dict"):
        loader.load_state_dict({"epoch": 0})
    with pytest.warns(RuntimeWarning, match="saved with DALI 0.1"):
        loader.load_state_dict({**saved_state, "dali_version": "0.1"})


@pytest.mark.parametrize(
    "saved, restored",
    [
        ({"num_workers": 2}, {"num_workers": 1}),
        ({"prefetch_depth": 2}, {"prefetch_depth": 3}),
        ({"auto_augment": "ta_wide"}, {"auto_augment": "ta_wide"}),
    ],
    ids=["other num_workers", "other prefetch_depth", "auto_augment policy"],
)
@pytest.mark.slow
def test_resume_with_other_threads_queue_depth_or_a_policy(index_list, saved, restored):
    base = {"batch_size": 8, "size": 32, "device": "cpu", "seed": 2, "cutout_holes": 1}
    with DALILoader(index_list, **base, **saved) as loader:
        iterator = iter(loader)
        next(iterator), next(iterator)
        state = loader.state_dict()
        expected = list(iterator) + list(loader)
    with DALILoader(index_list, **base, **restored) as other:
        other.load_state_dict(state)
        assert_same_batches(list(other) + list(other), expected)


def test_a_state_without_dalis_checkpoint_warns_on_save_and_load(index_list, monkeypatch):
    from fastpipe.dali.loader import _Runtime

    def fail(self):
        raise RuntimeError("checkpointing is not supported by this operator")

    with DALILoader(index_list, **KWARGS) as loader:
        iterator = iter(loader)
        next(iterator)
        monkeypatch.setattr(_Runtime, "checkpoint", fail)
        with pytest.warns(RuntimeWarning, match="not supported by this operator.*same order"):
            state = loader.state_dict()
        monkeypatch.undo()
        expected = list(iterator)
    assert state["exact"] is False and state["dali_checkpoint"].numel() == 0
    with DALILoader(index_list, **KWARGS) as other:
        with pytest.warns(RuntimeWarning, match="augmentation draws differ"):
            other.load_state_dict(state)
        got = list(other)
    # The same samples in the same order; the pixels come from other draws.
    assert [labels.tolist() for _, labels in got] == [labels.tolist() for _, labels in expected]
    assert not torch.equal(got[0][0], expected[0][0])

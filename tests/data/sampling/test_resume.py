"""Resume mid-epoch (docs/resume.md): the batches after a restore, in a fresh process, are the
batches an uninterrupted run yields from that point, compared with torch.equal.

The dataset here follows contract 2: every random draw for sample i comes from a generator seeded
by (seed, epoch, i), with the epoch taken from the SampleIndex the sampler yields, so the batches
do not depend on which worker, or how many, loaded them.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastpipe
from fastpipe import DataLoaderX, DataPrefetcher
from fastpipe._background import BackgroundIterator
from fastpipe._threads import ThreadEpoch
from fastpipe.data import DistributedSampler, RandomSampler, SampleIndex, SequentialSampler
from fastpipe.data.sampling.resume import HandOff, StatesAhead
from tests.helpers.cuda import RecordingStreams
from tests.helpers.process import run_ranks

pytestmark = pytest.mark.timeout(180)

REPO = Path(fastpipe.__file__).resolve().parent.parent


class Augmented(Dataset):
    """``(image (2, 3) float, label)``: the image is random per (seed, epoch, index), contract 2."""

    def __init__(self, length: int = 29, seed: int = 11) -> None:
        self.length, self.seed = length, seed
        self.epoch = 0

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        epoch = index.epoch if isinstance(index, SampleIndex) else self.epoch
        seed = np.random.SeedSequence([self.seed, epoch, int(index)]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(seed))
        return torch.rand(2, 3, generator=generator) + int(index), int(index)


class Fingerprinted(Augmented):
    """A dataset that names its files, as ImageFolder and the packs do."""

    def __init__(self, length: int, files: str) -> None:
        super().__init__(length)
        self.files = files

    def fingerprint(self) -> str:
        return self.files


# One loader configuration, as a dict (it crosses to the restoring process as JSON).
def build(config: dict) -> DataLoaderX | DataPrefetcher:
    dataset = _dataset(config)
    kwargs = dict(
        batch_size=config.get("batch_size", 4),
        num_workers=config["num_workers"],
        persistent_workers=config.get("persistent_workers", False),
        drop_last=config.get("drop_last", False),
    )
    if "dataset" in config:  # fastpipe's image datasets: uint8 images, fast_collate
        from fastpipe.data import fast_collate

        kwargs["collate_fn"] = fast_collate
        kwargs["worker_method"] = config.get("worker_method", "process")
    if "world_size" in config:
        sampler = DistributedSampler(
            dataset, world_size=config["world_size"], rank=config["rank"], seed=5
        )
        loader = DataLoaderX(dataset, sampler=sampler, **kwargs)
    else:
        loader = DataLoaderX(dataset, shuffle=config.get("shuffle", True), seed=5, **kwargs)
    if config.get("prefetcher"):
        return DataPrefetcher(loader, device="cpu")
    return loader


def _dataset(config: dict) -> Dataset:
    """The synthetic dataset, or ImageFolder / H5Dataset over real JPEGs (train crops, flips and
    RandAugment, all drawn per (seed, epoch, index))."""
    kind = config.get("dataset")
    if kind is None:
        return Augmented(config.get("length", 29))
    from fastpipe.data import H5Dataset, ImageDecoder, ImageFolder

    if kind == "folder":
        return ImageFolder(config["root"], train=True, size=32, auto_augment="ra", seed=13)
    return H5Dataset(config["pack"], decoder=ImageDecoder(train=True, size=32),
                     auto_augment="ra", seed=13)


def epoch_batches(loader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


def wait_until_prefetch_queue_is_full(iterator, timeout: float = 20.0) -> None:
    """Waits until the loader's background queue holds as many batches as it can (with thread
    workers: until every batch the threads load ahead is loaded)."""
    inner = iterator
    # DataPrefetcher -> DataLoaderX -> BackgroundIterator, or the thread workers' ThreadEpoch
    while not hasattr(inner, "_items") and not isinstance(inner, ThreadEpoch):
        inner = inner._batches
    if isinstance(inner, ThreadEpoch):
        pending = inner._batches.gi_frame.f_locals["pending"]  # thread_batches' futures

        def full() -> bool:
            return len(pending) > 0 and all(f.done() for f in list(pending))
    else:
        full = inner._items.full
    deadline = time.monotonic() + timeout
    while not full():
        assert time.monotonic() < deadline, "the prefetch queue never filled"
        time.sleep(0.01)


def interrupt(config: dict, epoch: int, step: int | None, full_queue: bool = False) -> dict:
    """Runs ``epoch`` epochs whole, then ``step`` batches of the next; returns the state then.

    ``step=None``: the state right after the loop over the last whole epoch ended.
    """
    loader = build(config)
    for _ in range(epoch):
        epoch_batches(loader)
    if step is not None:
        batches = iter(loader)
        for _ in range(step):
            next(batches)
        if full_queue:
            wait_until_prefetch_queue_is_full(batches)
    state = loader.state_dict()
    loader.close()
    return state


def restore_in_fresh_process(jobs: list[tuple[dict, Path, Path]], tmp_path: Path) -> None:
    """Each job (config, state file, output file): load the state, save two epochs of batches."""
    spec = tmp_path / "jobs.json"
    spec.write_text(json.dumps([[c, str(s), str(o)] for c, s, o in jobs]))
    script = (
        "import json, sys, torch\n"
        f"sys.path[:0] = [{str(REPO)!r}]\n"
        "import tests.data.sampling.test_resume as t\n"
        f"for config, state, out in json.load(open({str(spec)!r})):\n"
        "    loader = t.build(config)\n"
        "    loader.load_state_dict(torch.load(state, weights_only=True))\n"
        "    torch.save([t.epoch_batches(loader), t.epoch_batches(loader)], out)\n"
        "    loader.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=150, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same(expected: list, actual: list, what: str) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} batches, expected {len(expected)}"
    for number, ((images, labels), (want_images, want_labels)) in enumerate(zip(actual, expected)):
        assert torch.equal(labels, want_labels), f"{what}, batch {number}: {labels}, {want_labels}"
        assert torch.equal(images, want_images), f"{what}, batch {number}: images differ"


CONFIGS = {
    "w0": dict(num_workers=0),
    "w2": dict(num_workers=2),
    "w2_persistent": dict(num_workers=2, persistent_workers=True),
    "w2_drop_last": dict(num_workers=2, drop_last=True, batch_size=5),
    "sequential_w0": dict(num_workers=0, shuffle=False),
    "prefetcher_w0": dict(num_workers=0, prefetcher=True),
    "prefetcher_w2": dict(num_workers=2, prefetcher=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS) + ["folder_prefetcher_w2", "h5_w2_threads"])
@pytest.mark.slow
def test_restored_in_a_fresh_process_yields_the_uninterrupted_batches(name, tmp_path,
                                                                      sample_root):
    config = CONFIGS.get(name)
    if name == "folder_prefetcher_w2":
        config = dict(dataset="folder", root=str(sample_root), num_workers=2, prefetcher=True,
                      batch_size=8)
    elif name == "h5_w2_threads":
        from fastpipe.pack import pack

        path = tmp_path / "sample.h5"
        pack(sample_root, path, progress=False)
        config = dict(dataset="h5", pack=str(path), num_workers=2, worker_method="thread",
                      batch_size=8)
    reference = build(config)
    uninterrupted = [epoch_batches(reference) for _ in range(3)]
    reference.close()
    per_epoch = len(uninterrupted[0])
    step = random.Random(name).randrange(1, per_epoch - 1)
    # (epoch, batches received in it, wait for a full prefetch queue before saving)
    points = [
        (1, step, False),  # a random step
        # After an epoch's last batch, before the loop saw the end: the restored loader ends that
        # epoch without batches, then goes on (torchdata's rule).
        (0, per_epoch, False),
        (1, None, False),  # right after the loop over an epoch ended
        (1, 0, False),  # right after the next epoch's iter()
        (0, 1, True),  # with the background queue full of batches never received
    ]
    jobs = []
    for number, (epoch, received, full_queue) in enumerate(points):
        state = interrupt(config, epoch, received, full_queue)
        torch.save(state, tmp_path / f"state{number}.pt")
        jobs.append((config, tmp_path / f"state{number}.pt", tmp_path / f"out{number}.pt"))
    restore_in_fresh_process(jobs, tmp_path)
    for number, (epoch, received, _) in enumerate(points):
        received = received or 0
        rest, following = torch.load(tmp_path / f"out{number}.pt", weights_only=True)
        where = f"{name}, interrupted at epoch {epoch} batch {received}"
        assert_same(uninterrupted[epoch][received:], rest, where + ", rest of that epoch")
        assert_same(uninterrupted[epoch + 1], following, where + ", the next epoch")


def test_a_loop_that_calls_set_epoch_and_saves_its_epoch_stays_in_step_after_a_restore(
    no_thread_leak,
):
    reference = build(dict(num_workers=0))
    uninterrupted = []
    for epoch in range(3):
        reference.sampler.set_epoch(epoch)
        uninterrupted.append(epoch_batches(reference))
    per_epoch = len(uninterrupted[0])
    for saved_at in (2, per_epoch):  # mid-epoch, and in the loop right after the last batch
        loader = build(dict(num_workers=0))
        loader.sampler.set_epoch(0)
        batches = iter(loader)
        for _ in range(saved_at):
            next(batches)
        checkpoint = {"data": loader.state_dict(), "epoch": 0}
        loader.close()
        restored = build(dict(num_workers=0))
        restored.load_state_dict(checkpoint["data"])
        seen = []
        for epoch in range(checkpoint["epoch"], 3):
            restored.sampler.set_epoch(epoch)
            seen.append(epoch_batches(restored))
        assert_same(uninterrupted[0][saved_at:], seen[0], f"saved at {saved_at}, epoch 0")
        assert_same(uninterrupted[1], seen[1], f"saved at {saved_at}, epoch 1")
        assert_same(uninterrupted[2], seen[2], f"saved at {saved_at}, epoch 2")


@pytest.mark.slow
def test_a_state_resumes_with_another_number_of_workers(tmp_path):
    saved_with = dict(num_workers=2, persistent_workers=True)
    reference = build(saved_with)
    uninterrupted = [epoch_batches(reference) for _ in range(2)]
    reference.close()
    torch.save(interrupt(saved_with, 0, 3, full_queue=True), tmp_path / "state.pt")
    jobs = [(dict(num_workers=n), tmp_path / "state.pt", tmp_path / f"out{n}.pt") for n in (0, 1)]
    restore_in_fresh_process(jobs, tmp_path)
    for n in (0, 1):
        rest, following = torch.load(tmp_path / f"out{n}.pt", weights_only=True)
        assert_same(uninterrupted[0][3:], rest, f"restored with num_workers={n}")
        assert_same(uninterrupted[1], following, f"restored with num_workers={n}, next epoch")


def test_the_same_batches_whatever_the_number_of_workers(no_thread_leak):
    runs = {}
    for num_workers in (0, 1, 2):
        loader = build(dict(num_workers=num_workers, persistent_workers=num_workers > 0))
        runs[num_workers] = [epoch_batches(loader) for _ in range(2)]
        loader.close()
    for num_workers in (1, 2):
        for epoch in range(2):
            assert_same(runs[0][epoch], runs[num_workers][epoch], f"{num_workers} workers")
    # The draws follow the epoch: epoch 1's images of a sample differ from epoch 0's.
    first, second = (
        {int(label): image for images, labels in epoch for image, label in zip(images, labels)}
        for epoch in runs[0]
    )
    assert not any(torch.equal(first[i], second[i]) for i in first)


def test_prefetcher_state_is_at_the_batches_it_handed_out_not_the_ones_in_flight(
    no_thread_leak,
):
    loader = build(dict(num_workers=0))
    expected = [epoch_batches(loader) for _ in range(1)][0]
    prefetcher = build(dict(num_workers=0, prefetcher=True))
    batches = iter(prefetcher)
    for _ in range(2):
        next(batches)
    wait_until_prefetch_queue_is_full(batches)
    state = prefetcher.state_dict()
    # The loader underneath has gone further ahead than the loop.
    assert prefetcher.loader.state_dict()["sampler"]["position"] > 2 * 4
    assert state["loader"]["sampler"]["position"] == 2 * 4
    prefetcher.close()
    restored = build(dict(num_workers=0, prefetcher=True))
    restored.load_state_dict(state)
    assert_same(expected[2:], epoch_batches(restored), "prefetcher restored in process")


def test_prefetcher_next_api_resumes_after_the_last_batch_it_returned(no_thread_leak):
    expected = epoch_batches(build(dict(num_workers=0)))
    prefetcher = build(dict(num_workers=0, prefetcher=True))
    for _ in range(2):
        prefetcher.next()
    state = prefetcher.state_dict()
    prefetcher.close()
    restored = build(dict(num_workers=0, prefetcher=True))
    restored.load_state_dict(state)
    rest = []
    while (batch := restored.next()) is not None:
        rest.append(batch)
    assert_same(expected[2:], rest, "apex-style next()")


def test_prefetcher_stream_path_counts_the_batch_on_the_side_stream_as_not_received(
    monkeypatch, no_thread_leak,
):
    import fastpipe.prefetch as prefetch_module

    monkeypatch.setattr(prefetch_module, "streams_for", lambda device: RecordingStreams())
    loader = build(dict(num_workers=0))
    expected = epoch_batches(loader)
    loader.close()
    prefetcher = build(dict(num_workers=0, prefetcher=True))
    batches = iter(prefetcher)
    for _ in range(3):
        next(batches)
    # The stream path has already taken batch 4 from the loader and copied it on the side stream.
    assert prefetcher.loader.state_dict()["sampler"]["position"] >= 4 * 4
    state = prefetcher.state_dict()
    assert state["loader"]["sampler"]["position"] == 3 * 4
    prefetcher.close()
    restored = build(dict(num_workers=0, prefetcher=True))
    restored.load_state_dict(state)
    assert_same(expected[3:], epoch_batches(restored), "stream path restored")


def test_state_is_plain_and_survives_torch_save_with_weights_only(tmp_path, no_thread_leak):
    loader = build(dict(num_workers=0))
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    loader.close()
    assert state["version"] == 1
    assert state["dataset"] == {"length": 29, "fingerprint": None}
    assert state["sampler"]["position"] == 4 and state["sampler"]["epoch"] == 0
    torch.save(state, tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True) == state
    from torch.distributed.checkpoint.stateful import Stateful

    assert isinstance(loader, Stateful)
    assert isinstance(DataPrefetcher(loader, device="cpu"), Stateful)


def test_a_state_from_another_dataset_or_version_is_refused_and_not_applied(no_thread_leak):
    loader = DataLoaderX(Fingerprinted(29, "a"), batch_size=4, shuffle=True, seed=1)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    loader.close()
    assert state["dataset"] == {"length": 29, "fingerprint": "a"}
    other_files = DataLoaderX(Fingerprinted(29, "b"), batch_size=4, shuffle=True, seed=1)
    with pytest.raises(ValueError, match="another dataset.*'a'.*'b'"):
        other_files.load_state_dict(state)
    shorter = DataLoaderX(Fingerprinted(28, "a"), batch_size=4, shuffle=True, seed=1)
    with pytest.raises(ValueError, match="another dataset.*29.*28"):
        shorter.load_state_dict(state)
    newer = dict(state, version=2)
    same = DataLoaderX(Fingerprinted(29, "a"), batch_size=4, shuffle=True, seed=1)
    with pytest.raises(ValueError, match="version 2"):
        same.load_state_dict(newer)
    unshuffled = DataLoaderX(Fingerprinted(29, "a"), batch_size=4, shuffle=False)
    with pytest.raises(ValueError, match="'RandomSampler' sampler, not a SequentialSampler"):
        unshuffled.load_state_dict(state)
    # Nothing was applied by the refusals: it still starts at epoch 0, batch 0.
    assert same.state_dict()["sampler"]["position"] == 0
    with pytest.raises(ValueError, match="version 2"):
        DataPrefetcher(same, device="cpu").load_state_dict(dict(version=2, loader=state))


def test_the_kit_counts_what_the_loop_received_and_keeps_the_state_of_the_last_batch(
    no_thread_leak,
):
    hand_off = HandOff()
    epoch = hand_off.counted(iter(BackgroundIterator(iter(range(5)), prefetch_depth=3)))
    assert [next(epoch), next(epoch)] == [0, 1]
    assert (hand_off.batches, hand_off.end_seen) == (2, False)  # whatever was read ahead
    assert epoch.thread.name == "fastpipe-background"  # other attributes: the wrapped one's
    assert list(epoch) == [2, 3, 4]
    assert (hand_off.batches, hand_off.end_seen) == (5, True)

    position = [0]
    states = StatesAhead(lambda: {"position": position[0]})
    for _ in range(3):  # three batches read ahead
        position[0] += 1
        states.take()
    assert states.current == {"position": 0}
    states.handed()
    assert states.current == {"position": 1}
    states.caught_up()  # batches still ahead: the loop is not at the reader's position
    assert states.current == {"position": 1}
    states.handed()
    states.handed()
    position[0] += 1  # the reader found the end, which moved it on
    states.caught_up()
    assert states.current == {"position": 4}


def test_a_sampler_it_cannot_restore_is_refused_with_the_fix(no_thread_leak):
    dataset = Augmented()
    plain = DataLoaderX(dataset, sampler=torch.utils.data.RandomSampler(dataset), batch_size=4)
    with pytest.raises(TypeError, match="fastpipe.data.RandomSampler"):
        plain.state_dict()
    with pytest.raises(TypeError, match="fastpipe.data.RandomSampler"):
        plain.load_state_dict({})
    custom = DataLoaderX(dataset, batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(TypeError, match="custom batch_sampler"):
        custom.state_dict()
    with pytest.raises(TypeError, match="state_dict"):
        DataPrefetcher([torch.zeros(1)], device="cpu").state_dict()
    with pytest.raises(ValueError, match="seed= seeds the sampler"):
        DataLoaderX(dataset, sampler=SequentialSampler(dataset), seed=3)
    # The prefetcher still runs over a loader that cannot save its position.
    assert len(list(DataPrefetcher(plain, device="cpu"))) == 8


def test_shuffle_builds_a_seeded_resumable_sampler():
    dataset = Augmented()
    shuffled = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=9)
    assert isinstance(shuffled.sampler, RandomSampler)
    assert isinstance(shuffled.sampler, torch.utils.data.RandomSampler)  # what Lightning checks
    assert shuffled.sampler.seed == 9
    assert isinstance(DataLoaderX(dataset, batch_size=4).sampler, SequentialSampler)
    torch.manual_seed(0)
    first = DataLoaderX(dataset, shuffle=True).sampler.seed
    torch.manual_seed(0)
    assert DataLoaderX(dataset, shuffle=True).sampler.seed == first
    generated = DataLoaderX(dataset, shuffle=True, generator=torch.Generator().manual_seed(4))
    again = DataLoaderX(dataset, shuffle=True, generator=torch.Generator().manual_seed(4))
    assert generated.sampler.seed == again.sampler.seed


# Samplers on their own.


def test_distributed_sampler_yields_torchs_order_as_sample_indices():
    for drop_last in (False, True):
        for world_size in (1, 2, 3):
            for rank in range(world_size):
                ours = DistributedSampler(
                    range(23), world_size=world_size, rank=rank, seed=4, drop_last=drop_last
                )
                theirs = torch.utils.data.DistributedSampler(
                    range(23), num_replicas=world_size, rank=rank, seed=4, drop_last=drop_last
                )
                for epoch in range(3):
                    theirs.set_epoch(epoch)  # ours moves on by itself
                    indices = list(ours)
                    assert indices == list(theirs)
                    assert {index.epoch for index in indices} == {epoch}
                assert len(ours) == len(theirs)


def test_random_sampler_order_is_a_function_of_seed_and_epoch():
    a, b = RandomSampler(range(50), seed=3), RandomSampler(range(50), seed=3)
    epochs = [list(a) for _ in range(3)]
    assert [list(b) for _ in range(3)] == epochs
    assert epochs[0] != epochs[1] and sorted(epochs[0]) == list(range(50))
    b.set_epoch(1)
    assert list(b) == epochs[1]
    assert list(RandomSampler(range(50), seed=4)) != epochs[0]


def test_sampler_state_continues_the_iteration_and_set_epoch_keeps_a_resumed_position():
    sampler = RandomSampler(range(20), seed=2)
    list(sampler)
    indices = iter(sampler)
    head = [next(indices) for _ in range(7)]
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (1, 7)
    tail = list(indices)
    restored = RandomSampler(range(20), seed=99)
    restored.load_state_dict(state)
    restored.set_epoch(1)  # what a training loop does at the top of the resumed epoch
    assert list(restored) == tail and restored.epoch == 2
    assert len(head + tail) == 20
    with pytest.raises(ValueError, match="saved for 20 samples, but the dataset has 21"):
        RandomSampler(range(21)).load_state_dict(state)


def test_a_corrupt_sampler_state_is_refused_before_anything_changes():
    sampler = DistributedSampler(range(20), world_size=2, rank=0, seed=0)
    state = sampler.state_dict()
    for broken in (dict(state, position=11), {k: v for k, v in state.items() if k != "history"}):
        target = DistributedSampler(range(20), world_size=3, rank=0, seed=1)
        with pytest.raises(ValueError, match="corrupt|lacks"):
            target.load_state_dict(broken)
        assert target.state_dict()["seed"] == 1 and target._history == []


def test_sample_index_is_an_int_that_pickles_with_its_epoch():
    import pickle

    index = SampleIndex(7, epoch=3)
    copy = pickle.loads(pickle.dumps(index))
    assert copy == 7 and copy.epoch == 3 and isinstance(copy, int)
    assert str(index) == "7" and f"{index:03d}" == "007" and index + 1 == 8


# DDP.


def test_distributed_rank_refuses_another_ranks_state():
    sampler = DistributedSampler(range(20), world_size=2, rank=1, seed=0)
    with pytest.raises(ValueError, match="saved by rank 1 of 2, but this sampler is rank 0"):
        DistributedSampler(range(20), world_size=2, rank=0, seed=0).load_state_dict(
            sampler.state_dict()
        )


@pytest.mark.parametrize("new_world_size", [1, 3])
def test_another_world_size_finishes_the_epoch_resharded_without_loss_or_duplicates(
    new_world_size, no_thread_leak
):
    # 2 ranks x 2 batches x 3 consumed 12; the other 18 divide evenly over 1 or 3 ranks.
    length, batch_size, received = 30, 3, 2
    seen, states = [], []
    for rank in range(2):
        config = dict(num_workers=0, length=length, batch_size=batch_size, world_size=2, rank=rank)
        loader = build(config)
        batches = iter(loader)
        seen += [int(i) for _ in range(received) for i in next(batches)[1]]
        states.append(loader.state_dict())
        loader.close()
    for rank in range(new_world_size):
        config.update(world_size=new_world_size, rank=rank)
        loader = build(config)
        loader.load_state_dict(states[rank % 2])
        seen += [int(i) for _, labels in loader for i in labels]
        # The next epoch is sharded the ordinary way for the new world size.
        sampler = DistributedSampler(range(length), world_size=new_world_size, rank=rank, seed=5)
        sampler.set_epoch(1)
        assert [int(i) for _, labels in loader for i in labels] == list(sampler)
    assert sorted(seen) == list(range(length)), "the interrupted epoch lost or repeated samples"


_DDP_SCRIPT = """
import os, sys, torch, torch.distributed as dist
sys.path[:0] = [{repo!r}]
import tests.data.sampling.test_resume as t
from fastpipe import DataLoaderX
from fastpipe.data import DistributedSampler
dist.init_process_group("gloo")
rank, phase, folder = dist.get_rank(), sys.argv[1], sys.argv[2]
def loader():
    dataset = t.Augmented(26)
    return DataLoaderX(dataset, batch_size=3, sampler=DistributedSampler(dataset, seed=8),
                       num_workers=int(sys.argv[3]))
if phase == "save":
    full = loader()
    torch.save([t.epoch_batches(full), t.epoch_batches(full)], f"{{folder}}/full{{rank}}.pt")
    interrupted = loader()
    batches = iter(interrupted)
    for _ in range(2):
        next(batches)
    dist.barrier()
    torch.save(interrupted.state_dict(), f"{{folder}}/state{{rank}}.pt")
else:
    restored = loader()
    restored.load_state_dict(torch.load(f"{{folder}}/state{{rank}}.pt", weights_only=True))
    rest = [t.epoch_batches(restored), t.epoch_batches(restored)]
    torch.save(rest, f"{{folder}}/rest{{rank}}.pt")
checked = torch.tensor([rank + 1])
dist.all_reduce(checked)
assert int(checked) == 3
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_gloo_ranks_resumed_mid_epoch_reproduce_both_streams(tmp_path):
    num_workers = 1  # worker processes inside each rank; other counts are covered above
    script = tmp_path / "ddp.py"
    script.write_text(_DDP_SCRIPT.format(repo=str(REPO)))
    run_ranks([sys.executable, str(script), "save", str(tmp_path), str(num_workers)], 2,
              timeout=120, cwd=REPO)
    run_ranks([sys.executable, str(script), "resume", str(tmp_path), str(num_workers)], 2,
              timeout=120, cwd=REPO)  # fresh processes
    labels = []
    for rank in range(2):
        full = torch.load(tmp_path / f"full{rank}.pt", weights_only=True)
        rest = torch.load(tmp_path / f"rest{rank}.pt", weights_only=True)
        assert_same(full[0][2:], rest[0], f"rank {rank}, rest of the epoch")
        assert_same(full[1], rest[1], f"rank {rank}, next epoch")
        labels += [int(i) for _, batch_labels in full[0] for i in batch_labels]
    assert sorted(labels) == list(range(26)), "the two ranks' shares cover the dataset once"


class _Pictures(Augmented):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = super().__getitem__(index)
        return image.reshape(1, 2, 3).expand(3, 2, 3).contiguous(), label


def test_prefetcher_state_carries_its_batch_transform_at_the_handed_batch(no_thread_leak):
    from fastpipe.ops import Mixup

    def prefetcher(mixer_seed: int) -> DataPrefetcher:
        loader = DataLoaderX(_Pictures(29), batch_size=4, shuffle=True, seed=5, num_workers=0)
        mixer = Mixup(mixup_alpha=1.0, cutmix_alpha=1.0, num_classes=29,
                      generator=torch.Generator().manual_seed(mixer_seed))
        return DataPrefetcher(loader, device="cpu", batch_transform=mixer, prefetch_depth=3)

    whole = epoch_batches(prefetcher(0))
    interrupted = prefetcher(0)
    batches = iter(interrupted)
    for _ in range(3):
        next(batches)
    wait_until_prefetch_queue_is_full(batches)  # batches mixed ahead, never received
    state = interrupted.state_dict()
    interrupted.close()
    assert "batch_transform" in state
    resumed = prefetcher(1)  # another seed: only the restored state can give the same draws
    resumed.load_state_dict(state)
    assert_same(whole[3:], epoch_batches(resumed), "prefetcher with Mixup, resumed at batch 3")
    resumed.close()


def _crops(sample_root, seed, state=None, batches=4):
    from fastpipe.data import ImageFolder, fast_collate

    dataset = ImageFolder(sample_root, size=32, seed=seed)
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=11, collate_fn=fast_collate)
    if state is not None:
        loader.load_state_dict(state)
    out, saved = [], None
    for k, (images, _) in enumerate(loader):
        out.append(images.clone())
        if k == 1:
            saved = loader.state_dict()
        if len(out) == batches:
            break
    return out, saved


def test_a_restart_with_seed_none_replays_the_same_crops(sample_root, no_thread_leak):
    # The augmentation seed drawn for seed=None is saved, so the resumed batches are the ones the
    # uninterrupted run got (the order alone resumed before, with other crops).
    full, state = _crops(sample_root, seed=None)
    assert state["augmentation"]["seed"] is not None
    resumed, _ = _crops(sample_root, seed=None, state=state, batches=2)
    assert all(torch.equal(a, b) for a, b in zip(resumed, full[2:], strict=True))


@pytest.mark.parametrize("when", ["after an epoch", "within an epoch", "through a prefetcher"])
def test_a_state_loaded_into_a_loader_with_running_persistent_workers_reaches_them(
        sample_root, when, no_thread_leak):
    # Persistent workers hold the copy of the dataset made when they started: a seed the state
    # restores in this process must start them again, or they crop with the seed they had.
    from fastpipe.data import ImageFolder, fast_collate

    full, state = _crops(sample_root, seed=None)
    dataset = ImageFolder(sample_root, size=32, seed=None)
    assert dataset.seed != state["augmentation"]["seed"]
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=11, collate_fn=fast_collate,
                         num_workers=2, persistent_workers=True)
    target = DataPrefetcher(loader, device="cpu") if when == "through a prefetcher" else loader
    if when == "after an epoch":
        assert len(list(target)) > 2  # the workers are up, with the drawn seed
        running = None
    else:  # rolled back inside the loop: the epoch's thread is reading ahead
        running = iter(target)
        next(running)
    target.load_state_dict(state if target is loader else {"version": state["version"],
                                                          "loader": state})
    if running is not None:  # the epoch it was in is ended
        assert list(running) == []
    resumed = [images.clone() for images, _ in itertools.islice(target, 2)]
    assert all(torch.equal(a, b) for a, b in zip(resumed, full[2:], strict=True))
    target.close()
    del target, loader, running


def test_a_restart_with_another_chosen_seed_is_refused(sample_root, no_thread_leak):
    _, state = _crops(sample_root, seed=5)
    with pytest.raises(ValueError, match="saved with the dataset's seed 5.*seed=6"):
        _crops(sample_root, seed=6, state=state)
    resumed, _ = _crops(sample_root, seed=5, state=state, batches=1)
    assert len(resumed) == 1

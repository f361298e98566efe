"""The shard-aware order (fastpipe/data/sampling/order.py) and the samplers that use it: windows of
shards, a pure function of (seed, epoch), the same global order whatever the ranks, resumable,
and refused where it cannot apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastpipe import DataLoaderX
from fastpipe.data import DistributedSampler, RandomSampler, shard_order
from fastpipe.data.sampling.order import (
    shard_plan,
    shard_starts,
    windowed_permutation,
)
from fastpipe.data.sampling.seeds import sample_seed

SIZES = [5, 9, 1, 7, 4, 8, 6, 3]  # 43 samples in 8 shards of unequal sizes


class Sharded(torch.utils.data.Dataset):
    def __init__(self, sizes=SIZES) -> None:
        self.sizes = list(sizes)

    def __len__(self) -> int:
        return sum(self.sizes)

    def __getitem__(self, index):
        return int(index)

    def shard_sizes(self):
        return np.array(self.sizes)


def _shard_of(indices, sizes=SIZES):
    return np.searchsorted(shard_starts(sizes), indices, side="right") - 1


@pytest.mark.parametrize("window", [1, 2, 3, 8, 50])
def test_each_window_holds_every_sample_of_its_shards_and_nothing_else(window):
    order = windowed_permutation(SIZES, window, seed=4, epoch=1)
    assert sorted(order.tolist()) == list(range(43))
    shards = _shard_of(order)
    # The shards in the order they first appear, cut into windows of `window`.
    sequence = list(dict.fromkeys(shards.tolist()))
    assert sorted(sequence) == list(range(8))
    position = 0
    for start in range(0, 8, window):
        members = sequence[start:start + window]
        count = sum(SIZES[s] for s in members)
        assert set(shards[position:position + count].tolist()) == set(members)
        position += count
    assert position == 43


def test_the_order_is_a_pure_function_of_seed_and_epoch_and_mixes_shards():
    a = windowed_permutation(SIZES, 3, seed=4, epoch=1)
    assert np.array_equal(a, windowed_permutation(list(SIZES), 3, seed=4, epoch=1))
    assert not np.array_equal(a, windowed_permutation(SIZES, 3, seed=4, epoch=2))
    assert not np.array_equal(a, windowed_permutation(SIZES, 3, seed=5, epoch=1))
    # Inside a window the shards' samples are interleaved, not read shard after shard.
    shards = _shard_of(a)
    assert (np.diff(shards[:10]) != 0).sum() > 2
    assert not a.flags.writeable  # shared between callers: nobody may change it


def test_the_keys_are_the_per_sample_seeds_so_no_library_version_changes_the_order():
    # One shard and one window: the order is the samples sorted by their sample_seed key.
    order = windowed_permutation([20], 1, seed=9, epoch=3).tolist()
    keys = [sample_seed(9, 3, i, 0x5341) for i in range(20)]
    assert order == sorted(range(20), key=lambda i: keys[i])


def test_every_window_is_read_by_all_ranks_together_whatever_the_world_size():
    order = windowed_permutation(SIZES, 2, seed=0, epoch=0).tolist()
    for world_size in (1, 2, 3, 4):
        shares = [shard_order(43, epoch=0, seed=0, shuffle=True, rank=r, world_size=world_size,
                              window=2, shard_sizes=SIZES) for r in range(world_size)]
        steps = {len(s) for s in shares}
        assert len(steps) == 1, "equal steps per rank"
        interleaved = [s[k] for k in range(len(shares[0])) for s in shares]
        assert interleaved[:43] == order  # the padding repeats the order's start


def _released_by_brute_force(indices, together=None, margin=0) -> list[int]:
    sequence = list(dict.fromkeys(_shard_of(indices).tolist()))
    needed = _shard_of(indices if together is None else together).tolist()
    first = [needed.index(s) for s in sequence]
    last = [len(needed) - 1 - needed[::-1].index(s) for s in sequence]
    return [next((q for q in range(len(sequence)) if first[q] > last[j] + margin),
                 len(sequence)) for j in range(len(sequence))]


def _reached_by_brute_force(indices, together, read: int) -> int:
    # The last place of the plan whose shard (and every one before it) is first needed within
    # the first ``read`` positions of ``together``.
    sequence = list(dict.fromkeys(_shard_of(indices).tolist()))
    needed = _shard_of(together).tolist()
    first = [needed.index(s) for s in sequence]
    return max((p for p in range(len(sequence)) if max(first[:p + 1]) < read), default=-1)


def test_shard_plan_is_the_order_shards_are_first_needed_in_and_where_each_is_done_with():
    starts = shard_starts(SIZES)
    order = windowed_permutation(SIZES, 2, seed=3, epoch=0)
    sequence, released, _ = shard_plan(order, starts)
    assert sorted(sequence) == list(range(8))
    assert sequence == list(dict.fromkeys(_shard_of(order).tolist()))
    assert released == _released_by_brute_force(order)
    # Windows of 2 shards: a shard is done with where the next window's shards begin.
    assert released == [2, 2, 4, 4, 6, 6, 8, 8]
    rest = order[20:]
    assert shard_plan(rest, starts)[:2] == (list(dict.fromkeys(_shard_of(rest).tolist())),
                                            _released_by_brute_force(rest))
    # A uniform shuffle: most shards needed until the last one is first needed, or to the end.
    uniform = np.random.default_rng(0).permutation(43)
    released = shard_plan(uniform, starts).released
    assert released == _released_by_brute_force(uniform) and min(released) >= 7
    assert shard_plan([], starts)[:2] == ([], []) and shard_plan([], starts).reached(5) == -1


def test_where_a_pass_stands_is_the_last_place_first_needed_in_what_is_read():
    # A shard is done with once the pass stands at its released place: every sample of it is
    # within what was read.
    starts = shard_starts(SIZES)
    order = windowed_permutation(SIZES, 2, seed=3, epoch=0).tolist()
    every = order + order[:2]
    for indices, together in ((order, order), (order[20:], order[20:]),
                              (every[1::3], every)):
        plan = shard_plan(indices, starts, None if indices is together else together)
        needed = _shard_of(together).tolist()
        for read in range(len(together) + 2):
            reached = plan.reached(read)
            assert reached == _reached_by_brute_force(indices, together, read)
            for j, shard in enumerate(plan.shards):
                last = len(needed) - 1 - needed[::-1].index(shard)
                if plan.released[j] <= reached:
                    assert last < read, (read, j)


def test_a_rank_s_plan_says_where_every_rank_is_done_with_a_shard():
    # 3 ranks read every third sample of one order: a shard one rank is done with, another
    # may still read (here the padding repeats the order's start at its end).
    starts = shard_starts(SIZES)
    order = windowed_permutation(SIZES, 2, seed=3, epoch=0).tolist()
    every = order + order[:2]
    for rank in range(3):
        mine = every[rank::3]
        sequence, released, _ = shard_plan(mine, starts, every)
        assert sequence == shard_plan(mine, starts).shards
        assert released == _released_by_brute_force(mine, every)
    # Rank 0 alone would take its first shards for done with before the others are.
    assert shard_plan(every[0::3], starts, every)[1] != shard_plan(every[0::3], starts)[1]
    # Readers up to 10 places out of step: a shard is done with 10 places later.
    for margin in (10, 45):
        assert shard_plan(every[1::3], starts, every, margin)[1] == _released_by_brute_force(
            every[1::3], every, margin)
    assert shard_plan(every[1::3], starts, every, 45)[1] == [6] * 6  # never, in this order


def test_samplers_take_a_window_and_save_it_with_their_state():
    dataset = Sharded()
    sampler = RandomSampler(dataset, seed=4, window=3)
    assert [int(i) for i in sampler] == windowed_permutation(SIZES, 3, 4, 0).tolist()
    assert [int(i) for i in sampler] == windowed_permutation(SIZES, 3, 4, 1).tolist()
    state = sampler.state_dict()
    assert state["window"] == 3 and isinstance(state["shards"], str)
    resumed = RandomSampler(dataset, seed=4, window=3)
    resumed.load_state_dict(state)
    assert [int(i) for i in resumed] == windowed_permutation(SIZES, 3, 4, 2).tolist()
    plain = RandomSampler(dataset, seed=4)
    assert "window" not in plain.state_dict()
    with pytest.raises(ValueError, match="saved with the order .*window.*: 3.*another window"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="saved with the order"):
        RandomSampler(dataset, seed=4, window=2).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with the order"):
        RandomSampler(Sharded([6, 8, 1, 7, 4, 8, 6, 3]), seed=4, window=3).load_state_dict(
            dict(state, length=43))
    with pytest.raises(ValueError, match="window"):
        RandomSampler(dataset, seed=4, window=2).load_state_dict(plain.state_dict())


def test_a_window_is_refused_where_it_cannot_apply():
    with pytest.raises(TypeError, match="window= orders a dataset of shards.*shard_sizes"):
        RandomSampler(range(10), seed=0, window=2)
    with pytest.raises(ValueError, match="shuffle=False"):
        DistributedSampler(Sharded(), world_size=2, rank=0, shuffle=False, window=2)
    with pytest.raises(ValueError, match=r"window must be a positive int \(>= 1\), got 0"):
        RandomSampler(Sharded(), seed=0, window=0)
    with pytest.raises(ValueError, match="needs shuffle=True"):
        DataLoaderX(Sharded(), batch_size=4, window=2)
    with pytest.raises(ValueError, match="pass window= to your sampler"):
        DataLoaderX(Sharded(), batch_size=4, sampler=RandomSampler(Sharded(), seed=0),
                    window=2)

    class Lying(Sharded):
        def shard_sizes(self):
            return np.array([1, 2])

    with pytest.raises(ValueError, match="does not add up to its 43 samples"):
        RandomSampler(Lying(), seed=0, window=1)


def test_dataloaderx_builds_the_windowed_sampler_from_shuffle_and_window():
    loader = DataLoaderX(Sharded(), batch_size=5, shuffle=True, seed=7, window=2)
    assert isinstance(loader.sampler, RandomSampler) and loader.sampler.window == 2
    got = [int(i) for batch in loader for i in batch]
    assert got == windowed_permutation(SIZES, 2, 7, 0).tolist()


def test_distributed_resume_on_another_world_size_keeps_the_windowed_order():
    """Save 4 ranks after 3 steps, restore on 3 and on 6: the rest of the epoch is the rest of
    the one global order, every sample once (43 samples, no padding past the save point only
    when the rest divides; here checked as a multiset with the padding counted)."""
    dataset = Sharded()
    order = windowed_permutation(SIZES, 2, 5, 0).tolist()
    old = [DistributedSampler(dataset, world_size=4, rank=r, seed=5, window=2) for r in range(4)]
    taken, running = [], [iter(sampler) for sampler in old]  # alive while the states are taken
    for it in running:
        taken += [int(next(it)) for _ in range(3)]
    states = [s.state_dict() for s in old]
    assert sorted(taken) == sorted(order[:12])
    for new_world_size in (3, 6):
        rest = []
        counts = set()
        for r in range(new_world_size):
            sampler = DistributedSampler(dataset, world_size=new_world_size, rank=r, seed=5,
                                         window=2)
            sampler.load_state_dict(states[r % 4])
            share = [int(i) for i in sampler]
            counts.add(len(share))
            rest.append(share)
        assert len(counts) == 1
        flat = [s[k] for k in range(len(rest[0])) for s in rest]
        # The rest of the padded order (43 + 1 padding for 4 ranks) past the 12 consumed.
        padded = order + order[:1]
        remaining = padded[12:]
        assert flat[:len(remaining)] == remaining
        assert sorted(set(taken) | set(flat)) == list(range(43))


class Streamed(Sharded):
    """A dataset whose shards stream through a cache: it records what it is asked to fetch."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[int]] = []
        self.released: list[list[int]] = []
        self.handles: list[Handle] = []

    def prefetch(self, shards, released=None):
        self.asked.append(list(shards))
        self.released.append(None if released is None else list(released))
        self.handles.append(Handle())
        return self.handles[-1]


class Handle:
    closed = False

    def close(self) -> None:
        self.closed = True


def _every_rank(epoch: int) -> list[int]:
    """The order both ranks' shares of ``test_samplers_tell_...`` are taken from."""
    shares = [shard_order(43, epoch=epoch, seed=3, shuffle=True, rank=r, world_size=2, window=2,
                          shard_sizes=SIZES) for r in range(2)]
    return [share[k] for k in range(len(shares[0])) for share in shares]


class StreamedAsBefore(Sharded):
    """A dataset whose ``prefetch`` takes the shards alone."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[int]] = []

    def prefetch(self, shards):
        self.asked.append(list(shards))


def test_a_prefetch_that_takes_the_shards_alone_is_still_told_them():
    dataset = StreamedAsBefore()
    share = [int(i) for i in RandomSampler(dataset, seed=1, window=2)]
    assert dataset.asked == [list(dict.fromkeys(_shard_of(share).tolist()))]


def test_samplers_tell_the_dataset_the_shards_in_the_order_they_are_first_needed():
    import pickle

    dataset = Streamed()
    sampler = DistributedSampler(dataset, world_size=2, rank=1, seed=3, window=2)
    share = [int(i) for i in sampler]
    assert dataset.asked == [list(dict.fromkeys(_shard_of(share).tolist()))]
    # How far its loader reads ahead unknown (no DataLoaderX): the cache is not told.
    assert dataset.released == [None]
    assert dataset.handles[0].closed  # every index handed out: the rest is fetched on demand
    sampler.reading_ahead = 3  # both ranks: 6 places of their order
    it = iter(sampler)  # epoch 1; stopped after 5 indices, its state saved
    for _ in range(5):
        next(it)
    state = sampler.state_dict()
    assert not dataset.handles[1].closed
    assert dataset.released[1] == _released_by_brute_force(
        shard_order(43, epoch=1, seed=3, shuffle=True, rank=1, world_size=2, window=2,
                    shard_sizes=SIZES), _every_rank(1), 6)
    clone = pickle.loads(pickle.dumps(sampler))  # the prefetch stays with this process
    assert "_prefetch" not in clone.__dict__
    resumed = DistributedSampler(dataset, world_size=2, rank=1, seed=3, window=2)
    resumed.load_state_dict(state)
    resumed.reading_ahead = 3
    rest = [int(i) for i in resumed]
    # Only what the rest of the epoch reads, from the resumed position on.
    assert dataset.asked[-1] == list(dict.fromkeys(_shard_of(rest).tolist()))
    assert dataset.released[-1] == _released_by_brute_force(rest, _every_rank(1)[10:], 6)
    assert rest == shard_order(43, epoch=1, seed=3, shuffle=True, rank=1, world_size=2,
                               window=2, shard_sizes=SIZES)[5:]

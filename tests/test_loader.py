"""DataLoaderX against torch's own DataLoader, on CPU with real worker processes."""

from __future__ import annotations

import gc
import multiprocessing
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from fastpipe import DataLoaderX
from fastpipe.data import RandomSampler

pytestmark = pytest.mark.timeout(90)


def _dataset(n: int = 50) -> TensorDataset:
    return TensorDataset(torch.arange(n * 3, dtype=torch.float32).view(n, 3), torch.arange(n))


class _BrokenAt(Dataset):
    """Raises at one index, like a corrupt sample."""

    def __init__(self, n: int, broken: int) -> None:
        self.n, self.broken = n, broken

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == self.broken:
            raise ValueError(f"sample {index} is corrupt")
        return torch.tensor([index])


def _pairs_collate(batch):
    """A collate_fn returning a dict with a non-tensor entry."""
    return {"x": torch.stack([b[0] for b in batch]), "ids": [int(b[1]) for b in batch]}


def _assert_same_batches(expected: list, actual: list) -> None:
    assert len(expected) == len(actual)
    for a, b in zip(expected, actual):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            assert torch.equal(a["x"], b["x"]) and a["ids"] == b["ids"]
        else:
            assert all(torch.equal(x, y) for x, y in zip(a, b))


def _workers_gone(timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while multiprocessing.active_children():
        if time.monotonic() > deadline:
            return False
        gc.collect()
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_workers=0),
        dict(num_workers=2),
        dict(num_workers=0, drop_last=True, batch_size=7),
        dict(num_workers=2, shuffle=True),
        dict(num_workers=2, persistent_workers=True, shuffle=True),
        dict(num_workers=0, collate_fn=_pairs_collate),
        dict(num_workers=2, collate_fn=_pairs_collate, pin_memory=False, prefetch_factor=3),
    ],
    ids=["w0", "w2", "drop_last", "shuffle", "persistent", "collate_fn", "collate_fn_w2"],
)
@pytest.mark.slow
def test_yields_the_same_batches_as_dataloader_over_three_epochs(kwargs, no_thread_leak):
    kwargs = {"batch_size": 6, **kwargs}
    plain_kwargs = dict(kwargs)
    if plain_kwargs.pop("shuffle", False):
        # With shuffle=True DataLoaderX shuffles with fastpipe's resumable RandomSampler, seeded
        # by one draw from the generator (docs/resume.md); DataLoader given that sampler matches.
        generator = torch.Generator().manual_seed(3)
        seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
        plain_kwargs["sampler"] = RandomSampler(_dataset(), seed=seed)
    plain = DataLoader(_dataset(), generator=torch.Generator().manual_seed(3), **plain_kwargs)
    fast = DataLoaderX(_dataset(), generator=torch.Generator().manual_seed(3), **kwargs)
    assert len(fast) == len(plain)
    for _ in range(3):
        _assert_same_batches(list(plain), list(fast))
    del plain, fast
    assert _workers_gone()


def test_distributed_sampler_with_set_epoch_matches_dataloader(no_thread_leak):
    for rank in range(2):
        plain_sampler = DistributedSampler(_dataset(), num_replicas=2, rank=rank, seed=5)
        fast_sampler = DistributedSampler(_dataset(), num_replicas=2, rank=rank, seed=5)
        plain = DataLoader(_dataset(), batch_size=4, sampler=plain_sampler)
        fast = DataLoaderX(_dataset(), batch_size=4, sampler=fast_sampler)
        epochs = []
        for epoch in range(2):
            plain_sampler.set_epoch(epoch)
            fast_sampler.set_epoch(epoch)
            expected, actual = list(plain), list(fast)
            _assert_same_batches(expected, actual)
            epochs.append(torch.cat([b[1] for b in actual]))
        assert not torch.equal(epochs[0], epochs[1]), "set_epoch must reshuffle"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_exception_reaches_the_loop_as_dataloader_raises_it(num_workers, no_thread_leak):
    def run(loader_cls):
        seen = []
        batches = iter(loader_cls(_BrokenAt(40, broken=13), batch_size=4, num_workers=num_workers))
        with pytest.raises(ValueError) as caught:
            for batch in batches:
                seen.append(batch)
        if loader_cls is DataLoader and num_workers:
            batches._shutdown_workers()  # torch's own loader keeps them until collected
        return seen, type(caught.value), str(caught.value)

    plain_seen, plain_type, plain_message = run(DataLoader)
    fast_seen, fast_type, fast_message = run(DataLoaderX)
    assert len(fast_seen) == len(plain_seen) == 3  # batch 3 holds index 13
    assert fast_type is plain_type
    assert fast_message == plain_message
    assert "sample 13 is corrupt" in fast_message
    # The exceptions (whose tracebacks reference the loaders' iterators) are gone now.
    assert _workers_gone()


def test_collate_fn_exception_reaches_the_loop(no_thread_leak):
    def collate(batch):
        if int(batch[0][1]) >= 8:
            raise RuntimeError("cannot collate")
        return batch

    loader = DataLoaderX(_dataset(), batch_size=4, collate_fn=collate, num_workers=2)
    seen = 0
    with pytest.raises(RuntimeError, match="cannot collate"):
        for _ in loader:
            seen += 1
    assert seen == 2
    del loader
    assert _workers_gone()


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.slow
def test_early_break_every_epoch_leaks_no_thread_or_worker(num_workers, no_thread_leak):
    loader = DataLoaderX(_dataset(200), batch_size=2, num_workers=num_workers, prefetch_depth=2)
    for _ in range(3):
        for i, _batch in enumerate(loader):
            if i == 3:
                break
    loader.close()
    assert _workers_gone()


def test_exception_in_the_training_loop_leaks_nothing(no_thread_leak):
    loader = DataLoaderX(_dataset(200), batch_size=2, num_workers=2)
    with pytest.raises(ZeroDivisionError):
        for i, _batch in enumerate(loader):
            if i == 2:
                1 / 0  # noqa: B018 - the training step fails
    gc.collect()
    assert _workers_gone()


def test_new_epoch_while_previous_is_unfinished_with_persistent_workers(no_thread_leak):
    loader = DataLoaderX(
        _dataset(60), batch_size=5, num_workers=2, persistent_workers=True, shuffle=False
    )
    first = iter(loader)
    next(first)
    # The previous epoch's thread is stopped before the shared worker iterator is reset.
    assert [int(b[1][0]) for b in loader] == list(range(0, 60, 5))
    assert not first.alive
    del loader, first
    gc.collect()
    assert _workers_gone()


def test_del_of_iterator_stops_thread_and_workers(no_thread_leak):
    it = iter(DataLoaderX(_dataset(200), batch_size=2, num_workers=2))
    next(it)
    del it
    gc.collect()
    assert _workers_gone()


@pytest.mark.parametrize("bad", [0, -2, 1.5, None])
def test_rejects_bad_prefetch_depth(bad):
    with pytest.raises(ValueError, match="prefetch_depth must be a positive int"):
        DataLoaderX(_dataset(), prefetch_depth=bad)


@pytest.mark.slow
def test_interpreter_exit_mid_epoch_with_workers_is_prompt():
    script = textwrap.dedent(
        """
        import torch
        from torch.utils.data import TensorDataset
        from fastpipe import DataLoaderX
        loader = DataLoaderX(TensorDataset(torch.zeros(10000, 4)), batch_size=2, num_workers=2)
        it = iter(loader)
        next(it)
        print("exiting", flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
    assert time.monotonic() - started < 45


class _Slow(Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(0.4)
        return torch.tensor([index])


@pytest.mark.slow
def test_new_epoch_waits_for_a_slow_batch_before_reusing_persistent_workers(monkeypatch,
                                                                            no_thread_leak):
    import fastpipe._background as background

    # close() gives up waiting after this long and warns; the next epoch must still wait.
    monkeypatch.setattr(background, "_JOIN_SECONDS", 0.05)
    loader = DataLoaderX(_Slow(), batch_size=1, num_workers=1, persistent_workers=True)
    first = iter(loader)
    next(first)
    with pytest.warns(RuntimeWarning, match="still fetching an item"):
        second = iter(loader)
    assert [int(b) for b in second] == list(range(6))
    del loader, first, second
    gc.collect()
    assert _workers_gone()


@pytest.mark.parametrize("state", ["fresh", "iterated", "mid_epoch", "closed"])
@pytest.mark.slow
def test_pickles_and_deep_copies_in_every_state_like_dataloader(state, no_thread_leak):
    # Lightning's ddp_spawn pickles the loaders, possibly after a peek at a batch (or
    # fastpipe.profile/tune) before fit: the running epoch's weakref and thread lock must not
    # be part of what is pickled.
    import copy
    import pickle

    loader = DataLoaderX(_dataset(12), batch_size=4, prefetch_depth=3)
    if state == "iterated":
        list(loader)
    elif state in ("mid_epoch", "closed"):
        it = iter(loader)
        next(it)
        if state == "closed":
            loader.close()
    for clone in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert isinstance(clone, DataLoaderX) and clone.prefetch_depth == 3
        assert [b[1].tolist() for b in clone] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    loader.close()


def test_drop_last_reads_and_is_guarded_like_dataloader():
    loader = DataLoaderX(_dataset(10), batch_size=4, drop_last=True)
    assert loader.drop_last is True and len(loader) == 2
    with pytest.raises(ValueError, match="drop_last attribute should not be set"):
        loader.drop_last = False


def test_accelerate_prepare_warns_that_the_thread_is_dropped():
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    with pytest.warns(RuntimeWarning, match="prepare\\(\\) rebuilds DataLoaderX.*"
                                            "DataPrefetcher\\(accelerator.prepare\\(loader\\)"):
        prepared = accelerator.prepare(DataLoaderX(_dataset(8), batch_size=4))
    assert [b[1].tolist() for b in prepared] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_drop_last_is_among_the_instance_attributes_lightning_rebuilds_from():
    # Lightning re-creates a loader made outside its hooks from vars(loader).
    loader = DataLoaderX(_dataset(10), batch_size=4, drop_last=True)
    assert vars(loader)["drop_last"] is True


class _WorkerHooks(Dataset):
    """Each sample: whether its worker keeps lost descriptor transfers quiet, and what the
    user's worker_init_fn set."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[bool, int]:
        quiet = getattr(sys.excepthook, "quiets_lost_descriptor_transfers", False)
        return quiet, _USER_INIT.get("worker", -1)


_USER_INIT: dict[str, int] = {}


def _user_init(worker_id: int) -> None:
    _USER_INIT["worker"] = worker_id


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_keep_a_lost_descriptor_transfer_quiet_and_run_the_user_s_init(
        context, no_thread_leak):
    # A main process ended by Ctrl-C leaves a worker's descriptor transfer unfinished, which
    # the worker printed as a traceback.
    loader = DataLoaderX(_WorkerHooks(), batch_size=None, num_workers=2,
                         worker_init_fn=_user_init,
                         multiprocessing_context=multiprocessing.get_context(context))
    assert sorted(tuple(s) for s in loader) == [(True, 0), (True, 0), (True, 1), (True, 1)]
    assert loader.worker_init_fn is _user_init
    assert not getattr(sys.excepthook, "quiets_lost_descriptor_transfers", False)  # here


class _Streamed(Dataset):
    """Samples in 8 shards of 5 that stream through a cache: records what its prefetch is told."""

    def __init__(self) -> None:
        self.told: list[tuple[list[int], list[int] | None]] = []

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return int(index)

    def shard_sizes(self) -> list[int]:
        return [5] * 8

    def prefetch(self, shards, released=None):
        self.told.append((list(shards), released))


@pytest.mark.parametrize(("workers", "method", "reading_ahead"),
                         [(0, "process", 3), (2, "thread", 8), (2, "process", 9)])
def test_the_cache_is_told_where_shards_are_done_with_past_every_batch_read_ahead(
        workers, method, reading_ahead, no_thread_leak):
    # A shard is done with only once every batch that needs it is read: a thread or worker
    # process may wait on one while the others read as far as the loader reads ahead.
    from fastpipe.data.sampling.order import shard_plan, shard_starts

    dataset = _Streamed()
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, window=2, num_workers=workers,
                         prefetch_factor=3 if workers else None, worker_method=method)
    order = [int(i) for batch in loader for i in batch]
    margin = 4 * (reading_ahead + 1)  # a step more: a rank may run ahead of another
    assert dataset.told == [shard_plan(order, shard_starts([5] * 8), margin=margin)[:2]]
    assert loader.sampler.reading_ahead is None  # taken by the iteration it was for
    list(loader.sampler)  # iterated without the loader: how far it reads ahead is unknown
    assert dataset.told[-1][1] is None


class _StreamedAsReceived(_Streamed):
    """The same, with a prefetch that also takes where the pass stands."""

    def prefetch(self, shards, released=None, progress=None):
        self.told.append((list(shards), released, progress))


@pytest.mark.parametrize(("workers", "method"), [(0, "process"), (2, "thread"), (2, "process")])
def test_the_cache_is_told_shards_are_done_with_as_the_loop_receives_their_batches(
        workers, method, no_thread_leak):
    # Where the loop has received every batch that needs a shard, it is done with, whatever
    # the loader reads ahead.
    from fastpipe.data.sampling.order import shard_plan, shard_starts

    dataset = _StreamedAsReceived()
    loader = DataLoaderX(dataset, batch_size=4, shuffle=True, seed=2, window=2,
                         num_workers=workers, prefetch_factor=3 if workers else None,
                         worker_method=method)
    stands, order = [], []
    for batch in loader:
        order += [int(i) for i in batch]
        stands.append(dataset.told[0][2]())
    assert len(dataset.told) == 1
    shards, released, _ = dataset.told[0]
    plan = shard_plan(order, shard_starts([5] * 8))
    assert (shards, released) == tuple(plan[:2])
    assert stands == [plan.reached(4 * (k + 1)) for k in range(len(stands))]
    assert len(set(stands)) == 4 and stands[-1] == len(shards) - 1  # a window of 2 at a time


def test_with_several_ranks_the_cache_is_told_where_the_readers_are(no_thread_leak):
    # Another rank's loop may trail this one's by steps no loader knows of (gradients
    # accumulated without a sync): where the readers of the node have started.
    from fastpipe.data import DistributedSampler
    from fastpipe.data.sampling.order import shard_plan, shard_starts

    dataset = _StreamedAsReceived()
    sampler = DistributedSampler(dataset, world_size=2, rank=1, seed=2, window=2)
    loader = DataLoaderX(dataset, batch_size=4, sampler=sampler, num_workers=2,
                         prefetch_factor=3, worker_method="thread")
    order = [int(i) for batch in loader for i in batch]
    sampler.set_epoch(0)
    assert dataset.told == [(*shard_plan(order, shard_starts([5] * 8), sampler._every_rank()[0],
                                         margin=2 * 4 * (8 + 1))[:2], None)]


def test_a_loader_told_its_sampler_of_an_iteration_pickles(no_thread_leak):
    # What DataLoaderX tells its sampler for an iteration (a function of its own among it)
    # stays with this process: a loader whose iteration has not reached its sampler yet
    # pickles.
    import pickle

    loader = DataLoaderX(_StreamedAsReceived(), batch_size=4, shuffle=True, seed=2, window=2,
                         num_workers=2, worker_method="thread")
    it = iter(loader)
    clone = pickle.loads(pickle.dumps(loader))
    assert clone.sampler.loop_received is None and clone.sampler.reading_ahead is None
    assert sum(len(b) for b in it) == 40


class _HoldingBack(torch.utils.data.BatchSampler):
    """A batch sampler that may hold indices back (as grouping ones do)."""


@pytest.mark.parametrize("how", ["batch_sampler", "in_order=False"])
def test_the_cache_is_not_told_where_batches_may_be_held_back(how, no_thread_leak):
    dataset = _Streamed()
    sampler = RandomSampler(dataset, seed=1, window=2)
    kwargs = (dict(batch_sampler=_HoldingBack(sampler, 4, False)) if how == "batch_sampler"
              else dict(batch_size=4, sampler=sampler, num_workers=1, in_order=False))
    assert sum(len(b) for b in DataLoaderX(dataset, **kwargs)) == 40
    assert len(dataset.told) == 1 and dataset.told[0][1] is None

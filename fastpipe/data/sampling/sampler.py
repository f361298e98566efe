"""Samplers whose order is a pure function of (seed, epoch), and whose position can be saved.

Each yields :class:`~fastpipe.data.sampling.seeds.SampleIndex` objects (an ``int`` carrying
``.epoch``), moves to the next epoch by itself when an iteration runs to its end (``set_epoch``
still sets it explicitly, as with torch's ``DistributedSampler``), and has ``state_dict()`` /
``load_state_dict()``: the state says which epoch, and how far into it, the next index comes from.
They subclass torch's samplers of the same name, so code that checks
``isinstance(loader.sampler, torch.utils.data.RandomSampler)`` (Lightning does) still sees them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Sequence, Sized
from typing import Any

import torch
from torch.utils import data as torch_data

from fastpipe import _validate as check
from fastpipe._seed import checked_seed, order_seed
from fastpipe.data.sampling.order import (
    ShardPlan,
    check_window,
    shard_plan,
    shard_sizes_of,
    shard_starts,
    sizes_digest,
    windowed_permutation,
)
from fastpipe.data.sampling.resume import STATE_VERSION
from fastpipe.data.sampling.seeds import SampleIndex


def _check_seed(seed: int | None, world_size: int | None = None) -> int:
    return order_seed(checked_seed(seed), world_size)


def shard_order(length: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = False,
                rank: int = 0, world_size: int = 1, drop_last: bool = False,
                consumed: Sequence[Sequence[int]] = (), window: int | None = None,
                shard_sizes: Sequence[int] | None = None) -> list[int]:
    """The indices shard ``rank`` of ``world_size`` reads in ``epoch``, in reading order: the
    one rule of every fastpipe loader (DistributedSampler's, on the CPU path, and DALILoader's).

    torch's ``DistributedSampler`` rule: every shard draws the same permutation (``randperm``
    seeded with ``seed + epoch``, so it changes every epoch; ``range(length)`` unshuffled), padded
    by repeating its start to a multiple of ``world_size`` (or cut, with ``drop_last``), then
    every ``world_size``-th index from position ``rank``. Shards are disjoint and together cover
    the dataset when ``length`` divides by ``world_size``; otherwise every shard still gets the
    same count, so all ranks run the same number of steps: ``drop_last=False`` repeats the first
    few indices of the permutation (at most ``world_size - 1`` samples seen twice), and
    ``drop_last=True`` leaves out the last ``length % world_size`` of it. With the same seed,
    DALILoader and the CPU path's samplers read the same samples in the same order.

    ``consumed`` is ``[(world_size, position), ...]``: the epoch was interrupted after ranks of
    that world size had each read ``position`` indices, and only the rest is sharded. Rank r's
    share is ``padded[r::world_size]``, so together they consumed exactly the first
    ``position * world_size`` indices of the padded order.

    ``window`` (with ``shard_sizes``, the samples of each shard in index order) replaces the
    permutation by the shard-aware one (:mod:`fastpipe.data.sampling.order`): shards shuffled,
    samples shuffled within windows of ``window`` shards; padding, sharding and ``consumed`` are
    the same.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return _every_rank(length, epoch, seed, shuffle, world_size, drop_last, consumed, window,
                       shard_sizes)[rank::world_size]


def _every_rank(length: int, epoch: int, seed: int, shuffle: bool, world_size: int,
                drop_last: bool, consumed: Sequence[Sequence[int]], window: int | None,
                shard_sizes: Sequence[int] | None) -> list[int]:
    """The order every rank's share is taken from (``shard_order``): rank r's is ``[r::world]``."""
    order = _epoch_order(length, seed, epoch, shuffle, window, shard_sizes)
    for old_world_size, position in consumed:
        order = _padded(order, old_world_size, drop_last)[position * old_world_size:]
    return _padded(order, world_size, drop_last)


def _epoch_order(length: int, seed: int, epoch: int, shuffle: bool, window: int | None,
                 shard_sizes: Sequence[int] | None) -> list[int]:
    """The whole epoch's order, before padding and sharding."""
    if window is None:
        return _permutation(length, seed, epoch) if shuffle else list(range(length))
    if not shuffle:
        raise ValueError("window= shuffles shards and the samples within windows of them; "
                         "without shuffle the order is the dataset's: leave window=None")
    if shard_sizes is None or sum(int(s) for s in shard_sizes) != length:
        raise ValueError(f"window= needs shard_sizes adding up to the {length} samples")
    return windowed_permutation(shard_sizes, window, seed, epoch).tolist()


def _permutation(length: int, seed: int, epoch: int) -> list[int]:
    # torch's DistributedSampler draws its order this way; keeping it means the same seed gives
    # the same order in fastpipe's samplers and in torch's.
    generator = torch.Generator()
    generator.manual_seed((seed + epoch) % 2**64)
    return torch.randperm(length, generator=generator).tolist()


def _takes(prefetch: Any, name: str) -> bool:
    try:
        return name in inspect.signature(prefetch).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False


class _Progress:
    """Where a pass over shards stands (:meth:`ShardPlan.reached`): its order read as far as the
    training loop has received it. One rank's only: another rank's loop may trail this one's by
    as many steps as its gradients are accumulated without a sync, which no loader knows."""

    def __init__(self, plan: ShardPlan, received: Callable[[], int]) -> None:
        self.plan, self.received = plan, received

    def __call__(self) -> int:
        return self.plan.reached(self.received())


def _padded(order: list[int], world_size: int, drop_last: bool) -> list[int]:
    """``order`` padded by repetition (or cut, with ``drop_last``) to a multiple of ``world_size``.

    torch's DistributedSampler rule: rank r's share is then ``padded[r::world_size]``.
    """
    length = len(order)
    if drop_last and length % world_size:
        per_rank = math.ceil((length - world_size) / world_size)
    else:
        per_rank = math.ceil(length / world_size)
    total = per_rank * world_size
    if total > length and length:
        padding = total - length
        order = order + (order * math.ceil(padding / length))[:padding]
    return order[:total]


class _ResumableSampler:
    """The epoch, the position and the state shared by fastpipe's samplers."""

    _kind: str
    seed: int
    epoch: int
    window: int | None = None
    _shard_sizes: Any = None
    # How far ahead of an index not yet read its loader may be reading (DataLoaderX sets it
    # before each iteration, which takes it); None: unknown, and a cache it streams through is
    # not told where shards are done with.
    reading_ahead: int | None = None
    # With it, how many of the iteration's indices the training loop has received (read
    # whole), asked as the iteration goes on: where the cache is told shards are done with.
    loop_received: Callable[[], int] | None = None

    def _init_state(self, seed: int | None) -> None:
        self.seed = _check_seed(seed)
        self.epoch = 0
        self._start = 0  # where the next iteration begins (nonzero after load_state_dict)
        self._live: list[int] | None = None  # [position, length] of the iteration under way

    def _init_window(self, window: Any, shuffle: bool = True) -> None:
        """The shard-aware order (fastpipe.data.sampling.order) when ``window`` is an int."""
        self.window = check_window(window)
        self._shard_sizes = None
        if self.window is not None:
            if not shuffle:
                raise ValueError("window= shuffles shards and the samples within windows of "
                                 "them; with shuffle=False the order is the dataset's: leave "
                                 "window=None")
            self._shard_sizes = shard_sizes_of(self.data_source)  # type: ignore[attr-defined]

    def _window_state(self) -> dict[str, Any]:
        if self.window is None:
            return {}
        return {"window": self.window, "shards": sizes_digest(self._shard_sizes)}

    def _check_window_state(self, state: dict[str, Any]) -> None:
        saved = {k: state[k] for k in ("window", "shards") if k in state}
        if saved != self._window_state():
            raise ValueError(
                f"this {self._kind} state was saved with the order {saved or {'window': None}}, "
                f"this sampler's is {self._window_state() or {'window': None}}: another window "
                "or other shards give another order, and the rest of the epoch would repeat and "
                "miss samples; build the sampler with the saved window over the same shards")

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch of the next iteration; a resumed position is kept for the same epoch."""
        epoch = check.non_negative_int("epoch", epoch)
        if epoch != self.epoch:
            self._start = 0
            self._reset_history()
        self.epoch = epoch

    def _reset_history(self) -> None:
        pass

    def _order(self) -> list[int]:
        """The indices of one whole iteration of the current epoch, from its position 0."""
        raise NotImplementedError

    def _every_rank(self) -> tuple[list[int], int] | None:
        """The order every rank's share of this iteration is taken from, and the number of
        ranks; None where this sampler is the only reader."""
        return None

    def _prefetch_shards(self, order: list[int], start: int) -> None:
        """Tells a dataset whose shards stream through a cache (its, or its source's,
        ``prefetch(shards)``: remote tar shards and Parquet files) the shards this iteration
        reads, in the order it first needs them, so that they are fetched ahead in that order
        until every index of the iteration is handed out, and (to a ``prefetch`` that takes
        ``released=``, where ``reading_ahead`` is known) where every rank is done with each
        (``shard_plan``), so that the cache evicts those first: where the readers have started
        the batches ``reading_ahead`` on (times the ranks), or (one rank, to a prefetch that
        takes ``progress=``, where ``loop_received`` is known) where the training loop has
        received them. The previous iteration's prefetch is stopped first."""
        self._stop_prefetch()
        ahead = self.__dict__.pop("reading_ahead", None)  # this iteration's loader's only
        received = self.__dict__.pop("loop_received", None)
        dataset = self.data_source  # type: ignore[attr-defined]
        prefetch = next((getattr(o, "prefetch", None) for o in (dataset, getattr(
            dataset, "source", None)) if callable(getattr(o, "prefetch", None))), None)
        if prefetch is None or start >= len(order):
            return
        sizes = self._shard_sizes
        if sizes is None:
            try:
                sizes = shard_sizes_of(dataset)
            except TypeError:  # a prefetch of another kind, on a dataset without shards
                return
        if ahead is None or not _takes(prefetch, "released"):
            handle = prefetch(shard_plan(order[start:], shard_starts(sizes)).shards)
        else:  # every rank's order only where the plan is given
            every_rank = self._every_rank()
            together, ranks = (None, 1) if every_rank is None else (
                every_rank[0][start * every_rank[1]:], every_rank[1])
            if received is None or ranks > 1 or not _takes(prefetch, "progress"):
                plan = shard_plan(order[start:], shard_starts(sizes), together,
                                  margin=ranks * ahead)
                handle = prefetch(plan.shards, released=plan.released)
            else:
                plan = shard_plan(order[start:], shard_starts(sizes))
                handle = prefetch(plan.shards, released=plan.released,
                                  progress=_Progress(plan, received))
        if handle is not None:
            self.__dict__["_prefetch"] = handle

    def _stop_prefetch(self, finish: bool = False) -> None:
        """Stops this sampler's prefetch: ``finish`` lets the downloads under way complete
        (the readers need those objects next), else they are cancelled."""
        previous = self.__dict__.pop("_prefetch", None)
        if previous is not None:
            ended = getattr(previous, "finish", None) if finish else None
            (ended or previous.close)()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_prefetch", None)  # threads of this process: a copy starts its own
        # What a loader told this process's next iteration (a function of its own among them).
        state.pop("reading_ahead", None)
        state.pop("loop_received", None)
        return state

    def __iter__(self) -> Iterator[SampleIndex]:
        epoch, start = self.epoch, self._start
        order = self._order()
        self._prefetch_shards(order, start)
        live = [start, len(order)]
        self._live = live
        handed_out = False
        try:
            for position in range(start, len(order)):
                live[0] = position + 1
                yield SampleIndex(order[position], epoch)
            handed_out = True
        finally:
            if self._live is live:
                self._live = None
            # Every index is handed out: the downloads under way complete, and what is left of
            # the epoch the readers fetch on demand. Stopped here, before the next epoch's
            # DataLoader forks its workers, so that no process is forked while these download
            # threads are in a request. An iteration abandoned cancels its downloads.
            self._stop_prefetch(finish=handed_out)
        # Only an iteration run to its end moves on (an abandoned one restarts its epoch, as
        # torch's DistributedSampler does), and only if set_epoch did not move it meanwhile.
        if self.epoch == epoch and self._start == start:
            self.epoch, self._start = epoch + 1, 0
            self._reset_history()

    def _iteration_length(self) -> int:
        """How many indices the next iteration yields, counted from its position 0."""
        return len(self.data_source)  # type: ignore[attr-defined]

    def _state(self, epoch: int, position: int) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "sampler": self._kind,
            "length": len(self.data_source),  # type: ignore[attr-defined]
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
        } | self._window_state()

    def state_dict(self) -> dict[str, Any]:
        """Where the next index comes from: ``epoch``, ``position`` in it, ``seed``, ``length``.

        After the last index of an epoch the position is the epoch's length: the restored
        sampler's next iteration ends that epoch without an index, then goes on.
        """
        position = self._live[0] if self._live is not None else self._start
        return self._state(self.epoch, position)

    def _next_iteration_state(self) -> dict[str, Any]:
        """The state at the start of the next iteration (what ``iter()`` would begin with)."""
        return self._state(self.epoch, self._start)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores ``state``: the next iteration continues from its epoch and position."""
        _check_state(state, self._kind)
        length = len(self.data_source)  # type: ignore[attr-defined]
        if state["length"] != length:
            raise ValueError(
                f"this {self._kind} state was saved for {state['length']} samples, but the "
                f"dataset has {length}; a state only resumes the same dataset"
            )
        seed, epoch, position = int(state["seed"]), int(state["epoch"]), int(state["position"])
        if seed < 0 or epoch < 0 or not 0 <= position <= length:
            raise ValueError(
                f"this {self._kind} state is corrupt: seed {seed}, epoch {epoch}, position "
                f"{position} of {length}"
            )
        self._check_window_state(state)
        start = self._load_extra(state)  # checks first, then restores; nothing after can fail
        self.seed, self.epoch = seed, epoch
        self._start = start
        self._live = None

    def _load_extra(self, state: dict[str, Any]) -> int:
        """Checks and restores what a subclass adds; returns the start position."""
        return int(state["position"])


_STATE_KEYS = {"version", "sampler", "length", "seed", "epoch", "position"}
_DISTRIBUTED_KEYS = {"world_size", "rank", "shuffle", "drop_last", "history"}


def _check_state(state: Any, kind: str) -> None:
    if not isinstance(state, dict):
        raise TypeError(f"a {kind} state is a dict, got {type(state).__name__}")
    needed = _STATE_KEYS | (_DISTRIBUTED_KEYS if kind == "DistributedSampler" else set())
    if kind == state.get("sampler") and not needed <= state.keys():
        raise ValueError(f"this {kind} state lacks {sorted(needed - state.keys())}")
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"this {kind} state has version {state.get('version')!r}; this fastpipe reads "
            f"version {STATE_VERSION} (a state from another fastpipe release cannot be resumed)"
        )
    if state.get("sampler") != kind:
        raise ValueError(
            f"this state was saved by a {state.get('sampler')!r} sampler, not a {kind}; build the "
            "loader with the same sampler it was saved with"
        )


class SequentialSampler(_ResumableSampler, torch_data.SequentialSampler):
    """``0, 1, ..., len(data_source) - 1`` every epoch, as ``SampleIndex`` with the epoch.

    Args:
        data_source: anything with ``len()``.
    """

    _kind = "SequentialSampler"

    def __init__(self, data_source: Sized) -> None:
        torch_data.SequentialSampler.__init__(self, data_source)
        self.seed = 0
        self.epoch = 0
        self._start = 0
        self._live = None

    def _order(self) -> list[int]:
        return list(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_ResumableSampler, torch_data.RandomSampler):
    """A new permutation of ``range(len(data_source))`` every epoch, a function of (seed, epoch).

    Without replacement; the order of epoch ``e`` is ``torch.randperm(n)`` drawn from a generator
    seeded with ``seed + e`` (the rule of torch's ``DistributedSampler``), or with ``window`` the
    shard-aware order (shards shuffled, samples shuffled within windows of ``window`` shards:
    :mod:`fastpipe.data.sampling.order`, docs/object-storage.md).

    Args:
        data_source: anything with ``len()``; with ``window``, a dataset of shards (its
            ``shard_sizes()``: TarDataset, ParquetDataset).
        seed: the seed of every epoch's order; None draws one from torch's global generator now,
            so ``torch.manual_seed(s)`` before building reproduces the run.
        window: shards whose samples are shuffled together; None: a uniform shuffle.
    """

    _kind = "RandomSampler"

    def __init__(self, data_source: Sized, *, seed: int | None = None,
                 window: int | None = None) -> None:
        torch_data.RandomSampler.__init__(self, data_source)
        self._init_state(seed)
        self._init_window(window)

    def _order(self) -> list[int]:
        return _epoch_order(len(self.data_source), self.seed, self.epoch, True, self.window,
                            self._shard_sizes)

    def __len__(self) -> int:
        return len(self.data_source)


def _distributed_setting(world_size: int | None, rank: int | None) -> tuple[int, int]:
    if world_size is None or rank is None:
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        if world_size is None:
            world_size = dist.get_world_size() if initialized else 1
        if rank is None:
            rank = dist.get_rank() if initialized else 0
    world_size = check.positive_int("world_size", world_size)
    rank = check.non_negative_int("rank", rank)
    if rank >= world_size:
        raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
    return world_size, rank


class DistributedSampler(_ResumableSampler, torch_data.DistributedSampler):
    """This rank's share of every epoch, with torch's ``DistributedSampler`` order and sharding.

    With the same ``seed``, ``world_size``, ``rank``, ``shuffle`` and ``drop_last`` it yields the
    indices torch's ``DistributedSampler`` yields (as ``SampleIndex``), and it moves to the next
    epoch by itself at the end of an iteration (calling ``set_epoch`` every epoch still works).

    Its state is this rank's position. Restored with the same world size, each rank continues its
    own stream exactly (a rank refuses another rank's state). Restored with a different world
    size, the rest of the interrupted epoch (the samples after the first ``position * old world
    size`` of the epoch's padded order, which is what the old ranks consumed when each was at
    ``position``, as they are in DDP's lockstep) is re-sharded over the new ranks by the same rule
    (padding by repetition, or dropping with ``drop_last``); from the next epoch on, sharding is
    ordinary.

    Args:
        dataset: anything with ``len()``.
        world_size, rank: from ``torch.distributed`` when initialized, else 1 and 0.
        shuffle: a new permutation every epoch (``seed + epoch``); else dataset order.
        seed: None draws one from torch's global generator; in DDP pass the same int on every rank
            (or seed torch identically on every rank before building).
        drop_last: drop the tail that does not divide evenly, instead of padding by repetition.
        window: the shard-aware order instead of the permutation, as in
            :class:`RandomSampler` (``dataset`` a dataset of shards; needs ``shuffle``): every
            rank reads from the same window at the same time, and re-sharding after a restore
            on another world size is the same.
    """

    _kind = "DistributedSampler"

    def __init__(
        self,
        dataset: Sized,
        world_size: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        drop_last: bool = False,
        window: int | None = None,
    ) -> None:
        world_size, rank = _distributed_setting(world_size, rank)
        seed = _check_seed(seed, world_size)
        torch_data.DistributedSampler.__init__(
            self, dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed,
            drop_last=drop_last,
        )
        self._init_state(seed)
        self._init_window(window, shuffle)
        self._history: list[list[int]] = []  # [[world_size, position], ...] of the epoch so far

    @property
    def data_source(self) -> Sized:
        return self.dataset

    @property
    def world_size(self) -> int:
        return self.num_replicas

    def _reset_history(self) -> None:
        self._history = []

    def _every_rank(self) -> tuple[list[int], int] | None:
        if self.num_replicas == 1:
            return None
        return _every_rank(len(self.dataset), self.epoch, self.seed, self.shuffle,
                           self.num_replicas, self.drop_last, self._history, self.window,
                           self._shard_sizes), self.num_replicas

    def _order(self) -> list[int]:
        # After a restore with another world size, only what the old ranks had not yet seen.
        return shard_order(len(self.dataset), epoch=self.epoch, seed=self.seed,
                           shuffle=self.shuffle, rank=self.rank, world_size=self.num_replicas,
                           drop_last=self.drop_last, consumed=self._history,
                           window=self.window, shard_sizes=self._shard_sizes)

    def __len__(self) -> int:
        return self.num_samples

    def _iteration_length(self) -> int:
        return len(self._order()) if self._history else self.num_samples

    def _state(self, epoch: int, position: int) -> dict[str, Any]:
        return super()._state(epoch, position) | {
            "world_size": self.num_replicas,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "history": [list(h) for h in self._history],
        }

    def _load_extra(self, state: dict[str, Any]) -> int:
        for key in ("shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"this DistributedSampler state was saved with {key}={state[key]}, but this "
                    f"sampler has {key}={getattr(self, key)}; build it with the saved setting"
                )
        history = [[int(w), int(p)] for w, p in state["history"]]
        saved_world_size, position = int(state["world_size"]), int(state["position"])
        if saved_world_size < 1 or position > math.ceil(len(self.dataset) / saved_world_size):
            raise ValueError(
                f"this DistributedSampler state is corrupt: position {position} of a share of "
                f"{len(self.dataset)} samples over {saved_world_size} ranks"
            )
        if state["world_size"] == self.num_replicas:
            if state["rank"] != self.rank:
                raise ValueError(
                    f"this state was saved by rank {state['rank']} of {state['world_size']}, "
                    f"but this sampler is rank {self.rank}: each rank restores its own state"
                )
            self._history = history
            return int(state["position"])
        self._history = history + [[int(state["world_size"]), int(state["position"])]]
        return 0

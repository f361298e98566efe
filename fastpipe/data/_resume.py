"""What the resumable loaders share: the state's version, the dataset check, the sampler choice."""

from __future__ import annotations

import inspect
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from fastpipe.data.sampler import STATE_VERSION, RandomSampler, SequentialSampler, _default_seed
from fastpipe.data.sampler import _EpochSampler as EpochSampler

__all__ = [
    "STATE_VERSION",
    "EpochSampler",
    "check_loader_state",
    "dataset_fingerprint",
    "with_stateful_sampler",
]

_DATALOADER_SIGNATURE = inspect.signature(DataLoader.__init__)


def dataset_fingerprint(dataset: Any) -> dict[str, Any]:
    """The dataset's length, and its ``fingerprint()`` (a str) when it has one, else None."""
    fingerprint = getattr(dataset, "fingerprint", None)
    return {
        "length": len(dataset),
        "fingerprint": str(fingerprint()) if callable(fingerprint) else None,
    }


def check_loader_state(state: Any, dataset: Any, owner: str) -> None:
    """Raises TypeError or ValueError unless ``state`` is a loader state for this dataset."""
    if not isinstance(state, dict) or "sampler" not in state or "dataset" not in state:
        keys = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise TypeError(
            f"{owner}.load_state_dict() takes a dict from {owner}.state_dict(), got {keys}"
        )
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"this {owner} state has version {state.get('version')!r}; this fastpipe reads "
            f"version {STATE_VERSION} (a state from another fastpipe release cannot be resumed)"
        )
    saved, here = state["dataset"], dataset_fingerprint(dataset)
    if saved != here:
        raise ValueError(
            f"this {owner} state was saved for another dataset: saved {saved}, this dataset "
            f"{here}; a state only resumes the dataset it was taken from"
        )


def with_stateful_sampler(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """DataLoader arguments with ``shuffle`` replaced by one of fastpipe's resumable samplers.

    Only for a map-style dataset without ``sampler=`` / ``batch_sampler=``. ``shuffle=True`` gives
    a RandomSampler seeded with ``seed=``, else with one draw from ``generator=`` (else torch's
    global generator); otherwise a SequentialSampler. ``seed`` is taken out of ``kwargs``.
    """
    kwargs = dict(kwargs)
    seed = kwargs.pop("seed", None)
    bound = _DATALOADER_SIGNATURE.bind_partial(None, *args, **kwargs)
    given = bound.arguments
    dataset = given.get("dataset")
    if (
        dataset is None
        or isinstance(dataset, IterableDataset)
        or given.get("sampler") is not None
        or given.get("batch_sampler") is not None
    ):
        if seed is not None:
            raise ValueError(
                "seed= seeds the sampler DataLoaderX builds for shuffle=True; with sampler=, "
                "batch_sampler= or an IterableDataset there is none: seed your sampler instead"
            )
        return args, kwargs
    if given.get("shuffle"):
        if seed is None:
            seed = _default_seed(given.get("generator"))
        sampler: Any = RandomSampler(dataset, seed=seed)
    else:
        sampler = SequentialSampler(dataset)
    given["shuffle"] = None
    given["sampler"] = sampler
    return bound.args[1:], bound.kwargs

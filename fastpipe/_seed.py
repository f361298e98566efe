"""The seed policy of every loader, dataset and sampler: what ``seed=None`` means.

``seed=None`` draws one seed from torch's generator when the object is built, so
``torch.manual_seed(s)`` before building reproduces the run (the draw is DataLoader's own base
seed draw, so a shuffled loader's first epoch is DataLoader's). The order of a sharded run is the
exception: every rank must shuffle the same way and ranks' generators need not agree, so its
seed is 0, as ``DistributedSampler``'s default.
"""

from __future__ import annotations

import torch

from fastpipe import _validate as check

__all__ = ["checked_seed", "draw_seed", "order_seed"]

# Seeds are ints in [0, 2**63): torch.Generator.manual_seed and the splitmix chain of
# fastpipe.data.sampling.seeds take them whole.
SEED_LIMIT = 2**63


def draw_seed(generator: torch.Generator | None = None) -> int:
    """One seed in ``[0, 2**63)`` from ``generator`` (torch's global generator when None)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def checked_seed(seed: object, *, where: str = "") -> int | None:
    """``seed`` as ``None`` or an int in ``[0, 2**63)``."""
    value = check.optional_seed("seed", seed, where=where)
    if value is not None and value >= SEED_LIMIT:
        label = f"{where}: seed" if where else "seed"
        raise ValueError(f"{label} must be an int in [0, 2**63) or None, got {seed!r}")
    return value


def order_seed(seed: int | None, world_size: int | None = None,
               generator: torch.Generator | None = None) -> int:
    """The seed of the sample order: ``seed``; for None, 0 in a sharded run (``world_size`` > 1,
    or a ``torch.distributed`` group of several processes when ``world_size`` is None and no
    ``generator`` is given), else a draw from ``generator``."""
    if seed is not None:
        return seed
    if world_size is None and generator is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
    if world_size is not None and world_size > 1:
        return 0
    return draw_seed(generator)

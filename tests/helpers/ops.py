"""Shared by the tests of fastpipe.ops' kernels (compiled, and their CUDA bodies run on the
host)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def write_on_strided_copy(x: torch.Tensor, write: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """Calls ``write(view)`` on a copy of x with x's exact strides (inside a copy of the larger
    buffer when x is a view), checks that nothing outside the view changed, and returns the view."""
    base = (x._base if x._base is not None else x).clone()
    view = base.as_strided(x.shape, x.stride(), x.storage_offset())
    untouched = base.clone()
    write(view)
    outside = torch.ones_like(base, dtype=torch.bool)
    outside.as_strided(x.shape, x.stride(), x.storage_offset()).fill_(False)
    assert torch.equal(base[outside], untouched[outside]), "an in-place write went outside the view"
    return view

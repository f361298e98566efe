"""Every batch op under torch.compile with dynamic shapes, across batch sizes that change.

A partial last batch (``drop_last=False``) changes the batch size between calls; with dynamic
shapes the random draws get a symbolic size, and torch.rand/randint with an explicit
``generator=None`` failed to trace ("SymIntArrayRef expected to contain only concrete integers").
The aot_eager backend runs Dynamo's tracing and AOTAutograd, where that failure happened, without
inductor's C++ compile time; results are compared with eager calls under the same seed.
"""

from __future__ import annotations

import pytest
import torch

from fastpipe import ops

pytestmark = pytest.mark.timeout(600)

BATCH_SIZES = (8, 5, 3)


def _calls(generator=None):
    kw = {} if generator is None else {"generator": generator}

    def targets(x):
        return torch.arange(x.shape[0]) % 3

    return {
        "normalize": lambda x: ops.normalize(x, (0.5, 0.4, 0.3), (0.2, 0.2, 0.2)),
        "cutout": lambda x: ops.cutout(x, 2, 4, fill=(1, 2, 3), **kw),
        "cutout_inplace": lambda x: ops.cutout(x, 2, 4, inplace=True, **kw),
        "random_erasing": lambda x: ops.random_erasing(x, p=0.8, value=3, max_count=2, **kw),
        "random_erasing_noise": lambda x: ops.random_erasing(
            x.float(), p=0.8, value="random", **kw
        ),
        "random_erasing_inplace": lambda x: ops.random_erasing(x, p=0.9, inplace=True, **kw),
        "mixup": lambda x: ops.mixup(x, targets(x), 0.4, 3, label_smoothing=0.1, **kw),
        "mixup_inplace": lambda x: ops.mixup(x, targets(x), 0.4, 3, inplace=True, **kw),
        "cutmix": lambda x: ops.cutmix(x, targets(x), 1.0, 3, **kw),
        "cutmix_inplace": lambda x: ops.cutmix(x, targets(x), 1.0, 3, inplace=True, **kw),
    }


def _assert_same(got, expected) -> None:
    for a, b in zip(
        torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected), strict=True
    ):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(_calls()))
@pytest.mark.slow
def test_op_compiles_fullgraph_with_dynamic_shapes_across_changing_batch_sizes(name):
    torch._dynamo.reset()
    fn = _calls()[name]
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in BATCH_SIZES:
        images = torch.randint(0, 256, (n, 3, 12, 10), dtype=torch.uint8)
        torch.manual_seed(n)
        got = compiled(images.clone())
        torch.manual_seed(n)
        _assert_same(got, fn(images.clone()))


@pytest.mark.parametrize("name", ["cutout", "random_erasing", "mixup", "cutmix"])
@pytest.mark.slow
def test_op_with_a_generator_compiles_across_changing_batch_sizes(name):
    # Dynamo cannot put a torch.Generator argument in a graph (a graph break, so no fullgraph),
    # but the op must still run compiled, with the generator's draws.
    torch._dynamo.reset()
    for n in BATCH_SIZES:
        images = torch.randint(0, 256, (n, 3, 12, 10), dtype=torch.uint8)
        compiled = torch.compile(
            _calls(torch.Generator().manual_seed(n))[name], dynamic=True, backend="aot_eager"
        )
        got = compiled(images.clone())
        _assert_same(got, _calls(torch.Generator().manual_seed(n))[name](images.clone()))


@pytest.mark.slow
def test_inductor_compiles_random_erasing_across_changing_batch_sizes():
    # The reproduction, with the default backend.
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: ops.random_erasing(x, p=0.5), fullgraph=True, dynamic=True)
    for n in BATCH_SIZES:
        assert compiled(torch.rand(n, 3, 12, 10)).shape == (n, 3, 12, 10)


def _augment(x, targets):
    """The step of the cuda lane's compile tests: every random op, draws from torch's global
    generator (no generator is built inside a compiled function: Dynamo breaks the graph)."""
    y = ops.cutout(x, num_holes=2, size=5)
    y = ops.normalize(y, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    y, soft = ops.mixup(y, targets, 0.4, 10)
    return ops.random_erasing(y, p=1.0) * 2, soft


@pytest.mark.slow
def test_inductors_own_rng_compiles_in_one_graph_and_a_seed_reproduces():
    # What users run: Inductor's default RNG (fallback_random=False), which draws its own
    # numbers (they differ from eager's), seeded from torch's global generator at each call.
    from torch._dynamo.utils import counters

    assert not torch._inductor.config.fallback_random
    x = torch.randint(0, 256, (6, 3, 19, 23), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    targets = torch.arange(6) % 10
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_augment, fullgraph=True)
    runs = {}
    for seed in (1, 2, 1):
        torch.manual_seed(seed)
        runs.setdefault(seed, []).append(compiled(x, targets))
    assert not counters["graph_break"]
    (first, again), (other,) = runs[1], runs[2]
    for a, b in zip(first, again):
        assert torch.equal(a, b), "the same seed gave another result"
    assert not torch.equal(first[0], other[0]), "another seed gave the same draws"
    images, soft = first
    assert images.shape == x.shape and images.dtype == torch.float32
    assert bool(images.isfinite().all())
    torch.testing.assert_close(soft.sum(1), torch.ones(6))

"""cuda lane: every fastpipe op on the GPU against the CPU kernel, bit for bit.

The CUDA kernels and the CPU kernels share their per-element math (fastpipe/csrc/kernels.h) and
are built without fused multiply-adds, so every dtype (uint8, float32, float16, bfloat16) must
come out bit-identical; the random parameters are drawn on the CPU, so one seed gives the same
boxes and weights on both devices. Covered: every op and in-place variant, four layouts
(contiguous, channels_last, strided, permuted), ops launched on a non-default stream (they must
run on the current stream: the result is read there without synchronizing), empty and
single-sample batches, torch.compile in one graph without a synchronization (and eager calls
without one: torch's sync debug mode set to "error"), mean/std as CUDA tensors, a real CUDA graph
capture of normalize and the refusal of the random ops and batch transforms, the second GPU
(``cuda:1``, skipped with one GPU), and the fallback when the kernel image does not fit the GPU.

Skipped without a GPU; FASTPIPE_REQUIRE_CUDA=1 makes that a failure (docs/gpu.md).
"""

from __future__ import annotations

import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _extension
from tests.helpers.cuda import gpu_sleep, require_cuda_part
from tests.ops.test_default_device import CALLS as DEFAULT_DEVICE_CALLS
from tests.ops.test_default_device import _images as default_device_images
from tests.ops.test_default_device import _targets as default_device_targets

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600)]

DTYPES = (torch.uint8, torch.float32, torch.float16, torch.bfloat16)
LAYOUTS = ("contiguous", "channels_last", "strided", "permuted")


@pytest.fixture(autouse=True)
def cuda_kernels():
    require_cuda_part(
        ops.extension_available("cuda"),
        f"fastpipe._C has no CUDA kernels for this GPU (built for {_extension.CUDA_ARCHS}); "
        "rebuild it with nvcc (docs/gpu.md)",
    )


def batch(dtype: torch.dtype, layout: str, shape=(5, 3, 19, 23), seed: int = 0) -> torch.Tensor:
    """A CPU batch of ``shape`` in ``layout``: uint8 0-255, floats roughly N(0, 1)."""
    n, c, h, w = shape
    g = torch.Generator().manual_seed(seed)
    big = (n, c, h + 3, w * 2)
    if dtype == torch.uint8:
        base = torch.randint(0, 256, big, dtype=dtype, generator=g)
    else:
        base = torch.randn(big, generator=g).to(dtype)
    dense = base[:, :, :h, :w].contiguous()
    if layout == "contiguous":
        return dense
    if layout == "channels_last":
        return dense.contiguous(memory_format=torch.channels_last)
    if layout == "strided":
        return base[:, :, 3:, ::2]
    return dense.transpose(2, 3).contiguous().transpose(2, 3)


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same(gpu: torch.Tensor, cpu: torch.Tensor) -> None:
    """The same bits (compared as integers, so -0.0 is not 0.0), shape and memory format."""
    assert gpu.device.type == "cuda"
    got = gpu.cpu()
    assert got.dtype == cpu.dtype and got.shape == cpu.shape
    assert got.is_contiguous(memory_format=torch.channels_last) == cpu.is_contiguous(
        memory_format=torch.channels_last
    )
    bits = _SAME_SIZE_INT[cpu.element_size()]
    assert torch.equal(got.view(bits), cpu.view(bits)), (
        f"max difference {(got.double() - cpu.double()).abs().max().item()}"
    )


def on_both(function, x: torch.Tensor, seed: int = 7):
    """``function(images, generator)`` on the CPU batch and on its GPU copy (same strides)."""
    x_gpu = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda")
    x_gpu.copy_(x)
    assert x_gpu.stride() == x.stride()
    cpu = function(x, torch.Generator().manual_seed(seed))  # after the copy: in place is fine
    gpu = function(x_gpu, torch.Generator().manual_seed(seed))
    return gpu, cpu


OPS = {
    "cutout": lambda x, g: ops.cutout(x, num_holes=3, size=7, fill=9, generator=g),
    "random_erasing": lambda x, g: ops.random_erasing(x, p=1.0, max_count=3, generator=g),
    "random_erasing_noise": lambda x, g: ops.random_erasing(
        x, p=1.0, value="random", generator=g
    ),
    "mixup": lambda x, g: ops.mixup(x, torch.arange(x.shape[0]), 0.4, 10, 0.1, generator=g)[0],
    "cutmix": lambda x, g: ops.cutmix(x, torch.arange(x.shape[0]), 1.0, 10, generator=g)[0],
}


def _in_place(name: str):
    def run(x, g):
        if name in ("mixup", "cutmix"):
            getattr(ops, name)(x, torch.arange(x.shape[0]), 0.7, 10, generator=g, inplace=True)
        elif name == "cutout":
            ops.cutout(x, num_holes=3, size=7, fill=9, generator=g, inplace=True)
        else:
            ops.random_erasing(x, p=1.0, max_count=3, generator=g, inplace=True)
        return x

    return run


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(OPS))
def test_op_on_cuda_equals_the_cpu_kernel_bit_for_bit(op, dtype, layout):
    gpu, cpu = on_both(OPS[op], batch(dtype, layout))
    same(gpu, cpu)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ("cutout", "random_erasing", "mixup", "cutmix"))
def test_in_place_op_on_cuda_equals_the_cpu_kernel_bit_for_bit(op, dtype, layout):
    gpu, cpu = on_both(_in_place(op), batch(dtype, layout))
    same(gpu, cpu)


@pytest.mark.parametrize("channels_last", (False, True))
@pytest.mark.parametrize("out_dtype", (torch.float32, torch.float16, torch.bfloat16))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_normalize_on_cuda_equals_the_cpu_kernel_bit_for_bit(dtype, layout, out_dtype,
                                                             channels_last):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    gpu, cpu = on_both(
        lambda x, g: ops.normalize(x, mean, std, dtype=out_dtype, channels_last=channels_last),
        batch(dtype, layout),
    )
    same(gpu, cpu)


def test_normalize_of_many_channels_and_a_large_batch_takes_every_kernel_path():
    # More channels than the per-block table holds: the per-element kernel.
    wide = batch(torch.uint8, "contiguous", shape=(2, 1500, 5, 7))
    mean, std = torch.rand(1500), torch.rand(1500) + 0.2
    gpu, cpu = on_both(lambda x, g: ops.normalize(x, mean, std), wide)
    same(gpu, cpu)
    # A batch whose strided offsets pass 2^31 (2 GiB of uint8): the int64 index path.
    base = torch.zeros(2**31 + 2**12, dtype=torch.uint8, device="cuda")
    far = base.as_strided((2, 3, 4, 5), (2**31, 64, 8, 1))
    far.copy_(torch.randint(0, 256, far.shape, dtype=torch.uint8))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.3, 0.4)
    same(ops.normalize(far, mean, std), ops.normalize(far.cpu(), mean, std))
    del base, far


@pytest.mark.parametrize("shape", ((0, 3, 8, 8), (1, 3, 8, 8), (1, 1, 1, 1)))
@pytest.mark.parametrize("op", sorted(OPS))
def test_empty_and_single_sample_batches(op, shape):
    gpu, cpu = on_both(OPS[op], batch(torch.uint8, "contiguous", shape=shape))
    same(gpu, cpu)
    gpu, cpu = on_both(lambda x, g: ops.normalize(x, (0.5,) * shape[1], (0.25,) * shape[1]),
                       batch(torch.uint8, "channels_last", shape=shape))
    same(gpu, cpu)


@pytest.mark.parametrize("op", sorted(OPS) + ["normalize"])
def test_ops_run_on_the_current_stream_not_the_default_one(op):
    # The side stream is busy for 200 ms before the input is written; if an op ran on the
    # default stream (or another), it would read the input before the write and differ.
    function = OPS.get(op) or (lambda x, g: ops.normalize(x, (0.4, 0.5, 0.6), (0.2, 0.2, 0.2)))
    x = batch(torch.float32, "channels_last", shape=(8, 3, 64, 64))
    expected = function(x.clone(), torch.Generator().manual_seed(3))
    source = x.pin_memory()
    side = torch.cuda.Stream()
    # A first call blocks the host until the device is idle, whatever the stream: the kernel's
    # module loads (CUDA's lazy loading) and the output's memory is allocated (cudaMalloc).
    with torch.cuda.stream(side):
        function(source.cuda(), torch.Generator().manual_seed(3))
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        x_gpu = torch.empty_like(source, device="cuda")
        gpu_sleep(0.2)
        x_gpu.copy_(source, non_blocking=True)
        out = function(x_gpu, torch.Generator().manual_seed(3))
        result = torch.empty_like(out, device="cpu").pin_memory()
        result.copy_(out, non_blocking=True)
    assert not side.query(), "the stream finished its 200 ms of work at once"
    side.synchronize()
    same(out, expected)
    assert torch.equal(result, expected)


@pytest.mark.parametrize("dtype", (torch.uint8, torch.float32))
def test_ops_under_torch_compile_equal_eager_in_one_graph_without_a_sync(dtype):
    # No generator is built inside the compiled function (Dynamo graph-breaks on one): the draws
    # come from torch's global generator, seeded alike before each call.
    from torch._dynamo.utils import counters

    def step(x, targets):
        y = ops.cutout(x, num_holes=2, size=5)
        y = ops.normalize(y, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
        y, soft = ops.mixup(y, targets, 0.4, 10)
        return ops.random_erasing(y, p=1.0) * 2, soft

    x = batch(dtype, "channels_last").cuda()
    targets = torch.arange(x.shape[0], device="cuda")
    torch._dynamo.reset()
    counters.clear()
    # Inductor has its own RNG unless told to fall back to eager's, which the comparison needs
    # (on the H100, without it, the compiled draws differed from eager's).
    with torch._inductor.config.patch(fallback_random=True):
        compiled = torch.compile(step, fullgraph=True)
        torch.manual_seed(11)
        compiled(x, targets)  # compiles
        assert not counters["graph_break"]
        torch.manual_seed(12)
        expected = step(x, targets)
        torch.manual_seed(12)
        # The host-drawn parameters reach the GPU through fastpipe::host_to_device (pinned,
        # non_blocking): the compiled call must not synchronize.
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = compiled(x, targets)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(got, expected):
        same(a, b.cpu())


def test_ops_under_torch_compile_with_inductors_own_rng_one_graph_no_sync_a_seed_reproduces():
    # What users run: Inductor's default RNG (fallback_random=False). Its draws differ from
    # eager's, so no comparison with eager: one graph, no synchronization, and a seed (torch's
    # global generator, which Inductor seeds its draws from at each call) reproduces the result.
    from torch._dynamo.utils import counters

    from tests.ops.test_compile import _augment

    assert not torch._inductor.config.fallback_random
    x = batch(torch.uint8, "channels_last").cuda()
    targets = torch.arange(x.shape[0], device="cuda") % 10
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_augment, fullgraph=True)
    torch.manual_seed(0)
    compiled(x, targets)  # compiles
    torch.cuda.synchronize()
    runs = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for seed in (1, 2, 1):
            torch.manual_seed(seed)
            runs.append(compiled(x, targets))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert not counters["graph_break"]
    first, other, again = runs
    for a, b in zip(first, again):
        assert torch.equal(a, b), "the same seed gave another result"
    assert not torch.equal(first[0], other[0]), "another seed gave the same draws"
    assert bool(first[0].isfinite().all())
    torch.testing.assert_close(first[1].sum(1), torch.ones(x.shape[0], device="cuda"))


@pytest.mark.parametrize("dtype", (torch.uint8, torch.float32))
@pytest.mark.parametrize("name", list(DEFAULT_DEVICE_CALLS))
def test_ops_under_a_cuda_default_device_equal_the_cpu_result(name, dtype):
    # torch.set_default_device("cuda"): the draws stay on the CPU (tests/ops/test_default_device
    # checks every op on the CPU with meta); the GPU result equals the CPU kernel's, bit for bit.
    call = DEFAULT_DEVICE_CALLS[name]
    x, t = default_device_images(dtype), default_device_targets()
    torch.manual_seed(7)
    expected = call(x.clone(), t, torch.Generator().manual_seed(3))
    x_gpu, t_gpu = x.cuda(), t.cuda()
    torch.manual_seed(7)
    torch.set_default_device("cuda")
    try:
        got = call(x_gpu, t_gpu, torch.Generator().manual_seed(3))
    finally:
        torch.set_default_device(None)
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for a, b in zip(got, expected, strict=True):
        same(a, b)


def test_eager_ops_and_batch_transforms_do_not_synchronize():
    x = batch(torch.float32, "channels_last", shape=(8, 3, 32, 32)).cuda()
    targets = torch.arange(8, device="cuda") % 10
    calls = [
        lambda: ops.normalize(x, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
        lambda: ops.cutout(x, num_holes=2, size=5),
        lambda: ops.random_erasing(x, p=1.0, value="rand", max_count=2),
        lambda: ops.mixup(x, targets, 0.4, 10),
        lambda: ops.cutmix(x, targets, 1.0, 10),
        lambda: ops.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=10)(x, targets),
        lambda: ops.RandomErasing(probability=1.0, mode="pixel")(x),
    ]
    for call in calls:
        call()  # warm-up: first launches may load modules
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for call in calls:
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", (torch.uint8, torch.float32))
def test_normalize_with_mean_and_std_as_cuda_tensors(dtype):
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x = batch(dtype, "strided")
    gpu = ops.normalize(x.cuda(), torch.tensor(mean, device="cuda"),
                        torch.tensor(std, device="cuda"))
    same(gpu, ops.normalize(x, mean, std))


def _capturable(static: torch.Tensor, function) -> None:
    """torch.cuda.graph's warm-up: ``function`` once on a side stream before the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        function(static)
    torch.cuda.current_stream().wait_stream(side)


def test_normalize_with_cuda_statistics_is_captured_by_a_cuda_graph_and_replayed():
    mean = torch.tensor((0.485, 0.456, 0.406), device="cuda")
    std = torch.tensor((0.229, 0.224, 0.225), device="cuda")
    static = batch(torch.uint8, "contiguous", shape=(4, 3, 32, 32)).cuda()
    _capturable(static, lambda x: ops.normalize(x, mean, std))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.normalize(static, mean, std)
    for seed in (1, 2, 3):
        new = batch(torch.uint8, "contiguous", shape=(4, 3, 32, 32), seed=seed)
        static.copy_(new)
        graph.replay()
        same(out, ops.normalize(new, mean.cpu(), std.cpu()))


def test_random_ops_and_batch_transforms_refuse_a_real_cuda_graph_capture():
    static = batch(torch.float32, "contiguous", shape=(4, 3, 32, 32)).cuda()
    targets = torch.arange(4, device="cuda")
    no_mix = ops.Mixup(mixup_alpha=1.0, num_classes=10, prob=0.0)  # draws "do not mix"
    calls = {
        "cutout": lambda x: ops.cutout(x),
        "mixup": lambda x: ops.mixup(x, targets, 0.4, 10),
        "Mixup prob=0": lambda x: no_mix(x, targets),
        "RandomErasing": lambda x: ops.RandomErasing(probability=1.0)(x),
        "normalize, host statistics": lambda x: ops.normalize(x, (0.5,) * 3, (0.2,) * 3),
    }
    for name, call in calls.items():
        _capturable(static, call)
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="CUDA graph cannot capture"):
            with torch.cuda.graph(graph):
                call(static)
        assert not torch.cuda.is_current_stream_capturing(), name


@pytest.fixture
def second_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU here: the cuda:1 tests need a second")
    return torch.device("cuda", 1)


@pytest.mark.parametrize("op", sorted(OPS))
def test_ops_on_the_second_gpu_run_there_and_equal_the_cpu_kernel(op, second_gpu):
    x = batch(torch.float32, "channels_last")
    assert torch.cuda.current_device() == 0  # the images' device must win, not the current one
    gpu = OPS[op](x.to(second_gpu), torch.Generator().manual_seed(7))
    assert gpu.device == second_gpu
    same(gpu, OPS[op](x, torch.Generator().manual_seed(7)))
    mean = torch.tensor((0.4, 0.5, 0.6), device="cuda:0")  # statistics on the other GPU
    out = ops.normalize(x.to(second_gpu), mean, (0.2, 0.2, 0.2))
    assert out.device == second_gpu
    same(out, ops.normalize(x, (0.4, 0.5, 0.6), (0.2, 0.2, 0.2)))


def test_ops_fall_back_when_the_kernel_image_does_not_fit(monkeypatch):
    # A build for another architecture (recorded in fastpipe._C): the ops must warn and use the
    # reference, which gives the same bits, instead of failing with "no kernel image".
    major, minor = torch.cuda.get_device_capability()
    other = "7.5" if major >= 8 else "9.0"
    monkeypatch.setattr(_extension, "CUDA_ARCHS", other)
    monkeypatch.setattr(_extension, "_warned", False)
    _extension._cuda_kernels_fit.cache_clear()
    try:
        assert not ops.extension_available("cuda")
        x = batch(torch.uint8, "contiguous")
        with pytest.warns(RuntimeWarning, match=f"capability {major}.{minor}"):
            gpu = ops.normalize(x.cuda(), (0.5, 0.5, 0.5), (0.2, 0.2, 0.2))
        same(gpu, ops.normalize(x, (0.5, 0.5, 0.5), (0.2, 0.2, 0.2)))
    finally:
        _extension._cuda_kernels_fit.cache_clear()

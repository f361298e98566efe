"""cuda lane: every fastpipe op on the GPU against the CPU kernel, bit for bit.

The CUDA kernels and the CPU kernels share their per-element math (fastpipe/csrc/kernels.h) and
are built without fused multiply-adds, so every dtype (uint8, float32, float16, bfloat16) must
come out bit-identical; the random parameters are drawn on the CPU, so one seed gives the same
boxes and weights on both devices. Covered: every op and in-place variant, four layouts
(contiguous, channels_last, strided, permuted), ops launched on a non-default stream (they must
run on the current stream: the result is read there without synchronizing), empty and
single-sample batches, torch.compile, and the fallback when the kernel image does not fit the GPU.

Skipped without a GPU; FASTPIPE_REQUIRE_CUDA=1 makes that a failure (docs/gpu.md).
"""

from __future__ import annotations

import pytest
import torch

from fastpipe import ops
from fastpipe.ops import _extension
from tests.helpers.cuda import gpu_sleep, require_cuda_part

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


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


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
def test_ops_under_torch_compile_equal_eager(dtype):
    def step(x, g_seed: int):
        g = torch.Generator().manual_seed(g_seed)
        y = ops.cutout(x, num_holes=2, size=5, generator=g)
        y = ops.normalize(y, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
        return y * 2

    x = batch(dtype, "channels_last").cuda()
    compiled = torch.compile(step, fullgraph=False)
    same(compiled(x, 11), step(x, 11).cpu())


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

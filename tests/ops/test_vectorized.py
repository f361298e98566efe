"""The vectorized CPU conversions (float <-> uint8, float16, bfloat16) against torch's own, bit for
bit.

The CPU kernels convert runs of values with hand-written vector code (F16C, bit tricks for
bfloat16, SSE2 for uint8), compiled three times: for AVX-512 and AVX2, chosen at run time, and for
baseline x86-64. FASTPIPE_CPU_CAPABILITY caps the choice; subprocesses check that every version
gives the same bits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastpipe.ops import _extension, _reference

pytestmark = pytest.mark.extension

OPS = torch.ops.fastpipe if _extension.LOADED else None
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _extension_built():
    if not _extension.LOADED:
        if os.environ.get("FASTPIPE_REQUIRE_EXTENSION") == "1":
            pytest.fail("fastpipe._C is not built (FASTPIPE_REQUIRE_EXTENSION=1)")
        pytest.skip("fastpipe._C is not built")


def _special_floats(g: torch.Generator) -> torch.Tensor:
    """float32 values that stress a conversion: random bit patterns (NaN and infinity excluded,
    whose payloads torch does not promise), float16 and bfloat16 ties, subnormals and overflow."""
    bits = torch.randint(-(2**31), 2**31, (20000,), dtype=torch.int64, generator=g)
    values = bits.to(torch.int32).view(torch.float32)
    values = values[torch.isfinite(values)]
    halves = torch.randn(5000, generator=g).half().float()
    bf16s = torch.randn(5000, generator=g).bfloat16().float()
    ties = torch.cat(
        (
            halves + halves.abs() * 2.0**-11,  # halfway between two float16 values
            bf16s + bf16s.abs() * 2.0**-8,  # halfway between two bfloat16 values
            torch.tensor([65504.0, 65519.0, 65520.0, 1e6, -1e6, 6e-8, 3e-8, 1e-40, 0.0, -0.0]),
        )
    )
    small = torch.randn(5000, generator=g) * 1e-5  # float16 subnormals
    return torch.cat((values, ties, small, torch.randn(5000, generator=g) * 100))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float_to_half_and_bfloat16_round_like_torch(dtype):
    # normalize with mean 0 and std 1 converts float32 values unchanged to dtype.
    x = _special_floats(torch.Generator().manual_seed(0))
    images = x[: x.numel() // 4 * 4].view(1, 4, 1, -1)
    mean, std = torch.zeros(4), torch.ones(4)
    out = OPS.normalize(images, mean, std, dtype, False)
    assert torch.equal(out.view(torch.int16), images.to(dtype).view(torch.int16))
    assert torch.equal(out, _reference.normalize(images, mean, std, dtype, False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_and_bfloat16_to_float_exactly(dtype):
    # Every finite 16-bit pattern: mixup of a batch of one (mixed with itself) with lam = 1 gives
    # x * 1 + x * 0, its input, through float32.
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    values = values[torch.isfinite(values)].view(1, 1, 1, -1)
    out = OPS.mixup(values, torch.ones(1))
    assert torch.equal(out.view(torch.int16), values.view(torch.int16))


_SCRIPT = """
import sys, torch
import fastpipe.ops
g = torch.Generator().manual_seed(0)
ops = torch.ops.fastpipe
results = []
x8 = torch.randint(0, 256, (4, 3, 17, 45), dtype=torch.uint8, generator=g)
xf = torch.randn(4, 3, 17, 45, generator=g) * 3
mean, std = torch.rand(3, generator=g), torch.rand(3, generator=g) + 0.05
lam = torch.rand(4, generator=g)
boxes = torch.tensor([[[0, 0, 17, 45]], [[2, 3, 9, 40]], [[5, -4, 30, 20]], [[0, 30, 1, 45]]])
seeds = torch.randint(0, 2**32, (4,), generator=g)
for x in (x8, xf, xf.half(), xf.bfloat16(), x8.contiguous(memory_format=torch.channels_last)):
    results.append(ops.mixup(x, lam))
    results.append(ops.erase(x, boxes, x[0, :, 0, 0].clone(), seeds))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for channels_last in (False, True):
            results.append(ops.normalize(x, mean, std, dtype, channels_last))
# uint8 rounding: every pair of byte values, with weights that give ties.
a, b = torch.meshgrid(torch.arange(256), torch.arange(256), indexing="ij")
pairs = torch.stack((a.flatten(), b.flatten())).to(torch.uint8).view(2, 1, 256, 256)
for weight in (0.5, 0.25, 0.3):
    results.append(ops.mixup(pairs, torch.tensor([weight, 1 - weight])))
torch.save(results, sys.argv[1])
"""


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_baseline_avx2_and_avx512_code_give_the_same_bits(tmp_path):
    outputs = {}
    for capability in ("baseline", "avx2", "avx512"):
        path = tmp_path / f"{capability}.pt"
        env = dict(os.environ, FASTPIPE_CPU_CAPABILITY=capability, PYTHONPATH=str(ROOT))
        subprocess.run(
            [sys.executable, "-c", _SCRIPT, str(path)], check=True, env=env, cwd=ROOT, timeout=100
        )
        outputs[capability] = torch.load(path)
    for capability in ("avx2", "avx512"):
        assert len(outputs[capability]) == len(outputs["baseline"]) == 43
        for a, b in zip(outputs[capability], outputs["baseline"], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), capability

"""The CUDA kernels' fast paths (fastpipe/csrc/cuda/index.h), run on the CPU.

Every kernel (normalize, erase, mixup, cutmix and the in-place forms) has a 32-bit index path,
taken when the batch fits_in_32_bits: kernels.h's per-element bodies instantiated with
cuda::Index32 are built here for the host and compared with the reference, and the PTX of
kernels.cu is read to check that those instances do no 64-bit division.

The kernel computes each channel's scale and shift once per block (a shared-memory table) and,
when every index and strided offset fits in 32 bits, decodes indices with 32-bit division. Both
must leave the bits unchanged: here the fast path's body is compiled for the host, as the
kernel's loop runs it, and compared with the int64 per-element body of kernels.h and with the
PyTorch reference, for every layout. What cannot run here: the kernel itself (the cuda lane's
tests/cuda/test_ops.py compares it with the CPU kernel on a GPU), and its speed (not measured).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fastpipe.ops import _reference
from tests.ops.test_cuda_build import _tool, build_emulation, check_bodies_against_the_reference

pytestmark = [pytest.mark.extension, pytest.mark.timeout(120)]

CSRC = Path(__file__).resolve().parents[2] / "fastpipe" / "csrc"

_EMULATION = r"""
#include <cstdint>
#include <type_traits>
#include "cuda/index.h"

using namespace fastpipe;
using namespace fastpipe::cuda;

struct HostConv {
  static float to_float(uint8_t v) { return static_cast<float>(v); }
  static float to_float(float v) { return v; }
  template <typename T>
  static T from_float(float v) {
    if constexpr (std::is_same<T, uint8_t>::value) { return round_to_byte(v); } else { return v; }
  }
};

static Geometry geo(const int64_t* g) { return Geometry{g[0], g[1], g[2], g[3]}; }
static Strides str(const int64_t* s) { return Strides{s[0], s[1], s[2], s[3]}; }

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int fits32(const int64_t* g, const int64_t* s) { return fits_in_32_bits(geo(g), str(s)); }

// 1 when dense_index32 and strided_offset32 agree with kernels.h's int64 versions for every i.
EXPORT int index32_agrees(const int64_t* g, const int64_t* s, int cl) {
  const Geometry geometry = geo(g);
  const int64_t total = g[0] * g[1] * g[2] * g[3];
  for (int64_t i = 0; i < total; ++i) {
    const Index4 a = dense_index(i, geometry, cl);
    const Index4 b = dense_index32(static_cast<uint32_t>(i), geometry, cl);
    if (a.n != b.n || a.c != b.c || a.y != b.y || a.x != b.x) return 0;
    if (strided_offset(a, str(s)) != static_cast<int64_t>(strided_offset32(b, str(s)))) return 0;
  }
  return 1;
}

// The table kernel's loop, with 32-bit (index32 = 1) or int64 indices.
template <typename T>
static void normalize_fast(const T* in, const int64_t* s, float* out, int cl, const int64_t* g,
                           const float* mean, const float* std, int index32) {
  const Geometry geometry = geo(g);
  const Strides strides = str(s);
  float scale[kMaxTableChannels], shift[kMaxTableChannels];
  const bool u8 = std::is_same<T, uint8_t>::value;
  for (int64_t c = 0; c < g[1]; ++c) normalize_table_entry(c, mean, std, u8, scale, shift);
  const int64_t total = g[0] * g[1] * g[2] * g[3];
  for (int64_t i = 0; i < total; ++i) {
    if (index32) {
      const Index4 p = dense_index32(static_cast<uint32_t>(i), geometry, cl);
      out[i] = normalize_at<T, float, HostConv>(p, strided_offset32(p, strides), in, scale, shift);
    } else {
      const Index4 p = dense_index(i, geometry, cl);
      out[i] = normalize_at<T, float, HostConv>(p, strided_offset(p, strides), in, scale, shift);
    }
  }
}

EXPORT void normalize_fast_u8(const uint8_t* in, const int64_t* s, float* out, int cl,
                              const int64_t* g, const float* mean, const float* std, int i32) {
  normalize_fast(in, s, out, cl, g, mean, std, i32);
}
EXPORT void normalize_fast_f32(const float* in, const int64_t* s, float* out, int cl,
                               const int64_t* g, const float* mean, const float* std, int i32) {
  normalize_fast(in, s, out, cl, g, mean, std, i32);
}
"""


@pytest.fixture(scope="module")
def fast_path(tmp_path_factory):
    compiler = next((shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++")
                     if shutil.which(c)), None)
    if compiler is None:
        if os.environ.get("FASTPIPE_REQUIRE_EXTENSION") == "1":
            pytest.fail("no C++ compiler; FASTPIPE_REQUIRE_EXTENSION=1 needs one")
        pytest.skip("no C++ compiler")
    work = tmp_path_factory.mktemp("fast_path")
    (work / "fast.cpp").write_text(_EMULATION)
    library = work / "fast.so"
    command = [compiler, "-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC",
               f"-I{CSRC}", str(work / "fast.cpp"), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    return ctypes.CDLL(str(library))


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _i64(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def _layouts(dtype: torch.dtype):
    g = torch.Generator().manual_seed(1)
    for shape in ((3, 3, 7, 5), (2, 1, 4, 9), (1, 4, 6, 6), (4, 3, 1, 1)):
        n, c, h, w = shape
        big = (n, c, h + 2, w * 2)
        if dtype == torch.uint8:
            base = torch.randint(0, 256, big, dtype=dtype, generator=g)
        else:
            base = torch.randn(big, generator=g)
        dense = base[:, :, :h, :w].contiguous()
        yield dense
        yield dense.contiguous(memory_format=torch.channels_last)
        yield base[:, :, 2:, ::2]
        yield dense.transpose(2, 3).contiguous().transpose(2, 3)


@pytest.mark.parametrize("dtype", (torch.uint8, torch.float32))
def test_table_and_32_bit_paths_give_the_bits_of_the_reference(fast_path, dtype):
    g = torch.Generator().manual_seed(2)
    suffix = "u8" if dtype == torch.uint8 else "f32"
    for x in _layouts(dtype):
        c = x.shape[1]
        mean, std = torch.rand(c, generator=g), torch.rand(c, generator=g) + 0.05
        for channels_last in (False, True):
            expected = _reference.normalize(x, mean, std, torch.float32, channels_last)
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            strides, geometry = _i64(x.stride()), _i64(x.shape)  # alive during the call
            for index32 in (1, 0):
                out = torch.empty(x.shape, dtype=torch.float32, memory_format=fmt)
                getattr(fast_path, f"normalize_fast_{suffix}")(
                    _ptr(x), _ptr(strides), _ptr(out), ctypes.c_int(channels_last),
                    _ptr(geometry), _ptr(mean), _ptr(std), ctypes.c_int(index32),
                )
                assert torch.equal(out.view(torch.int32), expected.view(torch.int32)), (
                    x.shape, x.stride(), channels_last, index32
                )


def test_32_bit_index_decoding_agrees_with_int64(fast_path):
    for shape, strides in (((3, 5, 7, 11), (385, 77, 11, 1)), ((2, 3, 4, 5), (60, 1, 15, 3)),
                           ((1, 1, 1, 1), (1, 1, 1, 1)), ((4, 3, 9, 2), (100, 30, 3, 1))):
        geometry, stride_t = _i64(shape), _i64(strides)
        for channels_last in (0, 1):
            assert fast_path.index32_agrees(_ptr(geometry), _ptr(stride_t),
                                            ctypes.c_int(channels_last))


@pytest.mark.parametrize(
    "shape, strides, fits",
    [
        ((256, 3, 224, 224), (150528, 50176, 224, 1), True),  # an ImageNet batch
        ((1, 1, 1, 2**31 - 1), (2**31 - 1, 2**31 - 1, 2**31 - 1, 1), True),
        ((1, 1, 1, 2**31), (2**31, 2**31, 2**31, 1), False),  # 2^31 elements
        ((2, 3, 4, 5), (2**31, 64, 8, 1), False),  # offsets past 2^31 through a stride
        ((2, 3, 4, 5), (2**30, 64, 8, 1), True),
        ((0, 3, 4, 5), (60, 20, 5, 1), True),  # empty
        ((2, 3, 4, 5), (60, 20, 5, -1), False),
    ],
)
def test_fits_in_32_bits_bounds_every_index_and_offset(fast_path, shape, strides, fits):
    geometry, stride_t = _i64(shape), _i64(strides)
    assert bool(fast_path.fits32(_ptr(geometry), _ptr(stride_t))) is fits


def test_32_bit_bodies_of_erase_mixup_and_cutmix_give_the_bits_of_the_reference(tmp_path):
    # The same host loop as tests/ops/test_cuda_build.py, the bodies instantiated with Index32.
    library = build_emulation(
        tmp_path, ("-include", "cuda/index.h", "-DFP_INDEX=fastpipe::cuda::Index32")
    )
    check_bodies_against_the_reference(library)


_KERNELS = ("erase_kernel", "erase_inplace_kernel", "mixup_kernel", "mixup_inplace_kernel",
            "cutmix_kernel", "cutmix_inplace_kernel", "normalize_table_kernel")


def _ptx_entries(tmp_path) -> dict[str, str]:
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = _tool([os.path.join(cuda_home, "bin", "nvcc"), "nvcc"], "nvcc")
    ptx = tmp_path / "kernels.ptx"
    command = [nvcc, "-ptx", "-O3", "--fmad=false", "-std=c++17", f"-I{CSRC}",
               "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
               "-arch=compute_90", str(CSRC / "cuda" / "kernels.cu"), "-o", str(ptx)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    entries = {}
    for body in ptx.read_text().split(".entry ")[1:]:
        entries[body.split("(", 1)[0]] = body
    return entries


@pytest.mark.slow
def test_32_bit_kernels_do_no_64_bit_division_in_the_ptx(tmp_path):
    entries = _ptx_entries(tmp_path)
    for kernel in _KERNELS:
        # Itanium mangling: the kernel's name, then its template arguments; Lb1E is `true` (the
        # Index32 path), one instance per image type (and per output type for normalize).
        fast = {name: body for name, body in entries.items()
                if f"{len(kernel)}{kernel}I" in name and "Lb1E" in name}
        assert len(fast) >= 4, (kernel, sorted(entries))
        for name, body in fast.items():
            divisions = [op for op in ("div.s64", "rem.s64", "div.u64", "rem.u64") if op in body]
            assert not divisions, f"{name} does 64-bit division: {divisions}"

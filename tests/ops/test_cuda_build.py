"""The CUDA side of fastpipe._C, on a machine without a GPU.

The CUDA kernels cannot run here, so: every .cu file is compiled with nvcc for sm_80 and sm_90, and
the per-element bodies of the CUDA kernels (kernels.h: index decoding, strided reads, boxes,
noise, rounding) are compiled for the host with the system C++ compiler and run on the CPU against
the reference. Untested here: the grid-stride loop and launch configuration in kernels.cu, the
float16/bfloat16 conversions of CUDA, and the torch glue in ops_cuda.cpp.

With FASTPIPE_REQUIRE_EXTENSION=1 (CI) a missing nvcc or C++ compiler is a failure, not a skip.
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
from tests.helpers.ops import write_on_strided_copy

pytestmark = [pytest.mark.extension, pytest.mark.timeout(120)]

CSRC = Path(__file__).resolve().parents[2] / "fastpipe" / "csrc"
ARCHS = ("80", "90")


def _tool(names: list[str], what: str) -> str:
    for name in names:
        found = shutil.which(name) or (
            name if os.path.isabs(name) and os.path.exists(name) else None
        )
        if found:
            return found
    message = f"no {what} found (looked for {', '.join(names)})"
    if os.environ.get("FASTPIPE_REQUIRE_EXTENSION") == "1":
        pytest.fail(f"{message}; FASTPIPE_REQUIRE_EXTENSION=1 needs it")
    pytest.skip(message)


@pytest.mark.parametrize("source", sorted(p.name for p in (CSRC / "cuda").glob("*.cu")))
@pytest.mark.slow
def test_cuda_file_compiles_with_nvcc_for_sm80_and_sm90(source, tmp_path):
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = _tool(
        [os.path.join(cuda_home, "bin", "nvcc"), "/usr/local/cuda/bin/nvcc", "nvcc"], "nvcc"
    )
    command = [
        nvcc,
        "-c",
        "-O3",
        "--fmad=false",
        "-std=c++17",
        f"-I{CSRC}",
        "-Werror",
        "all-warnings",
    ]
    # The flags torch.utils.cpp_extension adds for .cu files, so the code compiles the same way.
    command += ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__"]
    command += ["-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"]
    for arch in ARCHS:
        command += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    command += [str(CSRC / "cuda" / source), "-o", str(tmp_path / "kernels.o")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"nvcc failed:\n{' '.join(command)}\n{result.stderr}"
    # The embedded fatbinary names the GPU architectures of its cubins.
    binary = (tmp_path / "kernels.o").read_bytes()
    for arch in ARCHS:
        assert f"sm_{arch}".encode() in binary, f"no sm_{arch} code in the object"


# The CUDA kernels' bodies, instantiated for the host: uint8 and float32, one loop over the
# output elements in place of the grid.
_EMULATION = r"""
#include <cstdint>
#include <type_traits>
#include "kernels.h"

// The index policy the bodies are instantiated with: kernels.h's int64 one here;
// tests/ops/test_cuda_fast_path.py builds the same file with cuda::Index32.
#ifndef FP_INDEX
#define FP_INDEX Index64
#endif

using namespace fastpipe;

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
static int64_t total(const int64_t* g) { return g[0] * g[1] * g[2] * g[3]; }
static int64_t pair_total(const int64_t* g) { return (g[0] + 1) / 2 * g[1] * g[2] * g[3]; }

#define EXPORT extern "C" __attribute__((visibility("default")))
#define DEFINE(SUFFIX, T)                                                                      \
  EXPORT void normalize_##SUFFIX(const T* in, const int64_t* s, float* out, int cl,            \
                                 const int64_t* g, const float* mean, const float* std) {      \
    for (int64_t i = 0; i < total(g); ++i)                                                     \
      out[i] = normalize_element<T, float, HostConv>(i, in, str(s), cl, geo(g), mean, std,     \
                                                     std::is_same<T, uint8_t>::value);         \
  }                                                                                            \
  EXPORT void erase_##SUFFIX(const T* in, const int64_t* s, T* out, int cl, const int64_t* g,  \
                             const int64_t* boxes, int64_t count, const T* fill,               \
                             const int64_t* seeds) {                                           \
    for (int64_t i = 0; i < total(g); ++i)                                                     \
      out[i] = erase_element<T, HostConv, FP_INDEX>(i, in, str(s), cl, geo(g), boxes, count, fill, \
          seeds);                                                                                  \
  }                                                                                            \
  EXPORT void erase_inplace_##SUFFIX(T* images, const int64_t* s, const int64_t* g,            \
                                     const int64_t* boxes, int64_t count, const T* fill,       \
                                     const int64_t* seeds) {                                   \
    for (int64_t i = 0; i < total(g); ++i)                                                     \
      erase_inplace_element<T, HostConv, FP_INDEX>(i, images, str(s), geo(g), boxes, count, fill,  \
          seeds);                                                                                  \
  }                                                                                            \
  EXPORT void mixup_##SUFFIX(const T* in, const int64_t* s, T* out, int cl, const int64_t* g,  \
                             const float* lam) {                                               \
    for (int64_t i = 0; i < total(g); ++i)                                                     \
      out[i] = mixup_element<T, HostConv, FP_INDEX>(i, in, str(s), cl, geo(g), lam);               \
  }                                                                                            \
  EXPORT void cutmix_##SUFFIX(const T* in, const int64_t* s, T* out, int cl, const int64_t* g, \
                              const int64_t* boxes) {                                          \
    for (int64_t i = 0; i < total(g); ++i)                                                     \
      out[i] = cutmix_element<T, FP_INDEX>(i, in, str(s), cl, geo(g), boxes);                      \
  }                                                                                            \
  EXPORT void mixup_inplace_##SUFFIX(T* images, const int64_t* s, int cl, const int64_t* g,    \
                                     const float* lam) {                                       \
    for (int64_t i = 0; i < pair_total(g); ++i)                                                \
      mixup_pair_element<T, HostConv, FP_INDEX>(i, images, str(s), cl, geo(g), lam);               \
  }                                                                                            \
  EXPORT void cutmix_inplace_##SUFFIX(T* images, const int64_t* s, int cl, const int64_t* g,   \
                                      const int64_t* boxes) {                                  \
    for (int64_t i = 0; i < pair_total(g); ++i)                                                \
      cutmix_pair_element<T, FP_INDEX>(i, images, str(s), cl, geo(g), boxes);                      \
  }

DEFINE(u8, uint8_t)
DEFINE(f32, float)
"""


def build_emulation(work: Path, flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernel bodies of _EMULATION built for the host in work, with extra compiler flags."""
    compiler = _tool([os.environ.get("CXX", "c++"), "g++", "clang++"], "C++ compiler")
    (work / "emulation.cpp").write_text(_EMULATION)
    library = work / "emulation.so"
    command = [compiler, "-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC", *flags]
    command += [f"-I{CSRC}", str(work / "emulation.cpp"), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    return ctypes.CDLL(str(library))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return build_emulation(tmp_path_factory.mktemp("cuda_emulation"))


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def _dense_like(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty(x.shape, dtype=dtype or x.dtype, memory_format=_reference.output_format(x))


def _run(lib, name, x, out, *extra):
    suffix = "u8" if x.dtype == torch.uint8 else "f32"
    strides = torch.tensor(x.stride(), dtype=torch.int64)
    geometry = torch.tensor(x.shape, dtype=torch.int64)
    channels_last = int(
        out.dim() == 4
        and out.is_contiguous(memory_format=torch.channels_last)
        and not out.is_contiguous()
    )
    args = [_ptr(x), _ptr(strides), _ptr(out), ctypes.c_int(channels_last), _ptr(geometry)]
    args += [ctypes.c_int64(e) if isinstance(e, int) else _ptr(e) for e in extra]
    getattr(lib, f"{name}_{suffix}")(*args)
    return out


def _run_in_place(lib, name, x, channels_last, *extra):
    """An in-place pair kernel body, its elements numbered in NHWC order or not, on a copy of x
    with x's strides (see write_on_strided_copy); returns the view."""
    suffix = "u8" if x.dtype == torch.uint8 else "f32"
    strides = torch.tensor(x.stride(), dtype=torch.int64)
    geometry = torch.tensor(x.shape, dtype=torch.int64)

    def write(view):
        getattr(lib, f"{name}_{suffix}")(
            _ptr(view), _ptr(strides), ctypes.c_int(channels_last), _ptr(geometry),
            *map(_ptr, extra),
        )

    return write_on_strided_copy(x, write)


def _erase_in_place(lib, x, boxes, fill, seeds):
    """The in-place erase body on a copy of x with x's strides (see write_on_strided_copy)."""
    suffix = "u8" if x.dtype == torch.uint8 else "f32"
    strides = torch.tensor(x.stride(), dtype=torch.int64)
    geometry = torch.tensor(x.shape, dtype=torch.int64)

    def write(view):
        getattr(lib, f"erase_inplace_{suffix}")(
            _ptr(view), _ptr(strides), _ptr(geometry), _ptr(boxes),
            ctypes.c_int64(boxes.shape[1]), _ptr(fill), _ptr(seeds),
        )

    return write_on_strided_copy(x, write)


def _batches():
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.uint8, torch.float32):
        for shape in ((3, 3, 7, 5), (2, 1, 4, 9), (1, 4, 6, 6)):
            if dtype == torch.uint8:
                base = torch.randint(
                    0,
                    256,
                    (shape[0], shape[1], shape[2] + 2, shape[3] * 2),
                    dtype=dtype,
                    generator=g,
                )
            else:
                base = torch.randn(shape[0], shape[1], shape[2] + 2, shape[3] * 2, generator=g)
            dense = base[:, :, : shape[2], : shape[3]].contiguous()
            yield dense
            yield dense.contiguous(memory_format=torch.channels_last)
            yield base[:, :, 2:, ::2]  # strided
            yield dense.transpose(2, 3).contiguous().transpose(2, 3)  # permuted


def test_cuda_kernel_bodies_equal_the_reference_when_run_on_the_cpu(emulated):
    check_bodies_against_the_reference(emulated)


def check_bodies_against_the_reference(emulated: ctypes.CDLL) -> None:
    """Every body of a build_emulation library, every layout, against _reference."""
    g = torch.Generator().manual_seed(5)
    for x in _batches():
        n, c, h, w = x.shape
        boxes = torch.randint(-3, max(h, w) + 3, (n, 3, 4), generator=g)
        fill = torch.arange(1, c + 1).to(x.dtype)
        seeds = torch.randint(0, 2**32, (n,), generator=g)
        box_fill = torch.randint(0, 100, (n, 3, c), generator=g).to(x.dtype)  # C per box
        for s, f in ((None, fill), (seeds, fill), (None, box_fill)):
            expected = _reference.erase(x, boxes, f, s)
            # The bodies read C values per box; ops_cuda.cpp expands a fill shared by every box.
            per_box = f if f.dim() == 3 else f.view(1, 1, c).expand(n, 3, c).contiguous()
            got = _run(emulated, "erase", x, _dense_like(x), boxes, 3, per_box, s)
            assert torch.equal(got, expected)
            assert torch.equal(_erase_in_place(emulated, x, boxes, per_box, s), expected)
        lam = torch.rand(n, generator=g)
        expected = _reference.mixup(x, lam)
        assert torch.equal(_run(emulated, "mixup", x, _dense_like(x), lam), expected)
        for order in (0, 1):  # NCHW or NHWC numbering of the threads: the same result
            assert torch.equal(_run_in_place(emulated, "mixup_inplace", x, order, lam), expected)
        for pair in (boxes[:, 0].contiguous(), boxes[:1, 0].expand(n, 4).contiguous()):
            expected = _reference.cutmix(x, pair)
            assert torch.equal(_run(emulated, "cutmix", x, _dense_like(x), pair), expected)
            for order in (0, 1):
                got = _run_in_place(emulated, "cutmix_inplace", x, order, pair)
                assert torch.equal(got, expected)
        mean, std = torch.rand(c, generator=g), torch.rand(c, generator=g) + 0.1
        for channels_last in (False, True):
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            out = torch.empty(x.shape, dtype=torch.float32, memory_format=fmt)
            got = _run(emulated, "normalize", x, out, mean, std)
            assert torch.equal(
                got, _reference.normalize(x, mean, std, torch.float32, channels_last)
            )

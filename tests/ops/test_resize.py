"""fastpipe.ops.resize_crops (fastpipe/ops/_resize.py): the CPU image path's resize over a batch
of images of their own sizes.

Checked here, on the CPU: the C++ CPU kernel and the pure-PyTorch reference against
fastpipe._resize (the CPU image path's resize) bit for bit, over random geometries (train crops,
eval regions, flips, both filters, shrinks past 8x where the sums turn float, tiny images);
the CUDA kernel's per-pixel body (kernels.h's resize_crops_element, both index types) built for
the host with the system compiler against the same; the CUDA file compiled by nvcc and its
32-bit instance free of 64-bit division; opcheck and the fake kernel; the errors. The cuda lane
(tests/cuda/test_gpu_decode.py) runs the kernel on a GPU against the reference.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import numpy as np
import pytest
import torch

from fastpipe.ops import _extension, _reference, resize_crops
from fastpipe.ops._resize import PLAN_COLUMNS
from tests.ops.test_cuda_build import CSRC, _tool

_resize = pytest.importorskip("fastpipe._resize", exc_type=ImportError)
FILTERS = ("bilinear", "bicubic")


def _case(rng: np.random.Generator, trial: int):
    """One image, its pixels (the region the output reads, or the whole image), its plan row
    and fastpipe._resize's output for it."""
    filter_ = trial % 2
    full_h, full_w = (int(v) for v in rng.integers(1, 300, 2))
    if trial % 7 == 0:
        full_h, full_w = (int(v) for v in rng.integers(1, 1500, 2))
    image = rng.integers(0, 256, (full_h, full_w, 3), dtype=np.uint8)
    resized_h, resized_w = (int(v) for v in rng.integers(1, 200, 2))
    if trial % 5 == 0:  # shrinks past 8x: the float forms
        resized_h, resized_w = (int(v) for v in rng.integers(1, 12, 2))
    out_h, out_w = int(rng.integers(1, resized_h + 1)), int(rng.integers(1, resized_w + 1))
    out_top = int(rng.integers(0, resized_h - out_h + 1))
    out_left = int(rng.integers(0, resized_w - out_w + 1))
    flip = bool(rng.integers(0, 2))
    if trial % 3 == 0:  # only the region the output reads, as an eval decode gives it
        top, left, h, w = _resize.input_box((full_h, full_w), (resized_h, resized_w),
                                            (out_top, out_left), (out_h, out_w), filter_)
        pixels = image[top:top + h, left:left + w]
    else:
        top, left, pixels = 0, 0, image
    expected = np.empty((3, out_h, out_w), np.uint8)
    _resize.resize(pixels, (top, left), (full_h, full_w), expected, (out_top, out_left),
                   (resized_h, resized_w), flip, filter_)
    tensor = torch.from_numpy(np.ascontiguousarray(pixels))
    if trial % 2:  # a planar (3, h, w) decode, permuted: strides (w, 1, h * w)
        tensor = tensor.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    plan = [top, left, full_h, full_w, out_top, out_left, resized_h, resized_w, int(flip)]
    return tensor, plan, (out_h, out_w), FILTERS[filter_], torch.from_numpy(expected)


CASES = 160


@pytest.mark.parametrize("backend_name", ["kernel", "reference"])
def test_equals_the_cpu_path_resize_bit_for_bit(backend_name, monkeypatch):
    if backend_name == "reference":
        monkeypatch.setattr(_extension, "KERNELS", frozenset())
        monkeypatch.setattr(_extension, "_warned", True)
    elif not _extension.has_kernel("resize_crops", torch.device("cpu")):
        pytest.skip("fastpipe._C is built without resize_crops")
    rng = np.random.default_rng(1)
    for trial in range(CASES):
        tensor, plan, size, interpolation, expected = _case(rng, trial)
        got = resize_crops([tensor], torch.tensor([plan]), size, interpolation)
        assert got.shape == (1, 3, *size) and got.dtype == torch.uint8
        assert torch.equal(got[0], expected), (trial, plan, interpolation)


def test_a_batch_of_images_of_their_own_sizes_equals_one_call_per_image(backend):
    rng = np.random.default_rng(2)
    images, plans, expected = [], [], []
    for trial in range(6):
        h, w = (int(v) for v in rng.integers(20, 90, 2))
        pixels = torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        images.append(pixels)
        plans.append([0, 0, h, w, 0, 0, 16, 24, trial % 2])  # a train crop: its own image
        out = np.empty((3, 16, 24), np.uint8)
        _resize.resize(pixels.numpy(), (0, 0), (h, w), out, (0, 0), (16, 24), trial % 2, 0)
        expected.append(torch.from_numpy(out))
    got = resize_crops(images, torch.tensor(plans), (16, 24))
    assert torch.equal(got, torch.stack(expected))


# The CUDA kernels' bodies for the host: kernels.h's layout of the taps, then one loop over the
# batch's rows and columns in place of the taps kernel's grid, and one over its pixels in place of
# the pixel kernel's.
_EMULATION = r"""
#include <cstdint>
#include <vector>
#include "kernels.h"
using namespace fastpipe;
#define EXPORT extern "C" __attribute__((visibility("default")))
template <typename Index>
static void run(int64_t* table, int64_t n, int64_t height, int64_t width, int filter,
                uint8_t* out) {
  const int64_t weights = resize_taps_layout(table, n, height, width, filter);
  std::vector<int32_t> spans(n * (height + width) * 2);
  std::vector<float> taps(weights);
  for (Index i = 0; i < static_cast<Index>(n * (height + width)); ++i)
    resize_crops_taps<Index>(i, table, height, width, filter, spans.data(), taps.data());
  for (Index i = 0; i < static_cast<Index>(n * height * width); ++i)
    resize_crops_element<Index>(i, table, spans.data(), taps.data(), height, width, out);
}
EXPORT void resize_crops_u32(int64_t* table, int64_t n, int64_t height, int64_t width,
                             int filter, uint8_t* out) {
  run<uint32_t>(table, n, height, width, filter, out);
}
EXPORT void resize_crops_i64(int64_t* table, int64_t n, int64_t height, int64_t width,
                             int filter, uint8_t* out) {
  run<int64_t>(table, n, height, width, filter, out);
}
"""


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    work = tmp_path_factory.mktemp("resize_emulation")
    compiler = _tool([os.environ.get("CXX", "c++"), "g++", "clang++"], "C++ compiler")
    (work / "resize.cpp").write_text(_EMULATION)
    library = work / "resize.so"
    command = [compiler, "-O1", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC",
               f"-I{CSRC}", str(work / "resize.cpp"), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    return ctypes.CDLL(str(library))


def _table(images: list[torch.Tensor], plans: list[list[int]], interpolation: str) -> np.ndarray:
    """resize_crops.h's table, built as the glue builds it (the taps' columns left to
    kernels.h's resize_taps_layout, which the emulation calls)."""
    filter_ = FILTERS.index(interpolation)
    table = np.zeros((len(images), 19), np.int64)
    for n, (image, plan) in enumerate(zip(images, plans)):
        top, left, full_h, full_w, out_top, out_left, resized_h, resized_w, flip = plan
        integer = _reference.resize_integer((full_h, full_w), (resized_h, resized_w), filter_)
        table[n, :16] = [image.data_ptr(), *image.stride(), top, left, image.shape[0],
                         image.shape[1], full_h, full_w, out_top, out_left, resized_h, resized_w,
                         flip, int(integer)]
    return table


@pytest.mark.extension
@pytest.mark.parametrize("index", ["u32", "i64"])
def test_the_cuda_kernel_body_equals_the_reference_when_run_on_the_cpu(emulated, index):
    rng = np.random.default_rng(3)
    for trial in range(CASES):
        tensor, plan, size, interpolation, expected = _case(rng, trial)
        table = _table([tensor], [plan], interpolation)
        out = np.zeros((1, 3, *size), np.uint8)
        getattr(emulated, f"resize_crops_{index}")(
            table.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(1), ctypes.c_int64(size[0]),
            ctypes.c_int64(size[1]), ctypes.c_int(FILTERS.index(interpolation)),
            out.ctypes.data_as(ctypes.c_void_p))
        reference = _reference.resize_crops([tensor], torch.tensor([plan]), *size,
                                            FILTERS.index(interpolation))
        assert torch.equal(torch.from_numpy(out), reference), (trial, plan, interpolation)
        assert torch.equal(reference[0], expected)


@pytest.mark.extension
@pytest.mark.parametrize("interpolation", FILTERS)
def test_the_cuda_kernel_bodies_place_each_images_taps_in_a_batch(emulated, interpolation):
    """Images of their own sizes in one batch, some shrunk past 8x (float sums, long taps) and
    some integer: each image's rows and columns find their own taps in the batch's table."""
    rng = np.random.default_rng(5)
    height, width = 9, 13
    images, plans = [], []
    for k in range(7):
        full_h, full_w = (int(v) for v in rng.integers(10, 260, 2))
        resized_h = int(rng.integers(height, 40)) if k % 3 else height
        resized_w = int(rng.integers(width, 40)) if k % 2 else width
        out_top = int(rng.integers(0, resized_h - height + 1))
        out_left = int(rng.integers(0, resized_w - width + 1))
        images.append(torch.from_numpy(rng.integers(0, 256, (full_h, full_w, 3), dtype=np.uint8)))
        plans.append([0, 0, full_h, full_w, out_top, out_left, resized_h, resized_w, k % 2])
    table = _table(images, plans, interpolation)
    out = np.zeros((len(images), 3, height, width), np.uint8)
    emulated.resize_crops_u32(
        table.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(len(images)),
        ctypes.c_int64(height), ctypes.c_int64(width),
        ctypes.c_int(FILTERS.index(interpolation)), out.ctypes.data_as(ctypes.c_void_p))
    expected = _reference.resize_crops(images, torch.tensor(plans), height, width,
                                       FILTERS.index(interpolation))
    assert torch.equal(torch.from_numpy(out), expected)


@pytest.mark.extension
@pytest.mark.slow
def test_the_32_bit_kernel_does_no_64_bit_division_in_the_ptx(tmp_path):
    nvcc = _tool([os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"),
                  "nvcc"], "nvcc")
    ptx = tmp_path / "resize.ptx"
    command = [nvcc, "-ptx", "-O3", "--fmad=false", "-std=c++17", f"-I{CSRC}",
               "-arch=compute_90", str(CSRC / "cuda" / "resize.cu"), "-o", str(ptx)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    entries = {body.split("(", 1)[0]: body for body in ptx.read_text().split(".entry ")[1:]}
    fast = [body for name, body in entries.items() if "resize_crops_kernelIjE" in name]
    assert len(fast) == 1, sorted(entries)
    assert not [op for op in ("div.s64", "rem.s64", "div.u64", "rem.u64") if op in fast[0]]


@pytest.mark.extension
def test_opcheck_and_the_fake_kernel():
    if not _extension.has_kernel("resize_crops", torch.device("cpu")):
        pytest.skip("fastpipe._C is built without resize_crops")
    rng = np.random.default_rng(4)
    images = [torch.from_numpy(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)),
              torch.from_numpy(rng.integers(0, 256, (3, 25, 33), dtype=np.uint8)).permute(1, 2, 0)]
    plan = torch.tensor([[0, 0, 30, 40, 0, 0, 12, 12, 1], [0, 0, 25, 33, 2, 3, 20, 20, 0]])
    torch.library.opcheck(torch.ops.fastpipe.resize_crops.default, (images, plan, 12, 12, 1))
    meta = [torch.empty((30, 40, 3), dtype=torch.uint8, device="meta")] * 2
    out = torch.ops.fastpipe.resize_crops(meta, plan, 12, 12, 0)
    assert out.shape == (2, 3, 12, 12) and out.device.type == "meta"


@pytest.mark.parametrize("images, plan, message", [
    ([], torch.zeros((0, 9), dtype=torch.int64), "at least one image"),
    ([torch.zeros((3, 8, 8), dtype=torch.uint8)], torch.tensor([[0, 0, 3, 8, 0, 0, 4, 4, 0]]),
     r"\(h, w, 3\) uint8.*permute"),
    ([torch.zeros((8, 8, 3), dtype=torch.uint8)], torch.tensor([[0, 0, 8, 8, 0, 0, 4, 4]]),
     r"\(1, 9\) int64 tensor on the CPU"),
    ([torch.zeros((8, 8, 3), dtype=torch.uint8)], torch.tensor([[1, 0, 8, 8, 0, 0, 4, 4, 0]]),
     "does not fit an image of 8x8"),
    ([torch.zeros((8, 8, 3), dtype=torch.uint8)], torch.tensor([[0, 0, 8, 8, 1, 0, 4, 4, 0]]),
     "does not fit the resized image"),
    ([torch.zeros((4, 8, 3), dtype=torch.uint8)], torch.tensor([[0, 0, 8, 8, 0, 0, 4, 4, 0]]),
     "every input pixel"),
    ([torch.zeros((8, 8, 3), dtype=torch.uint8)], torch.tensor([[0, 0, 8, 8, 0, 0, 4, 4, 2]]),
     "flip 0 or 1"),
])
def test_bad_arguments_are_refused_naming_the_problem(backend, images, plan, message):
    with pytest.raises(ValueError, match=message):
        resize_crops(images, plan, 4)


def test_the_plan_columns_are_named_in_order():
    assert PLAN_COLUMNS[:4] == ("top", "left", "image_height", "image_width")
    assert PLAN_COLUMNS[-1] == "flip" and len(PLAN_COLUMNS) == 9


def test_the_compiled_kernel_checks_what_the_wrapper_checks():
    if not _extension.has_kernel("resize_crops", torch.device("cpu")):
        pytest.skip("fastpipe._C is built without resize_crops")
    image = torch.zeros((4, 8, 3), dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="every input pixel"):
        torch.ops.fastpipe.resize_crops([image], torch.tensor([[0, 0, 8, 8, 0, 0, 4, 4, 0]]),
                                        4, 4, 0)
    with pytest.raises(RuntimeError, match="plan must be an"):
        torch.ops.fastpipe.resize_crops([image], torch.zeros((1, 8), dtype=torch.int64), 4, 4, 0)


def test_input_span_is_what_fastpipe_resize_reads():
    """The span of inputs an output box reads, per axis, is fastpipe._resize.input_box's (and the
    taps' own first and last inputs): GPU decode's eval regions are made from it."""
    from fastpipe.ops._resize import input_span

    rng = np.random.default_rng(6)
    for trial in range(300):
        filter_ = trial % 2
        full = (int(rng.integers(1, 3000)), int(rng.integers(1, 3000)))
        resized = (int(rng.integers(1, 600)), int(rng.integers(1, 600)))
        out = (int(rng.integers(1, resized[0] + 1)), int(rng.integers(1, resized[1] + 1)))
        at = (int(rng.integers(0, resized[0] - out[0] + 1)),
              int(rng.integers(0, resized[1] - out[1] + 1)))
        top, left, height, width = _resize.input_box(full, resized, at, out, filter_)
        assert input_span(full[0], resized[0], at[0], out[0], filter_) == (top, height)
        assert input_span(full[1], resized[1], at[1], out[1], filter_) == (left, width)
        for index in (0, resized[1] - 1):
            first, weights, _ = _reference.resize_taps(full[1], resized[1], index, filter_)
            assert _reference.resize_tap_span(full[1], resized[1], index, filter_) == (
                first, first + len(weights))

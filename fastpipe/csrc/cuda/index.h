// Index math of the CUDA kernels' fast paths: 32-bit index decoding (every kernel) and the
// per-channel tables of normalize.
//
// Host and device, torch-free like kernels.h: tests/ops/test_cuda_fast_path.py compiles it
// for the host and checks it against kernels.h's int64 path and the PyTorch reference. Integer
// decoding changes no value; the float math is kernels.h's own functions, so the bits are the same.
#pragma once

#include <stdint.h>

#include "kernels.h"

namespace fastpipe {
namespace cuda {

// Channels whose normalize scale and shift fit in a block's table (2 x 4 KiB of shared memory);
// wider batches use the per-element kernel.
constexpr int64_t kMaxTableChannels = 1024;

// True when every element index and every strided offset of the batch fits in int32, so the
// kernels can decode indices with 32-bit division (64-bit division is emulated on GPUs and costs
// several times more). torch strides are non-negative; a negative one takes the int64 path.
FP_HD bool fits_in_32_bits(const Geometry& g, const Strides& s) {
  const int64_t limit = 0x7fffffff;
  if (g.n <= 0 || g.c <= 0 || g.h <= 0 || g.w <= 0) {
    return true;  // empty: nothing is indexed
  }
  if (s.n < 0 || s.c < 0 || s.h < 0 || s.w < 0 || g.n > limit || g.c > limit || g.h > limit ||
      g.w > limit) {
    return false;
  }
  const int64_t total = g.n * g.c * g.h * g.w;
  const int64_t last = (g.n - 1) * s.n + (g.c - 1) * s.c + (g.h - 1) * s.h + (g.w - 1) * s.w;
  return total <= limit && last <= limit;
}

// dense_index of kernels.h with 32-bit unsigned division; valid when fits_in_32_bits.
FP_HD Index4 dense_index32(uint32_t i, const Geometry& g, bool channels_last) {
  const uint32_t c = static_cast<uint32_t>(g.c), h = static_cast<uint32_t>(g.h),
                 w = static_cast<uint32_t>(g.w);
  Index4 r;
  if (channels_last) {
    r.c = i % c;
    i /= c;
    r.x = i % w;
    i /= w;
    r.y = i % h;
    r.n = i / h;
  } else {
    r.x = i % w;
    i /= w;
    r.y = i % h;
    i /= h;
    r.c = i % c;
    r.n = i / c;
  }
  return r;
}

// strided_offset of kernels.h in 32 bits; valid when fits_in_32_bits.
FP_HD uint32_t strided_offset32(const Index4& p, const Strides& s) {
  return static_cast<uint32_t>(p.n) * static_cast<uint32_t>(s.n) +
         static_cast<uint32_t>(p.c) * static_cast<uint32_t>(s.c) +
         static_cast<uint32_t>(p.y) * static_cast<uint32_t>(s.h) +
         static_cast<uint32_t>(p.x) * static_cast<uint32_t>(s.w);
}

// The index policy of kernels.h's per-element bodies (erase, mixup, cutmix and their in-place
// forms) with 32-bit decoding; valid when fits_in_32_bits. The caller's index i is below 2^31.
struct Index32 {
  static FP_HD Index4 decode(int64_t i, const Geometry& g, bool channels_last) {
    return dense_index32(static_cast<uint32_t>(i), g, channels_last);
  }
  static FP_HD uint32_t offset(const Index4& p, const Strides& s) {
    return strided_offset32(p, s);
  }
};

// One channel's entry of the normalize table: kernels.h's scale and shift, computed once per
// channel instead of once per element (the same two float divisions, so the same bits).
FP_HD void normalize_table_entry(int64_t c, const float* mean, const float* std, bool uint8_input,
                                 float* scale, float* shift) {
  scale[c] = normalize_scale(std[c], uint8_input);
  shift[c] = normalize_shift(mean[c], std[c]);
}

// normalize_element of kernels.h with the index decoded and the table filled by the caller.
template <typename TIn, typename TOut, typename Conv, typename Offset>
FP_HD TOut normalize_at(const Index4& p, Offset offset, const TIn* in, const float* scale,
                        const float* shift) {
  const float x = Conv::to_float(in[offset]);
  return Conv::template from_float<TOut>(normalize_value(x, scale[p.c], shift[p.c]));
}

}  // namespace cuda
}  // namespace fastpipe

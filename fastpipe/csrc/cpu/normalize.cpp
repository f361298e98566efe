// normalize on the CPU: one pass from uint8 (or float) to normalized float, any input layout.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "common.h"
#include "cpu/cpu_utils.h"
#include "cpu/kept_memory.h"

namespace fastpipe {
namespace cpu {
namespace {

// o[j] = in[j] * scale[j] + shift[j] over len values, through float buffers so that each step
// vectorizes (see load_floats); scale and shift hold len values. kStream writes float output with
// non-temporal stores (stream_floats).
template <typename TIn, typename TOut, bool kStream = false>
struct NormalizeRun {
  static FASTPIPE_ALWAYS_INLINE void run(const TIn* in, TOut* o, int64_t len, const float* scale,
                                         const float* shift) {
    // Float input is read, and float output written, in place of the buffer.
    float f[kChunk];
    float g[kStream ? kChunk : 1];
    for (int64_t j = 0; j < len; j += kChunk) {
      const int64_t count = std::min(kChunk, len - j);
      const float* x = f;
      if constexpr (std::is_same_v<TIn, float>) {
        x = in + j;
      } else {
        load_floats(in + j, f, count);
      }
      float* y = f;
      if constexpr (kStream) {
        y = g;
      } else if constexpr (std::is_same_v<TOut, float>) {
        y = o + j;
      }
      for (int64_t k = 0; k < count; ++k) {
        y[k] = normalize_value(x[k], scale[j + k], shift[j + k]);
      }
      if constexpr (kStream) {
        stream_floats(g, o + j, count);
      } else if constexpr (!std::is_same_v<TOut, float>) {
        store_floats(f, o + j, count);
      }
    }
  }
};

// dst = one NHWC row (W pixels of C values) gathered from a strided row of the input. NCHW to
// NHWC, the usual case, reads each channel's row in order; three channels get their own loop,
// which the compiler vectorizes with shuffles.
template <typename T>
struct InterleaveRow {
  static FASTPIPE_ALWAYS_INLINE void run(const T* src, T* dst, int64_t w, int64_t c,
                                         int64_t stride_w, int64_t stride_c) {
    if (stride_w == 1 && c == 3) {
      const T* r = src;
      const T* g = src + stride_c;
      const T* b = src + 2 * stride_c;
      for (int64_t x = 0; x < w; ++x) {
        dst[3 * x] = r[x];
        dst[3 * x + 1] = g[x];
        dst[3 * x + 2] = b[x];
      }
    } else if (stride_w == 1) {
      for (int64_t k = 0; k < c; ++k) {
        const T* plane = src + k * stride_c;
        for (int64_t x = 0; x < w; ++x) {
          dst[x * c + k] = plane[x];
        }
      }
    } else {
      for (int64_t x = 0; x < w; ++x) {
        for (int64_t k = 0; k < c; ++k) {
          dst[x * c + k] = src[x * stride_w + k * stride_c];
        }
      }
    }
  }
};

// out is dense: rows are W values of one (n, c, y) for NCHW, or W * C values of one (n, y) for
// NHWC. row_scale and row_shift hold the coefficients of every row of each channel laid out like
// one row (NCHW: C rows of W values; NHWC: one row of W * C values).
template <typename TIn, typename TOut, bool kStream>
void normalize_rows(const at::Tensor& images, at::Tensor& out, bool channels_last,
                    const std::vector<float>& row_scale, const std::vector<float>& row_shift) {
  const Geometry g = geometry_of(images);
  const Strides s = strides_of(images);
  const TIn* in = images.const_data_ptr<TIn>();
  TOut* dst = out.mutable_data_ptr<TOut>();
  const bool same_layout = images.is_contiguous(channels_last ? at::MemoryFormat::ChannelsLast
                                                              : at::MemoryFormat::Contiguous);
  const int64_t row_length = channels_last ? g.w * g.c : g.w;
  const int64_t rows = out.numel() / row_length;

  at::parallel_for(0, rows, grain_for(row_length), [&](int64_t begin, int64_t end) {
    // A strided input row is gathered here first (in the output's element order).
    std::vector<TIn> gathered(same_layout ? 0 : row_length);
    for (int64_t row = begin; row < end; ++row) {
      TOut* o = dst + row * row_length;
      const TIn* i = in + row * row_length;
      int64_t pattern = 0;
      if (channels_last) {
        const int64_t y = row % g.h, n = row / g.h;
        if (!same_layout) {
          run_vectorized<InterleaveRow<TIn>>(in + n * s.n + y * s.h, gathered.data(), g.w, g.c,
                                             s.w, s.c);
        }
      } else {
        const int64_t y = row % g.h, c = (row / g.h) % g.c, n = row / (g.h * g.c);
        pattern = c * row_length;
        if (!same_layout) {
          const TIn* src = in + n * s.n + c * s.c + y * s.h;
          for (int64_t x = 0; x < g.w; ++x) {
            gathered[x] = src[x * s.w];
          }
        }
      }
      run_vectorized<NormalizeRun<TIn, TOut, kStream>>(same_layout ? i : gathered.data(), o,
                                                       row_length, row_scale.data() + pattern,
                                                       row_shift.data() + pattern);
    }
    if constexpr (kStream) {
      stream_fence();
    }
  });
}

at::Tensor normalize_cpu(const at::Tensor& images, const at::Tensor& mean, const at::Tensor& std,
                         at::ScalarType dtype, bool channels_last) {
  check_normalize_args(images, mean, std, dtype);
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::Tensor out = empty_output(images.sizes(), dtype, format);
  if (out.numel() == 0) {
    return out;
  }
  const Geometry g = geometry_of(images);
  const bool uint8_input = images.scalar_type() == at::kByte;
  const at::Tensor mean_c = mean.contiguous(), std_c = std.contiguous();
  const float* m = mean_c.const_data_ptr<float>();
  const float* sd = std_c.const_data_ptr<float>();
  // Coefficients laid out like the rows (see normalize_rows): W * C values either way.
  const int64_t pattern = g.w * g.c;
  std::vector<float> row_scale(pattern), row_shift(pattern);
  for (int64_t j = 0; j < pattern; ++j) {
    const int64_t c = channels_last ? j % g.c : j / g.w;
    row_scale[j] = normalize_scale(sd[c], uint8_input);
    row_shift[j] = normalize_shift(m[c], sd[c]);
  }
  with_image_type(images.scalar_type(), "normalize", [&](auto in_tag) {
    using TIn = decltype(in_tag);
    with_image_type(dtype, "normalize", [&](auto out_tag) {
      using TOut = decltype(out_tag);
      if constexpr (std::is_same_v<TOut, float>) {
        // A float batch of kKeptMinBytes or more is far larger than the caches: in the CPU-path
        // benchmark's main process most of the op's time went to writing the output, most of
        // that reading each line in before overwriting it (docs/ops.md, "Benchmark").
        if (out.nbytes() >= kKeptMinBytes) {
          normalize_rows<TIn, TOut, true>(images, out, channels_last, row_scale, row_shift);
        } else {
          normalize_rows<TIn, TOut, false>(images, out, channels_last, row_scale, row_shift);
        }
      } else if constexpr (!std::is_same_v<TOut, uint8_t>) {
        normalize_rows<TIn, TOut, false>(images, out, channels_last, row_scale, row_shift);
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("normalize", &fastpipe::cpu::normalize_cpu);
}

// normalize on the CPU: one pass from uint8 (or float) to normalized float, any input layout.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "common.h"
#include "cpu/cpu_utils.h"

namespace fastpipe {
namespace cpu {
namespace {

// out is dense: rows are W values of one (n, c, y) for NCHW, or W * C values of one (n, y) for
// NHWC. row_scale and row_shift hold the per-channel coefficients laid out like one row.
template <typename TIn, typename TOut>
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
  const float* scale = row_scale.data();
  const float* shift = row_shift.data();

  at::parallel_for(0, rows, grain_for(row_length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      TOut* o = dst + row * row_length;
      if (channels_last) {
        const int64_t y = row % g.h, n = row / g.h;
        if (same_layout) {
          const TIn* i = in + row * row_length;
          for (int64_t j = 0; j < row_length; ++j) {
            o[j] = from_float<TOut>(normalize_value(to_float(i[j]), scale[j], shift[j]));
          }
        } else {
          const TIn* i = in + n * s.n + y * s.h;
          for (int64_t x = 0; x < g.w; ++x) {
            for (int64_t c = 0; c < g.c; ++c) {
              const int64_t j = x * g.c + c;
              o[j] = from_float<TOut>(normalize_value(to_float(i[x * s.w + c * s.c]), scale[j], shift[j]));
            }
          }
        }
      } else {
        const int64_t y = row % g.h, c = (row / g.h) % g.c, n = row / (g.h * g.c);
        const float a = scale[c], b = shift[c];
        if (same_layout) {
          const TIn* i = in + row * row_length;
          for (int64_t x = 0; x < g.w; ++x) {
            o[x] = from_float<TOut>(normalize_value(to_float(i[x]), a, b));
          }
        } else {
          const TIn* i = in + n * s.n + c * s.c + y * s.h;
          for (int64_t x = 0; x < g.w; ++x) {
            o[x] = from_float<TOut>(normalize_value(to_float(i[x * s.w]), a, b));
          }
        }
      }
    }
  });
}

at::Tensor normalize_cpu(const at::Tensor& images, const at::Tensor& mean, const at::Tensor& std,
                         at::ScalarType dtype, bool channels_last) {
  check_normalize_args(images, mean, std, dtype);
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::Tensor out = at::empty(images.sizes(), images.options().dtype(dtype), format);
  if (out.numel() == 0) {
    return out;
  }
  const Geometry g = geometry_of(images);
  const bool uint8_input = images.scalar_type() == at::kByte;
  const at::Tensor mean_c = mean.contiguous(), std_c = std.contiguous();
  const float* m = mean_c.const_data_ptr<float>();
  const float* sd = std_c.const_data_ptr<float>();
  // NCHW rows use one coefficient per channel; NHWC rows repeat the C coefficients W times.
  const int64_t pattern = channels_last ? g.w * g.c : g.c;
  std::vector<float> row_scale(pattern), row_shift(pattern);
  for (int64_t j = 0; j < pattern; ++j) {
    const int64_t c = j % g.c;
    row_scale[j] = normalize_scale(sd[c], uint8_input);
    row_shift[j] = normalize_shift(m[c], sd[c]);
  }
  with_image_type(images.scalar_type(), "normalize", [&](auto in_tag) {
    using TIn = decltype(in_tag);
    with_image_type(dtype, "normalize", [&](auto out_tag) {
      using TOut = decltype(out_tag);
      if constexpr (!std::is_same_v<TOut, uint8_t>) {
        normalize_rows<TIn, TOut>(images, out, channels_last, row_scale, row_shift);
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

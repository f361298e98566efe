// resize_crops on the CPU: the CUDA kernel's two passes (kernels.h), in loops: the taps of each
// image's output rows and columns once (resize_crops_taps), then every output pixel from them
// (resize_crops_element). (The CPU image path itself resizes with fastpipe._resize, a row at a
// time; this kernel is the op's CPU form, the same bits.)
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "resize_crops.h"

namespace fastpipe {
namespace cpu {
namespace {

at::Tensor resize_crops_cpu(at::TensorList images, const at::Tensor& plan, int64_t height,
                            int64_t width, int64_t filter) {
  check_resize_args(images, plan, height, width, filter);
  TORCH_CHECK(images[0].device().is_cpu(), "fastpipe::resize_crops: CPU kernel called with ",
              images[0].device());
  const ResizeTable table = resize_table(images, plan, height, width, filter);
  const int64_t n = static_cast<int64_t>(images.size());
  const int64_t entries = n * (height + width);
  std::vector<int32_t> spans(static_cast<size_t>(entries) * 2);
  std::vector<float> weights(static_cast<size_t>(table.weights));
  const int f = static_cast<int>(filter);
  at::parallel_for(0, entries, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      resize_crops_taps<int64_t>(i, table.rows.data(), height, width, f, spans.data(),
                                 weights.data());
    }
  });
  at::Tensor out = at::empty({n, 3, height, width}, images[0].options());
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, n * height, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * width; i < end * width; ++i) {
      resize_crops_element<int64_t>(i, table.rows.data(), spans.data(), weights.data(), height,
                                    width, dst);
    }
  });
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("resize_crops", &fastpipe::cpu::resize_crops_cpu);
}

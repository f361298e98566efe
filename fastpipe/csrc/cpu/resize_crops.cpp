// resize_crops on the CPU: kernels.h's resize_pixel for every output pixel, the taps of each
// output row and column computed once per image. (The CPU image path itself resizes with
// fastpipe._resize, a row at a time; this kernel is the op's CPU form, the same bits.)
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
  const std::vector<int64_t> table = resize_table(images, plan, height, width, filter);
  const int64_t n = static_cast<int64_t>(images.size());
  at::Tensor out = at::empty({n, 3, height, width}, images[0].options());
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  const int f = static_cast<int>(filter);
  const int64_t plane = height * width;
  at::parallel_for(0, n * height, 1, [&](int64_t begin, int64_t end) {
    std::vector<ResizeTaps> cols;
    int64_t cols_of = -1;
    for (int64_t line = begin; line < end; ++line) {
      const int64_t i = line / height, y = line % height;
      const int64_t* row = table.data() + i * kResizeTableColumns;
      const auto* pixels = reinterpret_cast<const uint8_t*>(row[0]);
      const ResizeImage im = resize_image(row);
      if (cols_of != i) {
        cols.clear();
        for (int64_t x = 0; x < width; ++x) {
          cols.push_back(resize_taps(im.full_width, im.resized_width,
                                     resize_column(im, x, width), f));
        }
        cols_of = i;
      }
      const ResizeTaps rows = resize_taps(im.full_height, im.resized_height, im.out_top + y, f);
      uint8_t* out_row = dst + i * 3 * plane + y * width;
      for (int64_t x = 0; x < width; ++x) {
        uint8_t rgb[3];
        resize_pixel(pixels, im, rows, cols[x], row[15] != 0, rgb);
        out_row[x] = rgb[0];
        out_row[plane + x] = rgb[1];
        out_row[2 * plane + x] = rgb[2];
      }
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

// resize_crops' argument checks and its per-image table, shared by the CPU kernel
// (cpu/resize_crops.cpp) and the CUDA glue (cuda/resize_cuda.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <utility>
#include <vector>

#include "kernels.h"

namespace fastpipe {

// Plan columns: the pixels' box (top, left) in an image of (height, width); the output box's
// (top, left) in that image resized to (height, width); flip.
constexpr int64_t kResizePlanColumns = 9;
constexpr int64_t kResizeMaxSide = int64_t{1} << 24;

inline void check_resize_args(const at::TensorList& images, const at::Tensor& plan,
                              int64_t height, int64_t width, int64_t filter) {
  TORCH_CHECK(filter == kResizeBilinear || filter == kResizeBicubic,
              "fastpipe::resize_crops: filter must be 0 (bilinear) or 1 (bicubic), got ", filter);
  TORCH_CHECK(height >= 1 && width >= 1 && height <= kResizeMaxSide && width <= kResizeMaxSide,
              "fastpipe::resize_crops: the output size must be 1 to 2**24 per side, got ", height,
              "x", width);
  TORCH_CHECK(!images.empty(), "fastpipe::resize_crops needs at least one image");
  TORCH_CHECK(plan.device().is_cpu() && plan.scalar_type() == at::kLong && plan.dim() == 2 &&
                  plan.size(0) == static_cast<int64_t>(images.size()) &&
                  plan.size(1) == kResizePlanColumns,
              "fastpipe::resize_crops: plan must be an (N, 9) int64 tensor on the CPU with N = ",
              images.size(), ", got ", plan.scalar_type(), " ", plan.sizes(), " on ",
              plan.device());
  const auto device = images[0].device();
  for (size_t n = 0; n < images.size(); ++n) {
    const at::Tensor& image = images[n];
    TORCH_CHECK(image.device() == device, "fastpipe::resize_crops: image ", n, " is on ",
                image.device(), " and image 0 on ", device);
    TORCH_CHECK(image.scalar_type() == at::kByte && image.dim() == 3 && image.size(2) == 3 &&
                    image.size(0) >= 1 && image.size(1) >= 1,
                "fastpipe::resize_crops: image ", n, " must be (h, w, 3) uint8 and not empty, "
                "got ", image.scalar_type(), " ", image.sizes());
    TORCH_CHECK(image.stride(0) >= 0 && image.stride(1) >= 0 && image.stride(2) >= 0,
                "fastpipe::resize_crops: image ", n, " has negative strides ", image.strides());
  }
}

// The table of a batch (kernels.h's kResizeTableColumns per image) and the weights its taps take.
struct ResizeTable {
  std::vector<int64_t> rows;
  int64_t weights;
};

// One row per image: the pixels' address, kernels.h's ResizeImage (14 values), whether the
// integer forms apply, and where its taps go (resize_taps_layout); every box checked against the
// image it belongs to, and every tap of the output inside the pixels.
inline ResizeTable resize_table(const at::TensorList& images, const at::Tensor& plan,
                                int64_t height, int64_t width, int64_t filter) {
  const at::Tensor p = plan.contiguous();
  const int64_t* v = p.const_data_ptr<int64_t>();
  std::vector<int64_t> table(images.size() * kResizeTableColumns, 0);
  for (size_t n = 0; n < images.size(); ++n) {
    const at::Tensor& image = images[n];
    const int64_t* r = v + n * kResizePlanColumns;
    const int64_t top = r[0], left = r[1], full_h = r[2], full_w = r[3];
    const int64_t out_top = r[4], out_left = r[5], resized_h = r[6], resized_w = r[7];
    const int64_t h = image.size(0), w = image.size(1);
    const auto within = [](int64_t value, int64_t lowest) {
      return value >= lowest && value <= kResizeMaxSide;
    };
    TORCH_CHECK(within(full_h, 1) && within(full_w, 1) && within(resized_h, 1) &&
                    within(resized_w, 1) && within(top, 0) && within(left, 0) &&
                    within(out_top, 0) && within(out_left, 0) && (r[8] == 0 || r[8] == 1),
                "fastpipe::resize_crops: plan row ", n, " (", p[n], ") holds a size outside 1 to "
                "2**24, a negative offset or a flip other than 0 or 1");
    TORCH_CHECK(top + h <= full_h && left + w <= full_w, "fastpipe::resize_crops: image ", n,
                " (", h, "x", w, " at ", top, ", ", left, ") does not fit in its image of ",
                full_h, "x", full_w);
    TORCH_CHECK(out_top + height <= resized_h && out_left + width <= resized_w,
                "fastpipe::resize_crops: output ", n, " (", height, "x", width, " at ", out_top,
                ", ", out_left, ") does not fit in the resized image of ", resized_h, "x",
                resized_w);
    TORCH_CHECK(resize_axis_inside(full_h, resized_h, out_top, height, top, h,
                                   static_cast<int>(filter)) &&
                    resize_axis_inside(full_w, resized_w, out_left, width, left, w,
                                       static_cast<int>(filter)),
                "fastpipe::resize_crops: image ", n, " does not hold every input pixel its "
                "output reads (see fastpipe._resize.input_box)");
    int64_t* row = table.data() + n * kResizeTableColumns;
    row[0] = reinterpret_cast<int64_t>(image.const_data_ptr());
    row[1] = image.stride(0);
    row[2] = image.stride(1);
    row[3] = image.stride(2);
    row[4] = top;
    row[5] = left;
    row[6] = h;
    row[7] = w;
    row[8] = full_h;
    row[9] = full_w;
    row[10] = out_top;
    row[11] = out_left;
    row[12] = resized_h;
    row[13] = resized_w;
    row[14] = r[8];
    row[kResizeInteger] =
        resize_integer(full_h, full_w, resized_h, resized_w, static_cast<int>(filter));
  }
  const int64_t weights = resize_taps_layout(table.data(), static_cast<int64_t>(images.size()),
                                             height, width, static_cast<int>(filter));
  return ResizeTable{std::move(table), weights};
}

}  // namespace fastpipe

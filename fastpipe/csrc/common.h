// Argument checks and layout rules shared by the CPU and CUDA implementations (torch side).
//
// The Python wrappers in fastpipe/ops validate arguments first and raise friendly errors; these
// checks keep the operators total when they are called directly through torch.ops.fastpipe.
#pragma once

#include <algorithm>
#include <utility>
#include <vector>

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "kernels.h"

namespace fastpipe {

inline void check_images(const at::Tensor& images, const char* op) {
  TORCH_CHECK(images.dim() == 4, "fastpipe::", op, " expects a 4-D (N, C, H, W) image batch, got ",
              images.dim(), "-D with shape ", images.sizes());
  const auto t = images.scalar_type();
  TORCH_CHECK(t == at::kByte || t == at::kFloat || t == at::kHalf || t == at::kBFloat16,
              "fastpipe::", op, " supports uint8, float32, float16 and bfloat16 images, got ", t);
}

inline void check_param(const at::Tensor& images, const at::Tensor& param, const char* op,
                        const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
  TORCH_CHECK(param.device() == images.device(), "fastpipe::", op, ": ", name, " is on ",
              param.device(), " but the images are on ", images.device());
  TORCH_CHECK(param.scalar_type() == dtype, "fastpipe::", op, ": ", name, " must be ", dtype,
              ", got ", param.scalar_type());
  TORCH_CHECK(param.sizes() == shape, "fastpipe::", op, ": ", name, " must have shape ", shape,
              ", got ", param.sizes());
}

// Outputs keep channels_last when the input is channels_last (and not also plain contiguous, as
// with C == 1); every other layout gives a contiguous output. fastpipe/ops/_fake.py has the same rule.
inline at::MemoryFormat output_format(const at::Tensor& images) {
  return images.is_contiguous(at::MemoryFormat::ChannelsLast) && !images.is_contiguous()
             ? at::MemoryFormat::ChannelsLast
             : at::MemoryFormat::Contiguous;
}

inline Geometry geometry_of(const at::Tensor& images) {
  return Geometry{images.size(0), images.size(1), images.size(2), images.size(3)};
}

inline Strides strides_of(const at::Tensor& t) {
  return Strides{t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

inline void check_normalize_args(const at::Tensor& images, const at::Tensor& mean,
                                 const at::Tensor& std, at::ScalarType dtype) {
  check_images(images, "normalize");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "fastpipe::normalize outputs float32, float16 or bfloat16, got ", dtype);
  const int64_t c = images.size(1);
  check_param(images, mean, "normalize", "mean", at::kFloat, {c});
  check_param(images, std, "normalize", "std", at::kFloat, {c});
}

inline void check_erase_args(const at::Tensor& images, const at::Tensor& boxes,
                             const at::Tensor& fill, const std::optional<at::Tensor>& seeds) {
  check_images(images, "erase");
  TORCH_CHECK(boxes.dim() == 3 && boxes.size(0) == images.size(0) && boxes.size(2) == 4,
              "fastpipe::erase: boxes must have shape (N, K, 4) with N = ", images.size(0),
              ", got ", boxes.sizes());
  check_param(images, boxes, "erase", "boxes", at::kLong, boxes.sizes());
  // fill: C values for every box, or C values per box, (N, K, C).
  const bool per_box = fill.dim() == 3;
  check_param(images, fill, "erase", "fill", images.scalar_type(),
              per_box ? at::IntArrayRef{images.size(0), boxes.size(1), images.size(1)}
                      : at::IntArrayRef{images.size(1)});
  if (seeds.has_value()) {
    check_param(images, *seeds, "erase", "seeds", at::kLong, {images.size(0)});
  }
}

// Whether every element of t has its own memory: with the dimensions sorted by stride, each
// stride passes the farthest element the smaller ones reach (a sufficient test; the Python
// wrappers apply the same one, fastpipe/ops/_functional.py).
inline bool elements_apart(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) {
      dims.emplace_back(t.stride(d), t.size(d));
    }
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) {
      return false;
    }
    reach += stride * (size - 1);
  }
  return true;
}

// In-place ops write through the strides: every element must have its own memory. torch's
// has_internal_overlap answers TooHard for every layout that is not dense (a sliced batch), so
// those are accepted only when elements_apart proves it.
inline void check_writable(const at::Tensor& images, const char* op) {
  const at::MemOverlap overlap = at::has_internal_overlap(images);
  TORCH_CHECK(overlap == at::MemOverlap::No ||
                  (overlap == at::MemOverlap::TooHard && elements_apart(images)),
              "fastpipe::", op, ": the images share memory between elements (an expanded or "
              "overlapping view, strides ", images.strides(), "); pass a tensor that owns its "
              "elements, e.g. images.clone()");
}

inline void check_mixup_args(const at::Tensor& images, const at::Tensor& lam) {
  check_images(images, "mixup");
  check_param(images, lam, "mixup", "lam", at::kFloat, {images.size(0)});
}

inline void check_cutmix_args(const at::Tensor& images, const at::Tensor& boxes) {
  check_images(images, "cutmix");
  check_param(images, boxes, "cutmix", "boxes", at::kLong, {images.size(0), 4});
}

}  // namespace fastpipe

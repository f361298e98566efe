// Torch glue for the CUDA kernels: checks, output allocation, device guard, current stream.
//
// Compiled by g++ (only when the CUDA kernels are built); the kernels themselves are in
// kernels.cu. ATen/cuda/CUDAContext.h is avoided on purpose: it needs cusparse.h, which a plain
// CUDA toolkit install may lack; c10's stream and guard headers are enough.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "common.h"
#include "cuda/launch.h"

namespace fastpipe {
namespace cuda {
namespace {

ImageType image_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kByte:
      return ImageType::kUInt8;
    case at::kFloat:
      return ImageType::kFloat32;
    case at::kHalf:
      return ImageType::kFloat16;
    case at::kBFloat16:
      return ImageType::kBFloat16;
    default:
      TORCH_CHECK(false, "fastpipe: unsupported dtype ", dtype);
  }
}

void check_launch(cudaError_t error, const char* op) {
  TORCH_CHECK(error == cudaSuccess, "fastpipe::", op, ": CUDA kernel launch failed: ",
              cudaGetErrorName(error), ": ", cudaGetErrorString(error));
}

cudaStream_t current_stream() {
  return c10::cuda::getCurrentCUDAStream().stream();
}

at::Tensor normalize_cuda(const at::Tensor& images, const at::Tensor& mean, const at::Tensor& std,
                          at::ScalarType dtype, bool channels_last) {
  check_normalize_args(images, mean, std, dtype);
  c10::cuda::CUDAGuard guard(images.device());
  const auto format = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  at::Tensor out = at::empty(images.sizes(), images.options().dtype(dtype), format);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor mean_c = mean.contiguous(), std_c = std.contiguous();
  check_launch(launch_normalize(images.const_data_ptr(), image_type(images.scalar_type()),
                                strides_of(images), out.mutable_data_ptr(), image_type(dtype),
                                channels_last, geometry_of(images), mean_c.const_data_ptr<float>(),
                                std_c.const_data_ptr<float>(), current_stream()),
               "normalize");
  return out;
}

// The kernels read C fill values per box: a fill shared by every box is expanded to (N, K, C).
at::Tensor fill_per_box(const at::Tensor& fill, const at::Tensor& boxes) {
  if (fill.dim() == 3) {
    return fill.contiguous();
  }
  return fill.view({1, 1, fill.size(0)}).expand({boxes.size(0), boxes.size(1), fill.size(0)})
      .contiguous();
}

at::Tensor erase_cuda(const at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                      const std::optional<at::Tensor>& seeds) {
  check_erase_args(images, boxes, fill, seeds);
  c10::cuda::CUDAGuard guard(images.device());
  const auto format = output_format(images);
  at::Tensor out = at::empty(images.sizes(), images.options(), format);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor boxes_c = boxes.contiguous(), fill_c = fill_per_box(fill, boxes);
  at::Tensor seeds_c;
  if (seeds.has_value()) {
    seeds_c = seeds->contiguous();
  }
  check_launch(launch_erase(images.const_data_ptr(), strides_of(images), out.mutable_data_ptr(),
                            format == at::MemoryFormat::ChannelsLast,
                            image_type(images.scalar_type()), geometry_of(images),
                            boxes_c.const_data_ptr<int64_t>(), boxes.size(1),
                            fill_c.const_data_ptr(),
                            seeds.has_value() ? seeds_c.const_data_ptr<int64_t>() : nullptr,
                            current_stream()),
               "erase");
  return out;
}

void erase_inplace_cuda(at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                        const std::optional<at::Tensor>& seeds) {
  check_erase_args(images, boxes, fill, seeds);
  check_writable(images, "erase_");
  c10::cuda::CUDAGuard guard(images.device());
  if (images.numel() == 0 || boxes.size(1) == 0) {
    return;
  }
  const at::Tensor boxes_c = boxes.contiguous(), fill_c = fill_per_box(fill, boxes);
  at::Tensor seeds_c;
  if (seeds.has_value()) {
    seeds_c = seeds->contiguous();
  }
  check_launch(launch_erase_inplace(images.mutable_data_ptr(), strides_of(images),
                                    image_type(images.scalar_type()), geometry_of(images),
                                    boxes_c.const_data_ptr<int64_t>(), boxes.size(1),
                                    fill_c.const_data_ptr(),
                                    seeds.has_value() ? seeds_c.const_data_ptr<int64_t>() : nullptr,
                                    current_stream()),
               "erase_");
}

at::Tensor mixup_cuda(const at::Tensor& images, const at::Tensor& lam) {
  check_mixup_args(images, lam);
  c10::cuda::CUDAGuard guard(images.device());
  const auto format = output_format(images);
  at::Tensor out = at::empty(images.sizes(), images.options(), format);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor lam_c = lam.contiguous();
  check_launch(launch_mixup(images.const_data_ptr(), strides_of(images), out.mutable_data_ptr(),
                            format == at::MemoryFormat::ChannelsLast,
                            image_type(images.scalar_type()), geometry_of(images),
                            lam_c.const_data_ptr<float>(), current_stream()),
               "mixup");
  return out;
}

at::Tensor cutmix_cuda(const at::Tensor& images, const at::Tensor& boxes) {
  check_cutmix_args(images, boxes);
  c10::cuda::CUDAGuard guard(images.device());
  const auto format = output_format(images);
  at::Tensor out = at::empty(images.sizes(), images.options(), format);
  if (out.numel() == 0) {
    return out;
  }
  const at::Tensor boxes_c = boxes.contiguous();
  check_launch(launch_cutmix(images.const_data_ptr(), strides_of(images), out.mutable_data_ptr(),
                             format == at::MemoryFormat::ChannelsLast,
                             image_type(images.scalar_type()), geometry_of(images),
                             boxes_c.const_data_ptr<int64_t>(), current_stream()),
               "cutmix");
  return out;
}

void mixup_inplace_cuda(at::Tensor& images, const at::Tensor& lam) {
  check_mixup_args(images, lam);
  check_writable(images, "mixup_");
  c10::cuda::CUDAGuard guard(images.device());
  if (images.numel() == 0) {
    return;
  }
  const at::Tensor lam_c = lam.contiguous();
  check_launch(launch_mixup_inplace(images.mutable_data_ptr(), strides_of(images),
                                    output_format(images) == at::MemoryFormat::ChannelsLast,
                                    image_type(images.scalar_type()), geometry_of(images),
                                    lam_c.const_data_ptr<float>(), current_stream()),
               "mixup_");
}

void cutmix_inplace_cuda(at::Tensor& images, const at::Tensor& boxes) {
  check_cutmix_args(images, boxes);
  check_writable(images, "cutmix_");
  c10::cuda::CUDAGuard guard(images.device());
  if (images.numel() == 0) {
    return;
  }
  const at::Tensor boxes_c = boxes.contiguous();
  check_launch(launch_cutmix_inplace(images.mutable_data_ptr(), strides_of(images),
                                     output_format(images) == at::MemoryFormat::ChannelsLast,
                                     image_type(images.scalar_type()), geometry_of(images),
                                     boxes_c.const_data_ptr<int64_t>(), current_stream()),
               "cutmix_");
}

}  // namespace
}  // namespace cuda
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CUDA, m) {
  m.impl("normalize", &fastpipe::cuda::normalize_cuda);
  m.impl("erase", &fastpipe::cuda::erase_cuda);
  m.impl("erase_", &fastpipe::cuda::erase_inplace_cuda);
  m.impl("mixup", &fastpipe::cuda::mixup_cuda);
  m.impl("cutmix", &fastpipe::cuda::cutmix_cuda);
  m.impl("mixup_", &fastpipe::cuda::mixup_inplace_cuda);
  m.impl("cutmix_", &fastpipe::cuda::cutmix_inplace_cuda);
}

// Torch glue of resize_crops' CUDA kernels: the checks and per-image table of resize_crops.h, the
// table copied to the device from pinned memory without blocking (torch's caching host allocator
// keeps the buffer until the copy has run), the taps' memory, the kernels on the current stream.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "cuda/launch.h"
#include "resize_crops.h"

namespace fastpipe {
namespace cuda {
namespace {

at::Tensor resize_crops_cuda(at::TensorList images, const at::Tensor& plan, int64_t height,
                             int64_t width, int64_t filter) {
  check_resize_args(images, plan, height, width, filter);
  const auto device = images[0].device();
  TORCH_CHECK(device.is_cuda(), "fastpipe::resize_crops: CUDA kernel called with ", device);
  c10::cuda::CUDAGuard guard(device);
  const ResizeTable layout = resize_table(images, plan, height, width, filter);
  const int64_t n = static_cast<int64_t>(images.size());
  at::Tensor host = at::empty({n, kResizeTableColumns},
                              at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::memcpy(host.mutable_data_ptr<int64_t>(), layout.rows.data(),
              layout.rows.size() * sizeof(int64_t));
  const at::Tensor table = host.to(device, /*non_blocking=*/true);
  // The taps, written by the first kernel and read by the second, on this stream: torch's caching
  // allocator keeps their memory for it until both have run.
  at::Tensor spans = at::empty({n * (height + width) * 2},
                               at::TensorOptions().dtype(at::kInt).device(device));
  at::Tensor weights =
      at::empty({layout.weights}, at::TensorOptions().dtype(at::kFloat).device(device));
  at::Tensor out = at::empty({n, 3, height, width}, images[0].options());
  const cudaError_t error = launch_resize_crops(
      table.const_data_ptr<int64_t>(), n, height, width, static_cast<int>(filter),
      spans.mutable_data_ptr<int32_t>(), weights.mutable_data_ptr<float>(),
      out.mutable_data_ptr<uint8_t>(), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(error == cudaSuccess, "fastpipe::resize_crops: CUDA kernel launch failed: ",
              cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  return out;
}

}  // namespace
}  // namespace cuda
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CUDA, m) {
  m.impl("resize_crops", &fastpipe::cuda::resize_crops_cuda);
}

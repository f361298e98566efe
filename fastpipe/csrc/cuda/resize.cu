// The CUDA kernel of resize_crops: a thread per output pixel, kernels.h's resize_crops_element
// (the taps of its row and column computed by the thread, in double as on the CPU). Plain CUDA,
// no torch header; the glue is resize_cuda.cpp.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "kernels.h"

namespace fastpipe {
namespace cuda {
namespace {

constexpr int kResizeThreads = 128;
constexpr int64_t kResizeMaxBlocks = 65535;

// Index uint32_t: the batch's pixels fit in 32 bits, so a thread finds its pixel with 32-bit
// division (64-bit division is emulated on GPUs).
template <typename Index>
__global__ void resize_crops_kernel(const int64_t* __restrict__ table, int64_t height,
                                    int64_t width, int filter, uint8_t* __restrict__ out,
                                    int64_t total) {
  const Index end = static_cast<Index>(total);
  const Index step = static_cast<Index>(blockDim.x) * gridDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += step) {
    resize_crops_element<Index>(i, table, height, width, filter, out);
  }
}

}  // namespace

cudaError_t launch_resize_crops(const int64_t* table, int64_t n, int64_t height, int64_t width,
                                int filter, uint8_t* out, cudaStream_t stream) {
  const int64_t total = n * height * width;
  if (total == 0) {
    return cudaSuccess;
  }
  int64_t blocks = (total + kResizeThreads - 1) / kResizeThreads;
  blocks = blocks < kResizeMaxBlocks ? blocks : kResizeMaxBlocks;
  // total < 2^31 and the grid's stride below 2^24, so the 32-bit counter cannot wrap around.
  if (total < (int64_t{1} << 31)) {
    resize_crops_kernel<uint32_t><<<static_cast<unsigned int>(blocks), kResizeThreads, 0, stream>>>(
        table, height, width, filter, out, total);
  } else {
    resize_crops_kernel<int64_t><<<static_cast<unsigned int>(blocks), kResizeThreads, 0, stream>>>(
        table, height, width, filter, out, total);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace fastpipe

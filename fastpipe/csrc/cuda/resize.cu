// The CUDA kernels of resize_crops, kernels.h's two passes: the taps of each image's output rows
// and columns (resize_crops_taps, a thread per row or column, in double as on the CPU), then a
// thread per output pixel reading them (resize_crops_element). Plain CUDA, no torch header; the
// glue is resize_cuda.cpp.
#include <cuda_runtime.h>

#include "cuda/launch.h"
#include "kernels.h"

namespace fastpipe {
namespace cuda {
namespace {

constexpr int kResizeThreads = 128;
constexpr int64_t kResizeMaxBlocks = 65535;

// Index uint32_t: the count fits in 32 bits, so a thread finds its item with 32-bit division
// (64-bit division is emulated on GPUs).
template <typename Index>
__global__ void resize_taps_kernel(const int64_t* __restrict__ table, int64_t height,
                                   int64_t width, int filter, int32_t* __restrict__ spans,
                                   float* __restrict__ weights, int64_t total) {
  const Index end = static_cast<Index>(total);
  const Index step = static_cast<Index>(blockDim.x) * gridDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += step) {
    resize_crops_taps<Index>(i, table, height, width, filter, spans, weights);
  }
}

template <typename Index>
__global__ void resize_crops_kernel(const int64_t* __restrict__ table,
                                    const int32_t* __restrict__ spans,
                                    const float* __restrict__ weights, int64_t height,
                                    int64_t width, uint8_t* __restrict__ out, int64_t total) {
  const Index end = static_cast<Index>(total);
  const Index step = static_cast<Index>(blockDim.x) * gridDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += step) {
    resize_crops_element<Index>(i, table, spans, weights, height, width, out);
  }
}

unsigned int blocks_for(int64_t total) {
  const int64_t blocks = (total + kResizeThreads - 1) / kResizeThreads;
  return static_cast<unsigned int>(blocks < kResizeMaxBlocks ? blocks : kResizeMaxBlocks);
}

}  // namespace

cudaError_t launch_resize_crops(const int64_t* table, int64_t n, int64_t height, int64_t width,
                                int filter, int32_t* spans, float* weights, uint8_t* out,
                                cudaStream_t stream) {
  const int64_t entries = n * (height + width);
  const int64_t total = n * height * width;
  if (total == 0) {
    return cudaSuccess;
  }
  // Counts below 2^31 and the grid's stride below 2^24, so a 32-bit counter cannot wrap around.
  constexpr int64_t kSmall = int64_t{1} << 31;
  if (entries < kSmall) {
    resize_taps_kernel<uint32_t><<<blocks_for(entries), kResizeThreads, 0, stream>>>(
        table, height, width, filter, spans, weights, entries);
  } else {
    resize_taps_kernel<int64_t><<<blocks_for(entries), kResizeThreads, 0, stream>>>(
        table, height, width, filter, spans, weights, entries);
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    return error;
  }
  if (total < kSmall) {
    resize_crops_kernel<uint32_t><<<blocks_for(total), kResizeThreads, 0, stream>>>(
        table, spans, weights, height, width, out, total);
  } else {
    resize_crops_kernel<int64_t><<<blocks_for(total), kResizeThreads, 0, stream>>>(
        table, spans, weights, height, width, out, total);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace fastpipe

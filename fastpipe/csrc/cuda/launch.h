// Launchers of the CUDA kernels: raw pointers, geometry and a stream in, a cudaError_t out.
//
// Shared by kernels.cu (nvcc, no torch headers: seconds to compile) and ops_cuda.cpp (g++, the
// torch glue that checks arguments, allocates outputs and picks the current stream).
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "kernels.h"

namespace fastpipe {
namespace cuda {

enum class ImageType : int { kUInt8 = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

// Every launcher reads the input through its strides (any layout) and writes a dense output,
// NCHW or channels_last, one thread per output element. It returns cudaGetLastError() after the
// launch (cudaSuccess without a launch when the batch is empty).

cudaError_t launch_normalize(const void* images, ImageType in_type, Strides in_strides, void* out,
                             ImageType out_type, bool out_channels_last, Geometry g,
                             const float* mean, const float* std, cudaStream_t stream);

// boxes: (N, count, 4) int64; fill: (N, count, C) values of the image type, C per box; seeds:
// (N,) int64 or null.
cudaError_t launch_erase(const void* images, Strides in_strides, void* out, bool out_channels_last,
                         ImageType type, Geometry g, const int64_t* boxes, int64_t count,
                         const void* fill, const int64_t* seeds, cudaStream_t stream);

// In place: writes the boxes of images through its strides (logical NCHW order, no reads).
cudaError_t launch_erase_inplace(void* images, Strides strides, ImageType type, Geometry g,
                                 const int64_t* boxes, int64_t count, const void* fill,
                                 const int64_t* seeds, cudaStream_t stream);

// lam: (N,) float32.
cudaError_t launch_mixup(const void* images, Strides in_strides, void* out, bool out_channels_last,
                         ImageType type, Geometry g, const float* lam, cudaStream_t stream);

// boxes: (N, 4) int64.
cudaError_t launch_cutmix(const void* images, Strides in_strides, void* out, bool out_channels_last,
                          ImageType type, Geometry g, const int64_t* boxes, cudaStream_t stream);

// In place, through the strides: one thread per element of the first (N + 1) / 2 samples, which
// reads that element of the sample and of its partner N - 1 - n and writes both; channels_last
// (for a batch stored NHWC) numbers the threads in NHWC order.
cudaError_t launch_mixup_inplace(void* images, Strides strides, bool channels_last, ImageType type,
                                 Geometry g, const float* lam, cudaStream_t stream);
cudaError_t launch_cutmix_inplace(void* images, Strides strides, bool channels_last,
                                  ImageType type, Geometry g, const int64_t* boxes,
                                  cudaStream_t stream);

// resize_crops: table is (n, kResizeTableColumns) int64 on the device (fastpipe/csrc/
// resize_crops.h's resize_table); spans (n * (height + width) * 2 int32) and weights (the table's
// count of floats) device memory for the taps, written by the first kernel (a thread per output
// row or column of an image), read by the second; out is (n, 3, height, width) uint8, one thread
// per pixel.
cudaError_t launch_resize_crops(const int64_t* table, int64_t n, int64_t height, int64_t width,
                                int filter, int32_t* spans, float* weights, uint8_t* out,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace fastpipe

// CUDA kernels of fastpipe's ops and their launchers. Plain CUDA: no torch header, so this file
// compiles in seconds; the per-element math comes from kernels.h, shared with the CPU kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/index.h"
#include "cuda/launch.h"
#include "kernels.h"

namespace fastpipe {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

// Conversions between image types and float on the device: round to nearest even for
// float16/bfloat16 and half to even with saturation for uint8, as c10::Half, c10::BFloat16 and
// round_to_byte do on the CPU.
struct DeviceConv {
  static __device__ __forceinline__ float to_float(uint8_t v) { return static_cast<float>(v); }
  static __device__ __forceinline__ float to_float(float v) { return v; }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

  template <typename T>
  static __device__ __forceinline__ T from_float(float v) {
    if constexpr (std::is_same<T, uint8_t>::value) {
      return round_to_byte(v);
    } else if constexpr (std::is_same<T, __half>::value) {
      return __float2half_rn(v);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __float2bfloat16_rn(v);
    } else {
      return v;
    }
  }
};

#define FASTPIPE_GRID_STRIDE_LOOP(i, total)                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// Any number of channels and any size: scale and shift per element, int64 indices.
template <typename TIn, typename TOut>
__global__ void normalize_kernel(const TIn* __restrict__ in, Strides s, TOut* __restrict__ out,
                                 bool channels_last, Geometry g, const float* __restrict__ mean,
                                 const float* __restrict__ std, bool uint8_input, int64_t total) {
  FASTPIPE_GRID_STRIDE_LOOP(i, total) {
    out[i] = normalize_element<TIn, TOut, DeviceConv>(i, in, s, channels_last, g, mean, std,
                                                      uint8_input);
  }
}

// Up to kMaxTableChannels channels: each block computes the per-channel scale and shift once
// into shared memory; Index32 decodes indices with 32-bit division (when fits_in_32_bits).
template <typename TIn, typename TOut, bool Index32>
__global__ void normalize_table_kernel(const TIn* __restrict__ in, Strides s,
                                       TOut* __restrict__ out, bool channels_last, Geometry g,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ std, bool uint8_input,
                                       int64_t total) {
  __shared__ float scale[kMaxTableChannels];
  __shared__ float shift[kMaxTableChannels];
  for (int64_t c = threadIdx.x; c < g.c; c += blockDim.x) {
    normalize_table_entry(c, mean, std, uint8_input, scale, shift);
  }
  __syncthreads();
  if constexpr (Index32) {
    // total < 2^31 and the stride is below 2^24, so i + stride cannot wrap around 2^32.
    const uint32_t end = static_cast<uint32_t>(total);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < end; i += blockDim.x * gridDim.x) {
      const Index4 p = dense_index32(i, g, channels_last);
      out[i] = normalize_at<TIn, TOut, DeviceConv>(p, strided_offset32(p, s), in, scale, shift);
    }
  } else {
    FASTPIPE_GRID_STRIDE_LOOP(i, total) {
      const Index4 p = dense_index(i, g, channels_last);
      out[i] = normalize_at<TIn, TOut, DeviceConv>(p, strided_offset(p, s), in, scale, shift);
    }
  }
}

// The grid-stride loop of the kernels below: with Index32 (the batch fits_in_32_bits) a 32-bit
// counter and kernels.h's bodies instantiated with Index32, so no element pays a 64-bit division.
template <bool Index32Path>
using IndexOf = typename std::conditional<Index32Path, Index32, Index64>::type;

template <bool Index32Path, typename Body>
__device__ __forceinline__ void grid_stride(int64_t total, Body&& body) {
  if constexpr (Index32Path) {
    // total < 2^31 and the stride is below 2^24, so i + stride cannot wrap around 2^32.
    const uint32_t end = static_cast<uint32_t>(total);
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < end; i += blockDim.x * gridDim.x) {
      body(static_cast<int64_t>(i));
    }
  } else {
    FASTPIPE_GRID_STRIDE_LOOP(i, total) {
      body(i);
    }
  }
}

template <typename T, bool I32>
__global__ void erase_kernel(const T* __restrict__ in, Strides s, T* __restrict__ out,
                             bool channels_last, Geometry g, const int64_t* __restrict__ boxes,
                             int64_t count, const T* __restrict__ fill,
                             const int64_t* __restrict__ seeds, int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    out[i] = erase_element<T, DeviceConv, IndexOf<I32>>(i, in, s, channels_last, g, boxes, count,
                                                        fill, seeds);
  });
}

template <typename T, bool I32>
__global__ void erase_inplace_kernel(T* __restrict__ images, Strides s, Geometry g,
                                     const int64_t* __restrict__ boxes, int64_t count,
                                     const T* __restrict__ fill, const int64_t* __restrict__ seeds,
                                     int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    erase_inplace_element<T, DeviceConv, IndexOf<I32>>(i, images, s, g, boxes, count, fill, seeds);
  });
}

template <typename T, bool I32>
__global__ void mixup_kernel(const T* __restrict__ in, Strides s, T* __restrict__ out,
                             bool channels_last, Geometry g, const float* __restrict__ lam,
                             int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    out[i] = mixup_element<T, DeviceConv, IndexOf<I32>>(i, in, s, channels_last, g, lam);
  });
}

template <typename T, bool I32>
__global__ void cutmix_kernel(const T* __restrict__ in, Strides s, T* __restrict__ out,
                              bool channels_last, Geometry g, const int64_t* __restrict__ boxes,
                              int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    out[i] = cutmix_element<T, IndexOf<I32>>(i, in, s, channels_last, g, boxes);
  });
}

template <typename T, bool I32>
__global__ void mixup_inplace_kernel(T* images, Strides s, bool channels_last, Geometry g,
                                     const float* __restrict__ lam, int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    mixup_pair_element<T, DeviceConv, IndexOf<I32>>(i, images, s, channels_last, g, lam);
  });
}

template <typename T, bool I32>
__global__ void cutmix_inplace_kernel(T* images, Strides s, bool channels_last, Geometry g,
                                      const int64_t* __restrict__ boxes, int64_t total) {
  grid_stride<I32>(total, [&](int64_t i) {
    cutmix_pair_element<T, IndexOf<I32>>(i, images, s, channels_last, g, boxes);
  });
}

int64_t total_of(const Geometry& g) {
  return g.n * g.c * g.h * g.w;
}

unsigned int blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Calls body(T{}) with the device type of an image type.
template <typename Body>
cudaError_t with_type(ImageType type, Body&& body) {
  switch (type) {
    case ImageType::kUInt8:
      return body(uint8_t{});
    case ImageType::kFloat32:
      return body(float{});
    case ImageType::kFloat16:
      return body(__half{});
    case ImageType::kBFloat16:
      return body(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_normalize(const void* images, ImageType in_type, Strides in_strides, void* out,
                             ImageType out_type, bool out_channels_last, Geometry g,
                             const float* mean, const float* std, cudaStream_t stream) {
  const int64_t total = total_of(g);
  if (total == 0) {
    return cudaSuccess;
  }
  if (out_type == ImageType::kUInt8) {
    return cudaErrorInvalidValue;
  }
  return with_type(in_type, [&](auto in_tag) {
    using TIn = decltype(in_tag);
    return with_type(out_type, [&](auto out_tag) {
      using TOut = decltype(out_tag);
      const auto* in = static_cast<const TIn*>(images);
      auto* dst = static_cast<TOut*>(out);
      const bool uint8_input = in_type == ImageType::kUInt8;
      if (g.c > kMaxTableChannels) {
        normalize_kernel<TIn, TOut><<<blocks_for(total), kThreads, 0, stream>>>(
            in, in_strides, dst, out_channels_last, g, mean, std, uint8_input, total);
      } else if (fits_in_32_bits(g, in_strides)) {
        normalize_table_kernel<TIn, TOut, true><<<blocks_for(total), kThreads, 0, stream>>>(
            in, in_strides, dst, out_channels_last, g, mean, std, uint8_input, total);
      } else {
        normalize_table_kernel<TIn, TOut, false><<<blocks_for(total), kThreads, 0, stream>>>(
            in, in_strides, dst, out_channels_last, g, mean, std, uint8_input, total);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_erase(const void* images, Strides in_strides, void* out, bool out_channels_last,
                         ImageType type, Geometry g, const int64_t* boxes, int64_t count,
                         const void* fill, const int64_t* seeds, cudaStream_t stream) {
  const int64_t total = total_of(g);
  if (total == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(
          static_cast<const T*>(images), in_strides, static_cast<T*>(out), out_channels_last, g,
          boxes, count, static_cast<const T*>(fill), seeds, total);
    };
    fits_in_32_bits(g, in_strides) ? launch(erase_kernel<T, true>) : launch(erase_kernel<T, false>);
    return cudaGetLastError();
  });
}

cudaError_t launch_erase_inplace(void* images, Strides strides, ImageType type, Geometry g,
                                 const int64_t* boxes, int64_t count, const void* fill,
                                 const int64_t* seeds, cudaStream_t stream) {
  const int64_t total = total_of(g);
  if (total == 0 || count == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(
          static_cast<T*>(images), strides, g, boxes, count, static_cast<const T*>(fill), seeds,
          total);
    };
    fits_in_32_bits(g, strides) ? launch(erase_inplace_kernel<T, true>)
                                : launch(erase_inplace_kernel<T, false>);
    return cudaGetLastError();
  });
}

cudaError_t launch_mixup(const void* images, Strides in_strides, void* out, bool out_channels_last,
                         ImageType type, Geometry g, const float* lam, cudaStream_t stream) {
  const int64_t total = total_of(g);
  if (total == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(
          static_cast<const T*>(images), in_strides, static_cast<T*>(out), out_channels_last, g,
          lam, total);
    };
    fits_in_32_bits(g, in_strides) ? launch(mixup_kernel<T, true>) : launch(mixup_kernel<T, false>);
    return cudaGetLastError();
  });
}

cudaError_t launch_cutmix(const void* images, Strides in_strides, void* out, bool out_channels_last,
                          ImageType type, Geometry g, const int64_t* boxes, cudaStream_t stream) {
  const int64_t total = total_of(g);
  if (total == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(
          static_cast<const T*>(images), in_strides, static_cast<T*>(out), out_channels_last, g,
          boxes, total);
    };
    fits_in_32_bits(g, in_strides) ? launch(cutmix_kernel<T, true>)
                                   : launch(cutmix_kernel<T, false>);
    return cudaGetLastError();
  });
}

cudaError_t launch_mixup_inplace(void* images, Strides strides, bool channels_last, ImageType type,
                                 Geometry g, const float* lam, cudaStream_t stream) {
  const int64_t total = total_of(pair_geometry(g));
  if (total == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(static_cast<T*>(images), strides,
                                                         channels_last, g, lam, total);
    };
    fits_in_32_bits(g, strides) ? launch(mixup_inplace_kernel<T, true>)
                                : launch(mixup_inplace_kernel<T, false>);
    return cudaGetLastError();
  });
}

cudaError_t launch_cutmix_inplace(void* images, Strides strides, bool channels_last,
                                  ImageType type, Geometry g, const int64_t* boxes,
                                  cudaStream_t stream) {
  const int64_t total = total_of(pair_geometry(g));
  if (total == 0) {
    return cudaSuccess;
  }
  return with_type(type, [&](auto tag) {
    using T = decltype(tag);
    auto launch = [&](auto kernel) {
      kernel<<<blocks_for(total), kThreads, 0, stream>>>(static_cast<T*>(images), strides,
                                                         channels_last, g, boxes, total);
    };
    fits_in_32_bits(g, strides) ? launch(cutmix_inplace_kernel<T, true>)
                                : launch(cutmix_inplace_kernel<T, false>);
    return cudaGetLastError();
  });
}

}  // namespace cuda
}  // namespace fastpipe

// Helpers for the CPU kernels: calling a templated body with the C++ type of an image dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "kernels.h"

namespace fastpipe {
namespace cpu {

// Calls body(T{}) with T the C++ type of dtype (uint8, float32, float16 or bfloat16).
template <typename Body>
void with_image_type(at::ScalarType dtype, const char* op, Body&& body) {
  switch (dtype) {
    case at::kByte:
      return body(uint8_t{});
    case at::kFloat:
      return body(float{});
    case at::kHalf:
      return body(c10::Half{});
    case at::kBFloat16:
      return body(c10::BFloat16{});
    default:
      TORCH_CHECK(false, "fastpipe::", op, ": unsupported dtype ", dtype);
  }
}

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

// Float to the image type: round to nearest even for float16/bfloat16 (c10's conversions), and
// round half to even with saturation for uint8.
template <typename T>
inline T from_float(float v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return round_to_byte(v);
  } else {
    return static_cast<T>(v);
  }
}

// The conversions in the form the element functions of kernels.h take.
struct HostConv {
  template <typename T>
  static float to_float(T v) {
    return cpu::to_float(v);
  }
  template <typename T>
  static T from_float(float v) {
    return cpu::from_float<T>(v);
  }
};

// Samples per parallel task so that a task is worth waking a thread for (about 256K elements).
inline int64_t sample_grain(int64_t sample_size) {
  const int64_t target = 1 << 18;
  return sample_size >= target ? 1 : target / (sample_size > 0 ? sample_size : 1);
}

// Rows per parallel task so that each task touches about 64K elements.
inline int64_t grain_for(int64_t row_length) {
  const int64_t target = 1 << 16;
  return row_length >= target ? 1 : target / (row_length > 0 ? row_length : 1);
}

}  // namespace cpu
}  // namespace fastpipe

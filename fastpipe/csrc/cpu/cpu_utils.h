// Helpers for the CPU kernels: calling a templated body with the C++ type of an image dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FASTPIPE_X86 1
#endif

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

// ---- conversions of runs of values, written to vectorize ----
// c10::Half and c10::BFloat16 convert one value at a time through a function the compiler does not
// vectorize, and a loop that mixes uint8 loads, float math and round_to_byte stays scalar too. The
// kernels therefore work through a float buffer: load_floats, float math, store_floats. Each
// function gives the same bits as the scalar conversions above (IEEE round to nearest even).

#if defined(_MSC_VER)
#define FASTPIPE_ALWAYS_INLINE __forceinline
#else
#define FASTPIPE_ALWAYS_INLINE __attribute__((always_inline)) inline
#endif

// Values per buffer: small enough for the stack and L1, long enough to amortize the loop overhead.
constexpr int64_t kChunk = 512;

FASTPIPE_ALWAYS_INLINE void load_floats(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

FASTPIPE_ALWAYS_INLINE void load_floats(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

FASTPIPE_ALWAYS_INLINE void load_floats(const c10::BFloat16* src, float* dst, int64_t n) {
  // A bfloat16 is the upper half of a float32. (memcpy: the bits of a float without breaking
  // strict aliasing; it compiles to plain vector moves.)
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

FASTPIPE_ALWAYS_INLINE void store_floats(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// store_floats with non-temporal stores where the CPU has them (x86): for outputs far larger than
// the caches, writing around them saves reading each line in before overwriting it. Callers end
// their writes with stream_fence().
FASTPIPE_ALWAYS_INLINE void stream_floats(const float* src, float* dst, int64_t n) {
#ifdef FASTPIPE_X86
  int64_t k = 0;
  for (; k < n && (reinterpret_cast<uintptr_t>(dst + k) & 15) != 0; ++k) {
    dst[k] = src[k];
  }
  for (; k + 4 <= n; k += 4) {
    _mm_stream_ps(dst + k, _mm_loadu_ps(src + k));
  }
  for (; k < n; ++k) {
    dst[k] = src[k];
  }
#else
  std::memcpy(dst, src, n * sizeof(float));
#endif
}

inline void stream_fence() {
#ifdef FASTPIPE_X86
  _mm_sfence();
#endif
}

// round_to_byte for finite values (the kernels only store finite values as uint8): clamping to
// 0-255 before rounding to nearest even gives the same byte as rounding first, and then the
// conversion to int32 in the default rounding mode is the rounding. A NaN gives 0.
FASTPIPE_ALWAYS_INLINE uint8_t float_to_byte(float v) {
  v = v > 0.0f ? v : 0.0f;
  v = v < 255.0f ? v : 255.0f;
  return static_cast<uint8_t>(static_cast<int32_t>((v + 12582912.0f) - 12582912.0f));
}

#ifdef FASTPIPE_X86
enum class Capability;
inline Capability cpu_capability();
inline bool has_avx512();
inline bool has_avx2();

// 16 values per step: the same max/min/convert as below, then a narrowing move to bytes. (GCC 12
// warns about its own intrinsics' deliberately undefined registers here.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void store_bytes_avx512(
    const float* src, uint8_t* dst, int64_t n) {
  const __m512 lo = _mm512_setzero_ps(), hi = _mm512_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(src + i), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  for (; i < n; ++i) {
    dst[i] = float_to_byte(src[i]);
  }
}
#pragma GCC diagnostic pop

// 16 values per step with 8-wide registers: pack to 16 bits within 128-bit lanes, put the lanes in
// order, pack to bytes.
__attribute__((target("avx2"))) inline void store_bytes_avx2(const float* src, uint8_t* dst,
                                                             int64_t n) {
  const __m256 lo = _mm256_setzero_ps(), hi = _mm256_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(src + i), lo), hi);
    const __m256 b = _mm256_min_ps(_mm256_max_ps(_mm256_loadu_ps(src + i + 8), lo), hi);
    const __m256i words = _mm256_permute4x64_epi64(
        _mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), 0xD8);
    const __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(words),
                                           _mm256_extracti128_si256(words, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bytes);
  }
  for (; i < n; ++i) {
    dst[i] = float_to_byte(src[i]);
  }
}
#endif

FASTPIPE_ALWAYS_INLINE void store_floats(const float* src, uint8_t* dst, int64_t n) {
  int64_t i = 0;
#ifdef FASTPIPE_X86
  if (has_avx512()) {
    return store_bytes_avx512(src, dst, n);
  }
  if (has_avx2()) {
    return store_bytes_avx2(src, dst, n);
  }
  // The compiler keeps the clamps above as branches (they could trap on a NaN), so spell out
  // the SSE2 (baseline x86-64) sequence: max/min, convert to int32 rounding to nearest even, pack.
  const __m128 lo = _mm_setzero_ps(), hi = _mm_set1_ps(255.0f);
  for (; i + 16 <= n; i += 16) {
    __m128i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m128 v = _mm_min_ps(_mm_max_ps(_mm_loadu_ps(src + i + 4 * k), lo), hi);
      q[k] = _mm_cvtps_epi32(v);
    }
    const __m128i bytes =
        _mm_packus_epi16(_mm_packs_epi32(q[0], q[1]), _mm_packs_epi32(q[2], q[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bytes);
  }
#endif
  for (; i < n; ++i) {
    dst[i] = float_to_byte(src[i]);
  }
}

FASTPIPE_ALWAYS_INLINE void store_floats(const float* src, c10::BFloat16* dst, int64_t n) {
  // c10's round_to_nearest_even, in a form without a branch.
  uint16_t* out = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + (((u >> 16) & 1u) + 0x7fffu)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    out[i] = static_cast<uint16_t>(nan ? 0x7fc0u : rounded);
  }
}

#ifdef FASTPIPE_X86
// F16C converts 8 values per instruction with IEEE round to nearest even, as c10::Half does.
__attribute__((target("avx,f16c"))) inline void load_halves_f16c(const c10::Half* src, float* dst,
                                                                  int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

__attribute__((target("avx,f16c"))) inline void store_halves_f16c(const float* src,
                                                                   c10::Half* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) {
    dst[i] = static_cast<c10::Half>(src[i]);
  }
}

// With F16C whenever the AVX2 or AVX-512 versions run (FASTPIPE_CPU_CAPABILITY=baseline turns
// all off).
inline bool has_f16c() {
  return has_avx2();
}
#endif

#ifdef FASTPIPE_X86
// The same conversions 16 at a time (AVX512F has the 16-wide forms of F16C's instructions).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,f16c"))) inline void load_halves_avx512(const c10::Half* src,
                                                                        float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  load_halves_f16c(src + i, dst + i, n - i);
}

__attribute__((target("avx512f,f16c"))) inline void store_halves_avx512(const float* src,
                                                                         c10::Half* dst,
                                                                         int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  store_halves_f16c(src + i, dst + i, n - i);
}
#pragma GCC diagnostic pop
#endif

inline void load_floats(const c10::Half* src, float* dst, int64_t n) {
#ifdef FASTPIPE_X86
  if (has_avx512()) {
    return load_halves_avx512(src, dst, n);
  }
  if (has_f16c()) {
    return load_halves_f16c(src, dst, n);
  }
#endif
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<float>(src[i]);
  }
}

inline void store_floats(const float* src, c10::Half* dst, int64_t n) {
#ifdef FASTPIPE_X86
  if (has_avx512()) {
    return store_halves_avx512(src, dst, n);
  }
  if (has_f16c()) {
    return store_halves_f16c(src, dst, n);
  }
#endif
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = static_cast<c10::Half>(src[i]);
  }
}

// ---- one body, compiled three times: for AVX-512 or AVX2 (chosen at run time), and baseline ----
// setup.py compiles for baseline x86-64 (SSE2), so that the wheel runs everywhere; the loops over
// a chunk are compute-bound at SSE2 widths. Body::run is inlined into each caller below, so the
// same source is vectorized with 16-, 32- and 64-byte registers. Only the register width differs
// (no FMA: -ffp-contract=off applies to all), so all give the same bits.
// FASTPIPE_CPU_CAPABILITY=baseline|avx2|avx512 (read once) caps the choice, so that the tests can
// check that every version gives the same bits, like torch's ATEN_CPU_CAPABILITY.

enum class Capability { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

template <typename Body, typename... Args>
void run_baseline(Args... args) {
  Body::run(args...);
}

#ifdef FASTPIPE_X86
// GCC needs to be told to use 64-byte registers; clang does not know the option.
#if defined(__clang__)
#define FASTPIPE_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c"
#else
#define FASTPIPE_AVX512_TARGET \
  "avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,prefer-vector-width=512"
#endif

template <typename Body, typename... Args>
__attribute__((target("avx2,f16c"))) void run_avx2(Args... args) {
  Body::run(args...);
}

template <typename Body, typename... Args>
__attribute__((target(FASTPIPE_AVX512_TARGET))) void run_avx512(Args... args) {
  Body::run(args...);
}

inline Capability cpu_capability() {
  static const Capability capability = [] {
    Capability best = Capability::kBaseline;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) {
      best = Capability::kAvx2;
      if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        best = Capability::kAvx512;
      }
    }
    const char* cap = std::getenv("FASTPIPE_CPU_CAPABILITY");
    Capability limit = Capability::kAvx512;
    if (cap != nullptr && std::strcmp(cap, "baseline") == 0) {
      limit = Capability::kBaseline;
    } else if (cap != nullptr && std::strcmp(cap, "avx2") == 0) {
      limit = Capability::kAvx2;
    }
    return static_cast<int>(best) < static_cast<int>(limit) ? best : limit;
  }();
  return capability;
}

inline bool has_avx2() {
  return cpu_capability() != Capability::kBaseline;
}

inline bool has_avx512() {
  return cpu_capability() == Capability::kAvx512;
}
#endif

template <typename Body, typename... Args>
inline void run_vectorized(Args... args) {
#ifdef FASTPIPE_X86
  switch (cpu_capability()) {
    case Capability::kAvx512:
      return run_avx512<Body>(args...);
    case Capability::kAvx2:
      return run_avx2<Body>(args...);
    default:
      break;
  }
#endif
  run_baseline<Body>(args...);
}

// Samples per parallel task so that a task is worth waking a thread for (about 256K elements).
inline int64_t sample_grain(int64_t sample_size) {
  const int64_t target = 1 << 18;
  return sample_size >= target ? 1 : target / (sample_size > 0 ? sample_size : 1);
}

// The part of a dense row (in elements) that a box covers: [from, to), empty when the box misses
// the row. box is (top, left, bottom, right), clipped here; pixel is the elements per pixel along
// the row (C for channels_last rows, 1 for NCHW rows).
struct Segment {
  int64_t from, to;
  bool empty() const { return to <= from; }
};

inline Segment box_segment(const int64_t* box, const Geometry& g, int64_t y, int64_t pixel) {
  const int64_t top = clamp_index(box[0], g.h), left = clamp_index(box[1], g.w);
  const int64_t bottom = clamp_index(box[2], g.h), right = clamp_index(box[3], g.w);
  if (y < top || y >= bottom || right <= left) {
    return Segment{0, 0};
  }
  return Segment{left * pixel, right * pixel};
}

// Rows per parallel task so that each task touches about 64K elements.
inline int64_t grain_for(int64_t row_length) {
  const int64_t target = 1 << 16;
  return row_length >= target ? 1 : target / (row_length > 0 ? row_length : 1);
}

}  // namespace cpu
}  // namespace fastpipe

// Per-element math shared by the CPU kernels (g++) and the CUDA kernels (nvcc).
//
// No torch header here: the .cu files include this and must stay torch-free to compile in seconds.
// Every function is a pure function of its arguments, and uses only integer operations and single
// IEEE float operations (no fused multiply-add: setup.py passes -ffp-contract=off to g++ and
// --fmad=false to nvcc), so the CPU kernels, the CUDA kernels and the pure-PyTorch reference in
// fastpipe/ops/_reference.py produce the same bits.
#pragma once

#include <stdint.h>

#include <type_traits>


#if defined(__CUDACC__)
#define FP_HD __host__ __device__ __forceinline__
#else
#define FP_HD inline
#endif

namespace fastpipe {

// Geometry of an (N, C, H, W) batch. Element offsets of an input are taken from its strides; an
// output is dense, NCHW or NHWC (channels_last).
struct Geometry {
  int64_t n, c, h, w;
};

struct Strides {
  int64_t n, c, h, w;
};

// Logical (n, c, y, x) of the i-th element of a dense output in memory order.
struct Index4 {
  int64_t n, c, y, x;
};

FP_HD Index4 dense_index(int64_t i, const Geometry& g, bool channels_last) {
  Index4 r;
  if (channels_last) {
    r.c = i % g.c;
    i /= g.c;
    r.x = i % g.w;
    i /= g.w;
    r.y = i % g.h;
    r.n = i / g.h;
  } else {
    r.x = i % g.w;
    i /= g.w;
    r.y = i % g.h;
    i /= g.h;
    r.c = i % g.c;
    r.n = i / g.c;
  }
  return r;
}

FP_HD int64_t strided_offset(const Index4& p, const Strides& s) {
  return p.n * s.n + p.c * s.c + p.y * s.h + p.x * s.w;
}

// How the per-element bodies below decode an element index and compute a strided offset: int64,
// valid for any batch. The CUDA kernels also instantiate them with cuda::Index32 (cuda/index.h),
// which does the same with 32-bit division when the batch fits.
struct Index64 {
  static FP_HD Index4 decode(int64_t i, const Geometry& g, bool channels_last) {
    return dense_index(i, g, channels_last);
  }
  static FP_HD int64_t offset(const Index4& p, const Strides& s) {
    return strided_offset(p, s);
  }
};

// ---- normalize: out = x * scale + shift, with scale = 1 / (std * range), shift = -mean / std ----
// range is 255 for uint8 input and 1 for float input; mean and std are in the 0-1 scale.
FP_HD float normalize_scale(float std, bool uint8_input) {
  return 1.0f / (std * (uint8_input ? 255.0f : 1.0f));
}

FP_HD float normalize_shift(float mean, float std) {
  return -mean / std;
}

FP_HD float normalize_value(float x, float scale, float shift) {
  return x * scale + shift;
}

// ---- mixup: out = a * lam + b * (1 - lam), rounded half to even for uint8 ----
FP_HD float mix_value(float a, float b, float lam) {
  const float other = 1.0f - lam;
  const float left = a * lam;
  const float right = b * other;
  return left + right;
}

// The sample that sample n is mixed with: the batch flipped, as in timm's Mixup.
FP_HD int64_t mix_partner(int64_t n, int64_t batch) {
  return batch - 1 - n;
}

// ---- boxes: rows of (top, left, bottom, right), bottom and right exclusive, clipped here ----
FP_HD int64_t clamp_index(int64_t v, int64_t hi) {
  return v < 0 ? 0 : (v > hi ? hi : v);
}

FP_HD bool box_contains(const int64_t* box, int64_t y, int64_t x) {
  // Clipping to the image is implied: y and x are inside it.
  return y >= box[0] && y < box[2] && x >= box[1] && x < box[3];
}

// The last of a sample's count boxes that contains (y, x), or -1. Where boxes overlap, the later
// box's fill wins, as when timm's RandomErasing erases its boxes one after the other.
FP_HD int64_t last_box_containing(const int64_t* boxes, int64_t count, int64_t y, int64_t x) {
  for (int64_t k = count - 1; k >= 0; --k) {
    if (box_contains(boxes + 4 * k, y, x)) {
      return k;
    }
  }
  return -1;
}

// ---- counter-based noise for random erasing ----
// A 32-bit integer hash (a lowbias32 variant by Chris Wellons) whose multipliers are below 2^31,
// so that the PyTorch reference can compute it exactly in int64 arithmetic.
FP_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}

// Logical index of an element inside its sample, the same for every memory layout.
FP_HD uint32_t noise_counter(const Index4& p, const Geometry& g) {
  return static_cast<uint32_t>((p.c * g.h + p.y) * g.w + p.x);
}

// The per-element random state. Adding the seed after hashing the counter (rather than xor-ing it
// in before) keeps two samples' noise from being permutations of each other.
FP_HD uint32_t noise_state(uint32_t seed, uint32_t counter) {
  return hash32(hash32(counter) + seed);
}

// Approximately standard-normal noise: the Irwin-Hall sum of 12 uniform 16-bit integers, centred
// and scaled by 2^-17 (mean 0, variance 1 - 2^-32, range about +-6). Integer sums and a
// power-of-two scale make it exact on every device.
FP_HD float noise_normal(uint32_t seed, uint32_t counter) {
  const uint32_t state = noise_state(seed, counter);
  int32_t sum = 0;
  for (uint32_t k = 0; k < 6; ++k) {
    const uint32_t h = hash32(state + k * 0x9e3779b9u);
    sum += static_cast<int32_t>(h & 0xffffu) + static_cast<int32_t>(h >> 16);
  }
  return static_cast<float>(2 * sum - 786420) * (1.0f / 131072.0f);
}

// Uniform noise over 0..255 for uint8 images.
FP_HD uint8_t noise_byte(uint32_t seed, uint32_t counter) {
  return static_cast<uint8_t>(noise_state(seed, counter) >> 24);
}

// Float to uint8: round half to even (like torch.round), then saturate. Adding and subtracting
// 1.5 * 2^23 rounds a float of magnitude below 2^22 to an integer in the default rounding mode
// (to nearest, ties to even); unlike rintf or std::nearbyint it vectorizes on baseline x86-64.
FP_HD uint8_t round_to_byte(float v) {
  v = v < -1.0f ? -1.0f : (v > 256.0f ? 256.0f : v);
  const float r = (v + 12582912.0f) - 12582912.0f;
  return static_cast<uint8_t>(r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r));
}

// ---- bodies of the CUDA kernels ----
// The value of output element i (dense, in memory order, NCHW or channels_last) of each op. The
// CUDA kernels are a grid-stride loop around these; the tests run them on the CPU as well (with
// host conversions) against the reference. Conv converts between the image type and float:
// static float to_float(T) and template <typename T> static T from_float(float).

template <typename T, typename Conv>
FP_HD T noise_value(uint32_t seed, uint32_t counter) {
  if constexpr (std::is_same<T, uint8_t>::value) {
    return noise_byte(seed, counter);
  } else {
    return Conv::template from_float<T>(noise_normal(seed, counter));
  }
}

template <typename TIn, typename TOut, typename Conv>
FP_HD TOut normalize_element(int64_t i, const TIn* in, const Strides& s, bool channels_last,
                             const Geometry& g, const float* mean, const float* std,
                             bool uint8_input) {
  const Index4 p = dense_index(i, g, channels_last);
  const float scale = normalize_scale(std[p.c], uint8_input);
  const float shift = normalize_shift(mean[p.c], std[p.c]);
  const float x = Conv::to_float(in[strided_offset(p, s)]);
  return Conv::template from_float<TOut>(normalize_value(x, scale, shift));
}

// What erase writes at p inside box k: that box's fill (fill holds C values per box, (N, count,
// C); the torch glue expands a fill shared by all boxes), or the noise keyed by the sample's seed.
template <typename T, typename Conv>
FP_HD T erase_fill(const Index4& p, const Geometry& g, int64_t k, int64_t count, const T* fill,
                   const int64_t* seeds) {
  return seeds ? noise_value<T, Conv>(static_cast<uint32_t>(seeds[p.n]), noise_counter(p, g))
               : fill[(p.n * count + k) * g.c + p.c];
}

template <typename T, typename Conv, typename Ix = Index64>
FP_HD T erase_element(int64_t i, const T* in, const Strides& s, bool channels_last,
                      const Geometry& g, const int64_t* boxes, int64_t count, const T* fill,
                      const int64_t* seeds) {
  const Index4 p = Ix::decode(i, g, channels_last);
  const int64_t k = last_box_containing(boxes + p.n * count * 4, count, p.y, p.x);
  if (k >= 0) {
    return erase_fill<T, Conv>(p, g, k, count, fill, seeds);
  }
  return in[Ix::offset(p, s)];
}

// In-place erase: element i in logical NCHW order is written (through the strides) only when a
// box covers it; nothing is read from the images.
template <typename T, typename Conv, typename Ix = Index64>
FP_HD void erase_inplace_element(int64_t i, T* images, const Strides& s, const Geometry& g,
                                 const int64_t* boxes, int64_t count, const T* fill,
                                 const int64_t* seeds) {
  const Index4 p = Ix::decode(i, g, false);
  const int64_t k = last_box_containing(boxes + p.n * count * 4, count, p.y, p.x);
  if (k >= 0) {
    images[Ix::offset(p, s)] = erase_fill<T, Conv>(p, g, k, count, fill, seeds);
  }
}

template <typename T, typename Conv, typename Ix = Index64>
FP_HD T mixup_element(int64_t i, const T* in, const Strides& s, bool channels_last,
                      const Geometry& g, const float* lam) {
  Index4 p = Ix::decode(i, g, channels_last);
  const float a = Conv::to_float(in[Ix::offset(p, s)]);
  const float weight = lam[p.n];
  p.n = mix_partner(p.n, g.n);
  const float b = Conv::to_float(in[Ix::offset(p, s)]);
  return Conv::template from_float<T>(mix_value(a, b, weight));
}

template <typename T, typename Ix = Index64>
FP_HD T cutmix_element(int64_t i, const T* in, const Strides& s, bool channels_last,
                       const Geometry& g, const int64_t* boxes) {
  Index4 p = Ix::decode(i, g, channels_last);
  if (box_contains(boxes + p.n * 4, p.y, p.x)) {
    p.n = mix_partner(p.n, g.n);
  }
  return in[Ix::offset(p, s)];
}

// In-place mixup and cutmix: element i, in logical NCHW order over the first (N + 1) / 2 samples,
// stands for the same element of sample n and of its partner N - 1 - n. Both new values need
// both old ones, so one thread reads the pair and writes both (the middle sample of an odd batch
// is its own partner). Written through the strides: any layout without overlapping elements;
// channels_last walks the pairs in NHWC order (for a batch stored that way, neighbouring threads
// then touch neighbouring memory).
FP_HD Geometry pair_geometry(const Geometry& g) {
  return Geometry{(g.n + 1) / 2, g.c, g.h, g.w};
}

template <typename T, typename Conv, typename Ix = Index64>
FP_HD void mixup_pair_element(int64_t i, T* images, const Strides& s, bool channels_last,
                              const Geometry& g, const float* lam) {
  const Index4 p = Ix::decode(i, pair_geometry(g), channels_last);
  Index4 q = p;
  q.n = mix_partner(p.n, g.n);
  T* own = images + Ix::offset(p, s);
  T* partner = images + Ix::offset(q, s);
  const float a = Conv::to_float(*own);
  const float b = Conv::to_float(*partner);
  *own = Conv::template from_float<T>(mix_value(a, b, lam[p.n]));
  if (q.n != p.n) {
    *partner = Conv::template from_float<T>(mix_value(b, a, lam[q.n]));
  }
}

template <typename T, typename Ix = Index64>
FP_HD void cutmix_pair_element(int64_t i, T* images, const Strides& s, bool channels_last,
                               const Geometry& g, const int64_t* boxes) {
  const Index4 p = Ix::decode(i, pair_geometry(g), channels_last);
  Index4 q = p;
  q.n = mix_partner(p.n, g.n);
  if (q.n == p.n) {
    return;  // the middle sample's box comes from itself
  }
  const bool into_own = box_contains(boxes + p.n * 4, p.y, p.x);
  const bool into_partner = box_contains(boxes + q.n * 4, q.y, q.x);
  if (!into_own && !into_partner) {
    return;
  }
  T* own = images + Ix::offset(p, s);
  T* partner = images + Ix::offset(q, s);
  const T a = *own;
  const T b = *partner;
  if (into_own) {
    *own = b;
  }
  if (into_partner) {
    *partner = a;
  }
}

}  // namespace fastpipe

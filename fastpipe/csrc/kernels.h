// Per-element math shared by the CPU kernels (g++) and the CUDA kernels (nvcc).
//
// No torch header here: the .cu files include this and must stay torch-free to compile in seconds.
// Every function is a pure function of its arguments, and uses only integer operations and single
// IEEE float operations (no fused multiply-add: setup.py passes -ffp-contract=off to g++ and
// --fmad=false to nvcc), so the CPU kernels, the CUDA kernels and the pure-PyTorch reference in
// fastpipe/ops/_reference.py produce the same bits.
#pragma once

#include <math.h>
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


// ---- resize_crops: the CPU image path's antialiased resize (fastpipe/csrc/image/), per pixel ----
// fastpipe._resize resizes a row at a time with SIMD; these functions compute one output pixel
// of the same resize, to the same bits, so that the CUDA kernel (a thread per pixel), the C++ CPU
// kernel and the PyTorch reference agree with it and with each other. The taps are PIL's and
// torch's (a triangle or Keys' cubic with a = -0.5, stretched by the scale when shrinking), in
// double; the weights as float, then 14-bit fixed point whose sum is exactly 1 << 14. While both
// axes have at most kResizeMaxFixedTaps taps, rows are summed exactly in integers, kept with 6
// fraction bits, and columns summed in integers with one rounding at the end; past that (a shrink
// beyond 8x), columns are summed in float, rows too when they have that many taps.
constexpr int kResizeBilinear = 0;
constexpr int kResizeBicubic = 1;
constexpr int kResizeFractionBits = 14;
constexpr int kResizeRowShift = 8;   // 14 fraction bits of a row sum, 6 kept
constexpr int kResizeOutShift = 20;  // 6 + 14 fraction bits of a column sum
constexpr int kResizeMaxFixedTaps = 17;

FP_HD double resize_support(int filter) {
  return filter == kResizeBicubic ? 2.0 : 1.0;
}

FP_HD double resize_filter(int filter, double x) {
  x = x < 0.0 ? -x : x;
  if (filter == kResizeBicubic) {
    const double a = -0.5;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
  }
  return x < 1.0 ? 1.0 - x : 0.0;
}

// lround of a float (half away from zero), exactly: |v| + 0.5 is exact in double.
FP_HD int32_t resize_round(float v) {
  const double d = v;
  const double r = floor((d < 0.0 ? -d : d) + 0.5);
  return static_cast<int32_t>(d < 0.0 ? -r : r);
}

// The taps of output index i of an axis resized from in_size to out_size: inputs start to
// start + count - 1, weight k = filter((k + start - center + 0.5) * inv_scale) / total; fixed
// holds the 14-bit weights when count <= kResizeMaxFixedTaps (what the integer forms read).
struct ResizeTaps {
  int64_t start, count, max_taps;
  double center, inv_scale, total;
  int filter;
  int32_t fixed[kResizeMaxFixedTaps];
};

FP_HD double resize_raw(const ResizeTaps& t, int64_t k) {
  return resize_filter(t.filter, (static_cast<double>(k + t.start) - t.center + 0.5) * t.inv_scale);
}

FP_HD float resize_weight(const ResizeTaps& t, int64_t k) {
  return static_cast<float>(t.total != 0.0 ? resize_raw(t, k) / t.total : 0.0);
}

// max_taps of an axis: 2 * ceil(support) + 1, support stretched by the scale when shrinking.
FP_HD int64_t resize_max_taps(int64_t in_size, int64_t out_size, int filter) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = resize_support(filter) * (scale >= 1.0 ? scale : 1.0);
  return static_cast<int64_t>(ceil(support)) * 2 + 1;
}

FP_HD ResizeTaps resize_taps(int64_t in_size, int64_t out_size, int64_t i, int filter) {
  ResizeTaps t;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = resize_support(filter) * (scale >= 1.0 ? scale : 1.0);
  t.filter = filter;
  t.inv_scale = scale >= 1.0 ? 1.0 / scale : 1.0;
  t.max_taps = static_cast<int64_t>(ceil(support)) * 2 + 1;
  t.center = scale * (static_cast<double>(i) + 0.5);
  int64_t lo = static_cast<int64_t>(static_cast<int>(t.center - support + 0.5));
  int64_t hi = static_cast<int64_t>(static_cast<int>(t.center + support + 0.5));
  lo = lo < 0 ? 0 : lo;
  hi = hi > in_size ? in_size : hi;
  t.start = lo;
  t.count = hi - lo < t.max_taps ? hi - lo : t.max_taps;
  t.total = 0.0;
  for (int64_t k = 0; k < t.count; ++k) {
    t.total += resize_raw(t, k);
  }
  if (t.count <= kResizeMaxFixedTaps) {
    // Rounded weights, then the largest (the first of equals) takes what the sum misses.
    int32_t sum = 0;
    int64_t largest = 0;
    for (int64_t k = 0; k < t.count; ++k) {
      t.fixed[k] = resize_round(resize_weight(t, k) * static_cast<float>(1 << kResizeFractionBits));
      sum += t.fixed[k];
      largest = t.fixed[k] > t.fixed[largest] ? k : largest;
    }
    if (t.count > 0) {
      t.fixed[largest] += (1 << kResizeFractionBits) - sum;
    }
  }
  return t;
}

// The most taps any output index of the axis has (fastpipe._resize pads every column to it).
FP_HD int64_t resize_longest_count(int64_t in_size, int64_t out_size, int filter) {
  int64_t longest = 1;
  for (int64_t i = 0; i < out_size; ++i) {
    const int64_t count = resize_taps(in_size, out_size, i, filter).count;
    longest = count > longest ? count : longest;
  }
  return longest;
}

// Whether an image resized from in to out takes the integer forms (both axes within
// kResizeMaxFixedTaps taps), as fastpipe._resize decides.
FP_HD bool resize_integer(int64_t in_h, int64_t in_w, int64_t out_h, int64_t out_w, int filter) {
  if (resize_max_taps(in_h, out_h, filter) > kResizeMaxFixedTaps) return false;
  if (resize_max_taps(in_w, out_w, filter) <= kResizeMaxFixedTaps) return true;
  return resize_longest_count(in_w, out_w, filter) <= kResizeMaxFixedTaps;
}

// One image of a resize_crops batch: its pixels (h, w, 3) are read through element strides; they
// are the box (top, left, height, width) of an image of full_height x full_width; the output is
// the box at (out_top, out_left), of the batch's output size, of that image resized to
// resized_height x resized_width, mirrored left-right when flip. A row of resize_crops' table:
// the pixels' address, these 14 values, then 1 where the integer forms apply (resize_integer)
// and 0 where not, then where the image's taps are (resize_taps_layout): kResizeTableColumns
// int64 in all.
struct ResizeImage {
  int64_t stride_y, stride_x, stride_c;
  int64_t top, left, height, width, full_height, full_width;
  int64_t out_top, out_left, resized_height, resized_width, flip;
};
constexpr int kResizeTableColumns = 19;
constexpr int kResizeInteger = 15;      // the table column: 1 where the integer forms apply
constexpr int kResizeWeightsAt = 16;    // the first of the image's weights
constexpr int kResizeRowStride = 17;    // weights per output row (the rows' most taps)
constexpr int kResizeColumnStride = 18; // weights per output column

FP_HD ResizeImage resize_image(const int64_t* row) {
  return ResizeImage{row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                     row[8], row[9], row[10], row[11], row[12], row[13], row[14]};
}

// The taps of a batch, computed once per image and output row or column (resize_crops_taps), then
// read by every pixel of that row or column (resize_crops_element). Entry n * (height + width) + e
// of image n: e < height is output row e (resized row out_top + e), the rest output column
// e - height (resized column out_left + e - height, before the flip). An entry is its first input
// and tap count in `spans` (two int32), and its weights in `weights`: the 14-bit fixed-point
// weights (held in floats, exactly: they are integers far below 2^24) where its sums are integer
// (rows: at most kResizeMaxFixedTaps taps; columns: the integer forms), the float weights where
// they are not. The weights of an image follow each other in the entries' order, each entry
// given its axis' most taps (table columns kResizeWeightsAt to kResizeColumnStride).
struct ResizeSpan {
  int64_t start, count;
  const float* weights;
  bool fixed;
};

// Fills table columns kResizeWeightsAt to kResizeColumnStride of each of the n rows (the other
// columns filled); returns the weights the batch needs. Host code: a prefix sum over the images.
inline int64_t resize_taps_layout(int64_t* table, int64_t n, int64_t height, int64_t width,
                                  int filter) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t* row = table + i * kResizeTableColumns;
    const ResizeImage im = resize_image(row);
    // The axes' most taps (resize_taps' max_taps: the rows' decides whether their sums are
    // integer, as in resize_integer).
    row[kResizeWeightsAt] = total;
    row[kResizeRowStride] = resize_max_taps(im.full_height, im.resized_height, filter);
    row[kResizeColumnStride] = resize_max_taps(im.full_width, im.resized_width, filter);
    total += height * row[kResizeRowStride] + width * row[kResizeColumnStride];
  }
  return total;
}

// Entry i of the batch's taps (see ResizeSpan): the body of the CUDA taps kernel (a thread per
// entry) and of the CPU kernel's first pass.
template <typename Index>
FP_HD void resize_crops_taps(Index i, const int64_t* table, int64_t height, int64_t width,
                             int filter, int32_t* spans, float* weights) {
  const Index per_image = static_cast<Index>(height + width);
  const Index n = i / per_image;
  const int64_t e = static_cast<int64_t>(i % per_image);
  const int64_t* row = table + static_cast<int64_t>(n) * kResizeTableColumns;
  const ResizeImage im = resize_image(row);
  ResizeTaps t;
  bool fixed;
  float* w = weights + row[kResizeWeightsAt];
  if (e < height) {
    t = resize_taps(im.full_height, im.resized_height, im.out_top + e, filter);
    fixed = row[kResizeRowStride] <= kResizeMaxFixedTaps;
    w += e * row[kResizeRowStride];
  } else {
    t = resize_taps(im.full_width, im.resized_width, im.out_left + (e - height), filter);
    fixed = row[kResizeInteger] != 0;
    w += height * row[kResizeRowStride] + (e - height) * row[kResizeColumnStride];
  }
  spans[2 * static_cast<int64_t>(i)] = static_cast<int32_t>(t.start);
  spans[2 * static_cast<int64_t>(i) + 1] = static_cast<int32_t>(t.count);
  for (int64_t k = 0; k < t.count; ++k) {
    w[k] = fixed ? static_cast<float>(t.fixed[k]) : resize_weight(t, k);
  }
}

// Entry e (of resize_crops_taps' numbering, within image n's) as a span.
FP_HD ResizeSpan resize_span(const int64_t* row, const int32_t* spans, const float* weights,
                             int64_t n, int64_t e, int64_t height, int64_t width) {
  const int64_t entry = n * (height + width) + e;
  ResizeSpan s;
  s.start = spans[2 * entry];
  s.count = spans[2 * entry + 1];
  s.weights = weights + row[kResizeWeightsAt];
  if (e < height) {
    s.weights += e * row[kResizeRowStride];
    s.fixed = row[kResizeRowStride] <= kResizeMaxFixedTaps;
  } else {
    s.weights += height * row[kResizeRowStride] + (e - height) * row[kResizeColumnStride];
    s.fixed = row[kResizeInteger] != 0;
  }
  return s;
}

// The int16 row value of one input column and channel: the rows' exact weighted sum, 6
// fraction bits kept, rounded half up (an arithmetic shift: floor).
FP_HD int32_t resize_row_fixed(const uint8_t* pixels, const ResizeImage& im, const ResizeSpan& rows,
                               int64_t column, int64_t channel) {
  const uint8_t* p = pixels + (rows.start - im.top) * im.stride_y + (column - im.left) * im.stride_x +
                     channel * im.stride_c;
  int32_t sum = 0;
  for (int64_t k = 0; k < rows.count; ++k) {
    sum += static_cast<int32_t>(rows.weights[k]) * static_cast<int32_t>(p[k * im.stride_y]);
  }
  return static_cast<int16_t>((sum + (1 << (kResizeRowShift - 1))) >> kResizeRowShift);
}

// The float row value of the float forms: the exact fixed sum scaled, or (more than
// kResizeMaxFixedTaps row taps) float weights summed in order.
FP_HD float resize_row_float(const uint8_t* pixels, const ResizeImage& im, const ResizeSpan& rows,
                             int64_t column, int64_t channel) {
  const uint8_t* p = pixels + (rows.start - im.top) * im.stride_y + (column - im.left) * im.stride_x +
                     channel * im.stride_c;
  if (rows.fixed) {
    int32_t sum = 0;
    for (int64_t k = 0; k < rows.count; ++k) {
      sum += static_cast<int32_t>(rows.weights[k]) * static_cast<int32_t>(p[k * im.stride_y]);
    }
    return static_cast<float>(sum) * (1.0f / static_cast<float>(1 << kResizeFractionBits));
  }
  float value = 0.0f;
  for (int64_t k = 0; k < rows.count; ++k) {
    const float term = rows.weights[k] * static_cast<float>(p[k * im.stride_y]);
    value = k == 0 ? term : value + term;
  }
  return value;
}

// Output pixel (y, x) of one image, its three channels into rgb, from the taps of its line
// (rows) and of the column it shows (cols); integer: the integer forms (cols' weights fixed).
FP_HD void resize_pixel(const uint8_t* pixels, const ResizeImage& im, const ResizeSpan& rows,
                        const ResizeSpan& cols, bool integer, uint8_t rgb[3]) {
  for (int64_t c = 0; c < 3; ++c) {
    int32_t value;
    if (integer) {
      int32_t sum = 1 << (kResizeOutShift - 1);
      for (int64_t k = 0; k < cols.count; ++k) {
        sum += static_cast<int32_t>(cols.weights[k]) *
               resize_row_fixed(pixels, im, rows, cols.start + k, c);
      }
      value = sum >> kResizeOutShift;
    } else {
      float sum = 0.5f;
      for (int64_t k = 0; k < cols.count; ++k) {
        const float term = cols.weights[k] * resize_row_float(pixels, im, rows, cols.start + k, c);
        sum = sum + term;
      }
      sum = sum < 0.0f ? 0.0f : (sum > 255.0f ? 255.0f : sum);
      value = static_cast<int32_t>(sum);
    }
    rgb[c] = static_cast<uint8_t>(value < 0 ? 0 : (value > 255 ? 255 : value));
  }
}

// The column of the output box that output x of a width-out_w box shows (0 to out_w - 1).
FP_HD int64_t resize_column(const ResizeImage& im, int64_t x, int64_t out_w) {
  return im.flip ? out_w - 1 - x : x;
}

// Whether every tap of the output box lies inside the pixels' box (taps' starts and ends only
// grow with the output index, so the box's first and last outputs decide), per axis.
FP_HD bool resize_axis_inside(int64_t full_in, int64_t resized, int64_t first, int64_t count,
                              int64_t lo, int64_t size, int filter) {
  if (count <= 0) return true;
  const ResizeTaps a = resize_taps(full_in, resized, first, filter);
  const ResizeTaps b = resize_taps(full_in, resized, first + count - 1, filter);
  return a.start >= lo && b.start + b.count <= lo + size;
}

// Output pixel i of a resize_crops batch, in (n, y, x) order, from its table row and the batch's
// taps (resize_crops_taps, run before) to the three planes of out ((N, 3, height, width) uint8):
// the body of the CUDA kernel (a thread per pixel) and of the CPU kernel's second pass. Index is
// uint32_t where the batch's pixels fit in 32 bits (32-bit division on the GPU), else int64_t.
template <typename Index>
FP_HD void resize_crops_element(Index i, const int64_t* table, const int32_t* spans,
                                const float* weights, int64_t height, int64_t width,
                                uint8_t* out) {
  const Index plane = static_cast<Index>(height * width), w = static_cast<Index>(width);
  const Index n = i / plane, rest = i % plane;
  const Index y = rest / w, x = rest % w;
  const int64_t* row = table + static_cast<int64_t>(n) * kResizeTableColumns;
  const uint8_t* pixels = reinterpret_cast<const uint8_t*>(row[0]);
  const ResizeImage im = resize_image(row);
  const int64_t image = static_cast<int64_t>(n);
  const ResizeSpan rows = resize_span(row, spans, weights, image, static_cast<int64_t>(y), height,
                                      width);
  const ResizeSpan cols = resize_span(
      row, spans, weights, image, height + resize_column(im, static_cast<int64_t>(x), width),
      height, width);
  uint8_t rgb[3];
  resize_pixel(pixels, im, rows, cols, row[kResizeInteger] != 0, rgb);
  uint8_t* o = out + image * 3 * static_cast<int64_t>(plane) + rest;
  o[0] = rgb[0];
  o[plane] = rgb[1];
  o[2 * static_cast<int64_t>(plane)] = rgb[2];
}

}  // namespace fastpipe

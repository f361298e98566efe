/* The resize kernel of fastpipe._resize (resize.cpp has what it does and why), also compiled
 * into fastpipe._jpeg, whose decode_resize decodes a region and resizes it in one call. No
 * Python: each module has its own copy of everything here. */
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FASTPIPE_RESIZE_AVX2 1
#include <immintrin.h>
#endif

/* The taps themselves (the filters, the weights, their fixed-point form) are kernels.h's, the one
 * definition the GPU's resize_crops computes too. */
#include "../kernels.h"

namespace {

constexpr long kMaxSide = 1L << 24;

/* Taps and weights of one axis: output i reads `count[i]` inputs from `start[i]`, with weights
 * `weights[i * max_taps + k]`, which sum to one, and, where an output has at most
 * fastpipe::kResizeMaxFixedTaps taps, their 14-bit fixed-point form `fixed[i * max_taps + k]`,
 * which sums to exactly 1 << 14. */
struct Taps {
    std::vector<int> start;
    std::vector<int> count;
    std::vector<float> weights;
    std::vector<int16_t> fixed;
    int max_taps = 0;
};

/* The resize filters: PIL's and torch's antialiased bilinear (a triangle, support 1) and bicubic
 * (Keys' cubic with a = -0.5, support 2; PIL's BICUBIC, torch's bicubic with antialias=True). */
enum Filter { kBilinear = fastpipe::kResizeBilinear, kBicubic = fastpipe::kResizeBicubic };

/* The taps of torch's _compute_indices_min_size_weights_aa and PIL's precompute_coeffs for
 * `filter`, align_corners=False, computed in double as both do (fastpipe::resize_taps): the filter
 * stretched by the scale when shrinking, weights normalized to sum to one (bicubic's may be
 * negative). */
Taps filter_taps(int in_size, int out_size, int filter) {
    Taps taps;
    taps.max_taps = static_cast<int>(fastpipe::resize_max_taps(in_size, out_size, filter));
    taps.start.resize(out_size);
    taps.count.resize(out_size);
    const size_t values = static_cast<size_t>(out_size) * taps.max_taps;
    taps.weights.assign(values, 0.0f);
    taps.fixed.assign(values, 0);
    for (int i = 0; i < out_size; ++i) {
        const fastpipe::ResizeTaps t = fastpipe::resize_taps(in_size, out_size, i, filter);
        taps.start[i] = static_cast<int>(t.start);
        taps.count[i] = static_cast<int>(t.count);
        const size_t at = static_cast<size_t>(i) * taps.max_taps;
        for (int k = 0; k < taps.count[i]; ++k) {
            taps.weights[at + k] = fastpipe::resize_weight(t, k);
            if (t.count <= fastpipe::kResizeMaxFixedTaps) {
                taps.fixed[at + k] = static_cast<int16_t>(t.fixed[k]);
            }
        }
    }
    return taps;
}

/* Pads every output's taps with zero weights to the longest count, so that the horizontal pass
 * has one fixed loop length; the padded taps read the zeros around the row buffer. */
void pad_taps(Taps &taps) {
    int longest = 1;
    for (int count : taps.count) longest = std::max(longest, count);
    for (int &count : taps.count) count = longest;
}

typedef float float4 __attribute__((vector_size(16)));
typedef int int4 __attribute__((vector_size(16)));

/* Calls body(std::integral_constant<int, N>) with N = taps for the common tap counts, so loops
 * over taps have a length known at compile time, and with N = 0 (take the count at run time)
 * for the rest. */
template <typename Body>
void with_taps(int taps, Body &&body) {
    switch (taps) {
        case 1: return body(std::integral_constant<int, 1>{});
        case 2: return body(std::integral_constant<int, 2>{});
        case 3: return body(std::integral_constant<int, 3>{});
        case 4: return body(std::integral_constant<int, 4>{});
        case 5: return body(std::integral_constant<int, 5>{});
        case 6: return body(std::integral_constant<int, 6>{});
        case 7: return body(std::integral_constant<int, 7>{});
        case 8: return body(std::integral_constant<int, 8>{});
        case 9: return body(std::integral_constant<int, 9>{});
        default: return body(std::integral_constant<int, 0>{});
    }
}

/* Vertical weights in fixed point (Taps.fixed): 14 fraction bits, each output row's summing to
 * exactly 1 << 14, so that 16-bit multiply-adds can sum two input rows at a time. Rounding the
 * weights moves a sum by up to about 255 * taps * 2**-15 grey levels (less in practice, the errors
 * cancel), so fixed point is used up to kMaxFixedTaps taps (shrinking rows up to ~8x), float
 * weights beyond. */
constexpr int kFractionBits = fastpipe::kResizeFractionBits;
constexpr float kUnit = 1.0f / (1 << kFractionBits);
constexpr int kMaxFixedTaps = fastpipe::kResizeMaxFixedTaps;

/* Weights k and k + 1 as the two 16-bit halves of one 32-bit lane, the operand of a 16-bit
 * multiply-add over input rows k and k + 1 interleaved (k + 1's half is 0 when there is no such
 * row). */
inline int weight_pair(const int16_t *weights, int k, bool pair) {
    const uint32_t packed =
        static_cast<uint16_t>(weights[k]) |
        (pair ? static_cast<uint32_t>(static_cast<uint16_t>(weights[k + 1])) << 16 : 0u);
    return static_cast<int>(packed);
}

/* The weighted sum of one value of the input rows, exact (the scalar form of add_row_sums). */
inline int32_t row_sum(const uint8_t *in, long row_stride, int taps, const int16_t *weights) {
    int32_t sum = 0;
    for (int k = 0; k < taps; ++k) {
        sum += weights[k] * in[k * row_stride];
    }
    return sum;
}

#if defined(__SSE2__)
/* sums[q] += the weighted sums of the input rows' 16 values from `in`: values 4q to 4q + 3 in
 * sums[q], exact 32-bit integers, two input rows per 16-bit multiply-add. */
inline void add_row_sums(const uint8_t *in, long row_stride, int taps, const int16_t *weights,
                         __m128i sums[4]) {
    const __m128i zero = _mm_setzero_si128();
    for (int k = 0; k < taps; k += 2) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + k * row_stride));
        const bool pair = k + 1 < taps;
        const __m128i b = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i *>(
                                     in + (k + 1) * row_stride))
                               : zero;
        const __m128i w = _mm_set1_epi32(weight_pair(weights, k, pair));
        const __m128i low = _mm_unpacklo_epi8(a, b), high = _mm_unpackhi_epi8(a, b);
        sums[0] = _mm_add_epi32(sums[0], _mm_madd_epi16(_mm_unpacklo_epi8(low, zero), w));
        sums[1] = _mm_add_epi32(sums[1], _mm_madd_epi16(_mm_unpackhi_epi8(low, zero), w));
        sums[2] = _mm_add_epi32(sums[2], _mm_madd_epi16(_mm_unpacklo_epi8(high, zero), w));
        sums[3] = _mm_add_epi32(sums[3], _mm_madd_epi16(_mm_unpackhi_epi8(high, zero), w));
    }
}
#endif

/* row[j] = sum_k weights[k] * in[k * row_stride + j] / 2**14 over the `values` bytes of the
 * input rows one output row needs: integer sums, so exact for the fixed-point weights, and the
 * same on every machine. With SSE2 (every x86-64) two input rows at a time go through one 16-bit
 * multiply-add per 4 values: about 2.4x fewer instructions than converting each byte to float for
 * each tap. */
void vertical_pass_fixed(const uint8_t *__restrict__ in, long row_stride, int taps,
                         const int16_t *__restrict__ weights, long values, float *__restrict__ row) {
    long j = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (; j + 16 <= values; j += 16) {
        __m128i sums[4] = {zero, zero, zero, zero};
        add_row_sums(in + j, row_stride, taps, weights, sums);
        const __m128 unit = _mm_set1_ps(kUnit);
        for (int q = 0; q < 4; ++q) {
            _mm_storeu_ps(row + j + 4 * q, _mm_mul_ps(_mm_cvtepi32_ps(sums[q]), unit));
        }
    }
#endif
    for (; j < values; ++j) {
        row[j] = static_cast<float>(row_sum(in + j, row_stride, taps, weights)) * kUnit;
    }
}

/* The same with float weights, one input row at a time (contiguous, so each loop vectorizes). */
void vertical_pass_float(const uint8_t *__restrict__ in, long row_stride, int taps,
                         const float *__restrict__ weights, long values, float *__restrict__ row) {
    for (long j = 0; j < values; ++j) {
        row[j] = weights[0] * in[j];
    }
    for (int k = 1; k < taps; ++k) {
        const uint8_t *line = in + k * row_stride;
        const float w = weights[k];
        for (long j = 0; j < values; ++j) {
            row[j] += w * line[j];
        }
    }
}

/* One output row from the vertically filtered input row: RGB of each output pixel as one 4-float
 * vector (the 4th lane reads the next pixel's red, or the row's padding, and is ignored), rounded
 * half up to one int4 per pixel, mirrored when flipping. Bilinear weights are non-negative and sum
 * to one, so its sums stay within 0-255; bicubic's negative lobes overshoot at edges, so sums are
 * clamped to 0-255 (as PIL's clip8 does). */
template <int TAPS>
void horizontal_pass(const float *row, const int *offsets, int taps, const float4 *weights,
                     long out_width, bool flip, int4 *pixels) {
    const int count = TAPS > 0 ? TAPS : taps;
    const float4 half = {0.5f, 0.5f, 0.5f, 0.5f};
    const float4 lowest = {0.0f, 0.0f, 0.0f, 0.0f};
    const float4 highest = {255.0f, 255.0f, 255.0f, 255.0f};
    for (long x = 0; x < out_width; ++x) {
        const float4 *w = weights + x * count;
        const float *pixel = row + offsets[x];
        float4 sum = half;
        for (int k = 0; k < count; ++k) {
            float4 rgb;
            std::memcpy(&rgb, pixel + 3 * k, sizeof rgb);
            sum += w[k] * rgb;
        }
        sum = sum < lowest ? lowest : sum;
        sum = sum > highest ? highest : sum;
        pixels[flip ? out_width - 1 - x : x] = __builtin_convertvector(sum, int4);
    }
}

/* The RGB lanes of one row of int4 pixels into the three planes, clamped to 0-255. With SSE2, 16
 * pixels at a time are packed to bytes (the saturating packs clamp) and transposed with unpacks,
 * instead of three single-byte stores per pixel. */
void planes_from_pixels(const int4 *pixels, long width, uint8_t *red, uint8_t *green, uint8_t *blue) {
    long x = 0;
#if defined(__SSE2__)
    for (; x + 16 <= width; x += 16) {
        __m128i rgbx[4];  // 4 pixels each, as bytes r g b x
        for (int q = 0; q < 4; ++q) {
            const __m128i *p = reinterpret_cast<const __m128i *>(pixels + x + 4 * q);
            const __m128i low = _mm_packs_epi32(_mm_loadu_si128(p), _mm_loadu_si128(p + 1));
            const __m128i high = _mm_packs_epi32(_mm_loadu_si128(p + 2), _mm_loadu_si128(p + 3));
            rgbx[q] = _mm_packus_epi16(low, high);
        }
        const __m128i t0 = _mm_unpacklo_epi8(rgbx[0], rgbx[1]), t1 = _mm_unpackhi_epi8(rgbx[0], rgbx[1]);
        const __m128i t2 = _mm_unpacklo_epi8(rgbx[2], rgbx[3]), t3 = _mm_unpackhi_epi8(rgbx[2], rgbx[3]);
        const __m128i u0 = _mm_unpacklo_epi8(t0, t1), u1 = _mm_unpackhi_epi8(t0, t1);
        const __m128i u2 = _mm_unpacklo_epi8(t2, t3), u3 = _mm_unpackhi_epi8(t2, t3);
        const __m128i rg_low = _mm_unpacklo_epi8(u0, u1), bx_low = _mm_unpackhi_epi8(u0, u1);
        const __m128i rg_high = _mm_unpacklo_epi8(u2, u3), bx_high = _mm_unpackhi_epi8(u2, u3);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(red + x), _mm_unpacklo_epi64(rg_low, rg_high));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(green + x), _mm_unpackhi_epi64(rg_low, rg_high));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(blue + x), _mm_unpacklo_epi64(bx_low, bx_high));
    }
#endif
    const auto byte = [](int value) { return static_cast<uint8_t>(std::clamp(value, 0, 255)); };
    for (; x < width; ++x) {
        red[x] = byte(pixels[x][0]);
        green[x] = byte(pixels[x][1]);
        blue[x] = byte(pixels[x][2]);
    }
}

/* The integer forms, used while both axes have at most kMaxFixedTaps taps (every train crop
 * and eval resize short of an 8x shrink): the vertical pass rounds its exact sums to int16 with
 * kRowBits fraction bits, and the horizontal pass sums those with the 14-bit column weights in
 * int32, rounding half up once at the end. Integer sums do not depend on their order, so the
 * scalar, SSE2 and AVX2 forms give the same bytes. Bicubic rows overshoot 0-255 by at most about
 * 15%, which 6 fraction bits keep within int16; the rounding of the row moves an output by at
 * most 2**-7 grey levels times the column weights' absolute sum. */
constexpr int kRowBits = 6;
constexpr int kRowShift = kFractionBits - kRowBits;
constexpr int kOutShift = kRowBits + kFractionBits;

inline int16_t row_value(int32_t sum) {
    return static_cast<int16_t>((sum + (1 << (kRowShift - 1))) >> kRowShift);
}

/* vertical_pass_fixed into an int16 row. The last step of each SIMD loop overlaps the one before
 * it instead of leaving a scalar tail: it recomputes a few values, to the same bytes. */
void vertical_pass_int16(const uint8_t *__restrict__ in, long row_stride, int taps,
                         const int16_t *__restrict__ weights, long values, int16_t *__restrict__ row) {
#if defined(__SSE2__)
    if (values >= 16) {
        const __m128i round = _mm_set1_epi32(1 << (kRowShift - 1));
        for (long step = 0; step < values; step += 16) {
            const long j = std::min(step, values - 16);
            __m128i sums[4] = {round, round, round, round};
            add_row_sums(in + j, row_stride, taps, weights, sums);
            for (int q = 0; q < 4; ++q) {
                sums[q] = _mm_srai_epi32(sums[q], kRowShift);
            }
            _mm_storeu_si128(reinterpret_cast<__m128i *>(row + j), _mm_packs_epi32(sums[0], sums[1]));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(row + j + 8), _mm_packs_epi32(sums[2], sums[3]));
        }
        return;
    }
#endif
    for (long j = 0; j < values; ++j) {
        row[j] = row_value(row_sum(in + j, row_stride, taps, weights));
    }
}

/* One output row from the int16 row: `weights` holds 2 * pairs column weights per output pixel
 * (zeros past its taps); each RGB sum rounded half up to one int4 per pixel (clamped to 0-255 by
 * planes_from_pixels), mirrored when flipping. */
template <int PAIRS>
void horizontal_pass_int(const int16_t *row, const int *offsets, int pairs, const int16_t *weights,
                         long out_width, bool flip, int4 *pixels) {
    const int count = 2 * (PAIRS > 0 ? PAIRS : pairs);
    for (long x = 0; x < out_width; ++x) {
        const int16_t *pixel = row + offsets[x];
        const int16_t *w = weights + x * count;
        int32_t r = 1 << (kOutShift - 1), g = r, b = r;
        for (int k = 0; k < count; ++k) {
            r += w[k] * pixel[3 * k];
            g += w[k] * pixel[3 * k + 1];
            b += w[k] * pixel[3 * k + 2];
        }
        pixels[flip ? out_width - 1 - x : x] = int4{r >> kOutShift, g >> kOutShift, b >> kOutShift, 0};
    }
}

#if defined(FASTPIPE_RESIZE_AVX2)
/* AVX2 forms of the two passes, chosen at run time on CPUs that have it (every x86-64 since
 * 2013-2015); compiled for AVX2 only here, so the module still loads on any x86-64. They compute
 * exactly what the SSE2 forms do, lane for lane (integer sums; float products and sums in the
 * same order, no fused multiply-add), so the output does not depend on the CPU: the tests compare
 * the two forms byte for byte. */

/* add_row_sums, 32 values per step. The 8-bit unpacks work within each 128-bit half, so the
 * four sums hold values [0-3 | 16-19], [4-7 | 20-23], [8-11 | 24-27], [12-15 | 28-31]. */
__attribute__((target("avx2"), always_inline))
inline void add_row_sums_avx2(const uint8_t *in, long row_stride, int taps, const int16_t *weights,
                              __m256i sums[4]) {
    const __m256i zero = _mm256_setzero_si256();
    for (int k = 0; k < taps; k += 2) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(in + k * row_stride));
        const bool pair = k + 1 < taps;
        const __m256i b = pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i *>(
                                     in + (k + 1) * row_stride))
                               : zero;
        const __m256i w = _mm256_set1_epi32(weight_pair(weights, k, pair));
        const __m256i low = _mm256_unpacklo_epi8(a, b), high = _mm256_unpackhi_epi8(a, b);
        sums[0] = _mm256_add_epi32(sums[0], _mm256_madd_epi16(_mm256_unpacklo_epi8(low, zero), w));
        sums[1] = _mm256_add_epi32(sums[1], _mm256_madd_epi16(_mm256_unpackhi_epi8(low, zero), w));
        sums[2] = _mm256_add_epi32(sums[2], _mm256_madd_epi16(_mm256_unpacklo_epi8(high, zero), w));
        sums[3] = _mm256_add_epi32(sums[3], _mm256_madd_epi16(_mm256_unpackhi_epi8(high, zero), w));
    }
}

/* vertical_pass_fixed, 32 values per step; add_row_sums_avx2's sums are put back in order when
 * stored. */
__attribute__((target("avx2")))
void vertical_pass_fixed_avx2(const uint8_t *__restrict__ in, long row_stride, int taps,
                              const int16_t *__restrict__ weights, long values,
                              float *__restrict__ row) {
    long j = 0;
    const __m256i zero = _mm256_setzero_si256();
    const __m256 unit = _mm256_set1_ps(kUnit);
    for (; j + 32 <= values; j += 32) {
        __m256i sums[4] = {zero, zero, zero, zero};
        add_row_sums_avx2(in + j, row_stride, taps, weights, sums);
        __m256 f[4];
        for (int q = 0; q < 4; ++q) {
            f[q] = _mm256_mul_ps(_mm256_cvtepi32_ps(sums[q]), unit);
        }
        _mm256_storeu_ps(row + j, _mm256_permute2f128_ps(f[0], f[1], 0x20));
        _mm256_storeu_ps(row + j + 8, _mm256_permute2f128_ps(f[2], f[3], 0x20));
        _mm256_storeu_ps(row + j + 16, _mm256_permute2f128_ps(f[0], f[1], 0x31));
        _mm256_storeu_ps(row + j + 24, _mm256_permute2f128_ps(f[2], f[3], 0x31));
    }
    if (j < values) {
        vertical_pass_fixed(in + j, row_stride, taps, weights, values - j, row + j);
    }
}

/* horizontal_pass, two output pixels per step: `pair_weights` holds, for pixels 2p and 2p + 1
 * and tap k, their two float4 weights side by side (8 floats), so one load serves both. */
template <int TAPS>
__attribute__((target("avx2")))
void horizontal_pass_avx2(const float *row, const int *offsets, int taps,
                          const float4 *pair_weights, long out_width, bool flip, int4 *pixels) {
    const int count = TAPS > 0 ? TAPS : taps;
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 lowest = _mm256_setzero_ps();
    const __m256 highest = _mm256_set1_ps(255.0f);
    for (long x = 0; x < out_width; x += 2) {
        const bool second = x + 1 < out_width;
        const float *p0 = row + offsets[x];
        const float *p1 = row + offsets[second ? x + 1 : x];
        const float *w = reinterpret_cast<const float *>(pair_weights + x * count);
        __m256 sum = half;
        for (int k = 0; k < count; ++k) {
            const __m256 rgb = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p0 + 3 * k)),
                                                    _mm_loadu_ps(p1 + 3 * k), 1);
            sum = _mm256_add_ps(sum, _mm256_mul_ps(_mm256_loadu_ps(w + 8 * k), rgb));
        }
        sum = _mm256_min_ps(_mm256_max_ps(sum, lowest), highest);
        const __m256i ints = _mm256_cvttps_epi32(sum);
        int4 first, next;
        _mm_storeu_si128(reinterpret_cast<__m128i *>(&first), _mm256_castsi256_si128(ints));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(&next), _mm256_extracti128_si256(ints, 1));
        pixels[flip ? out_width - 1 - x : x] = first;
        if (second) {
            pixels[flip ? out_width - 2 - x : x + 1] = next;
        }
    }
}

/* vertical_pass_int16, 32 values per step (add_row_sums_avx2 leaves the sums in the order
 * [0-3 | 16-19], [4-7 | 20-23], ...: packing the first two gives [0-7 | 16-23]). */
__attribute__((target("avx2")))
void vertical_pass_int16_avx2(const uint8_t *__restrict__ in, long row_stride, int taps,
                              const int16_t *__restrict__ weights, long values,
                              int16_t *__restrict__ row) {
    if (values < 32) {
        vertical_pass_int16(in, row_stride, taps, weights, values, row);
        return;
    }
    const __m256i round = _mm256_set1_epi32(1 << (kRowShift - 1));
    for (long step = 0; step < values; step += 32) {
        const long j = std::min(step, values - 32);
        __m256i sums[4] = {round, round, round, round};
        add_row_sums_avx2(in + j, row_stride, taps, weights, sums);
        for (int q = 0; q < 4; ++q) {
            sums[q] = _mm256_srai_epi32(sums[q], kRowShift);
        }
        const __m256i first = _mm256_packs_epi32(sums[0], sums[1]);   // [0-7 | 16-23]
        const __m256i second = _mm256_packs_epi32(sums[2], sums[3]);  // [8-15 | 24-31]
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(row + j),
                            _mm256_permute2x128_si256(first, second, 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(row + j + 16),
                            _mm256_permute2x128_si256(first, second, 0x31));
    }
}

/* horizontal_pass_int, two output pixels per step: a pair of taps of one pixel is one 16-byte
 * load (its two RGB pixels), shuffled to R R G G B B 0 0 and summed by one 16-bit multiply-add
 * with w w w w w w 0 0. `pair_weights` holds, per step and pair of taps, the 8 weights of pixel
 * 2p then those of 2p + 1. */
template <int PAIRS>
__attribute__((target("avx2")))
void horizontal_pass_int_avx2(const int16_t *row, const int *offsets, int pairs,
                              const int16_t *pair_weights, long out_width, bool flip, int4 *pixels) {
    const int count = PAIRS > 0 ? PAIRS : pairs;
    const __m256i order = _mm256_setr_epi8(0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -128, -128, -128, -128,
                                           0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11, -128, -128, -128, -128);
    const __m256i round = _mm256_set1_epi32(1 << (kOutShift - 1));
    const __m256i *weights = reinterpret_cast<const __m256i *>(pair_weights);
    for (long x = 0; x < out_width; x += 2) {
        const bool second = x + 1 < out_width;
        const int16_t *p0 = row + offsets[x];
        const int16_t *p1 = row + offsets[second ? x + 1 : x];
        const __m256i *w = weights + (x / 2) * count;
        __m256i sum = round;
        for (int p = 0; p < count; ++p) {
            const __m256i both = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p0 + 6 * p))),
                _mm_loadu_si128(reinterpret_cast<const __m128i *>(p1 + 6 * p)), 1);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_shuffle_epi8(both, order),
                                                          _mm256_loadu_si256(w + p)));
        }
        const __m256i ints = _mm256_srai_epi32(sum, kOutShift);
        int4 first, next;
        _mm_storeu_si128(reinterpret_cast<__m128i *>(&first), _mm256_castsi256_si128(ints));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(&next), _mm256_extracti128_si256(ints, 1));
        pixels[flip ? out_width - 1 - x : x] = first;
        if (second) {
            pixels[flip ? out_width - 2 - x : x + 1] = next;
        }
    }
}

bool cpu_has_avx2() {
    static const bool has = __builtin_cpu_supports("avx2");
    return has;
}
#endif

/* Which form of the passes runs: AVX2 where the CPU has it, unless a test asks for SSE2. */
bool use_avx2 = true;

bool avx2_active() {
#if defined(FASTPIPE_RESIZE_AVX2)
    return use_avx2 && cpu_has_avx2();
#else
    return false;
#endif
}

/* A rectangle of an image: `height` x `width` pixels at (top, left) of a `full_height` x
 * `full_width` image. */
struct Box {
    long top, left, height, width, full_height, full_width;
};

struct ResizeJob {
    const uint8_t *src;  // the source box's top-left pixel
    long row_stride;     // bytes
    Box source;          // what src holds, within the decoded image
    uint8_t *out;        // (3, output.height, output.width), contiguous
    Box output;          // the part wanted of the decoded image resized to full_height x full_width
    bool flip;
    int filter;          // kBilinear or kBicubic
};

/* Whether every tap of the output box's rows and columns lies inside the source box. */
bool taps_inside(const Taps &rows, const Taps &cols, const Box &in, const Box &out) {
    const auto inside = [](const Taps &taps, long first, long count, long lo, long size) {
        for (long i = first; i < first + count; ++i) {
            if (taps.start[i] < lo || taps.start[i] + taps.count[i] > lo + size) return false;
        }
        return true;
    };
    return inside(rows, out.top, out.height, in.top, in.height) &&
           inside(cols, out.left, out.width, in.left, in.width);
}

/* resize_rgb_to_planes with integer rows and columns (the integer forms above). */
void resize_integer(const ResizeJob &job, const Taps &rows, const Taps &cols, int col_taps) {
    const Box &in = job.source, &out = job.output;
    const std::vector<int16_t> &row_weights = rows.fixed, &col_fixed = cols.fixed;
    const int pairs = (col_taps + 1) / 2;
    // Zeros on both sides of the row: padded taps, and the loads' last 2 values, reach past it.
    const long margin = 6L * pairs + 8;
    const bool avx2 = avx2_active();
    std::vector<int> offsets(out.width);
    // Scalar: 2 * pairs weights per pixel. AVX2: per step of two pixels and pair of taps, pixel
    // 2p's w w w w w w 0 0 then 2p + 1's (zeros for a missing last pixel).
    std::vector<int16_t> weights(avx2 ? static_cast<size_t>((out.width + 1) / 2) * pairs * 16
                                      : static_cast<size_t>(out.width) * pairs * 2, 0);
    for (long x = 0; x < out.width; ++x) {
        const long column = out.left + x;
        offsets[x] = static_cast<int>(margin + (cols.start[column] - in.left) * 3);
        for (int k = 0; k < col_taps; ++k) {
            const int16_t w = col_fixed[static_cast<size_t>(column) * cols.max_taps + k];
            if (avx2) {
                int16_t *lane = &weights[(((x / 2) * pairs + k / 2) * 2 + (x & 1)) * 8];
                for (int c = 0; c < 3; ++c) lane[2 * c + (k & 1)] = w;
            } else {
                weights[static_cast<size_t>(x) * pairs * 2 + k] = w;
            }
        }
    }
    const long values = in.width * 3;
    std::vector<int16_t> padded_row(margin + values + margin, 0);
    std::vector<int4> pixels(out.width);
    const long plane = out.height * out.width;
    with_taps(pairs, [&](auto pairs_constant) {
        constexpr int kPairs = decltype(pairs_constant)::value;
        for (long y = 0; y < out.height; ++y) {
            const long line = out.top + y;
            const uint8_t *first = job.src + (rows.start[line] - in.top) * job.row_stride;
            const int16_t *line_weights = &row_weights[static_cast<size_t>(line) * rows.max_taps];
            int16_t *filtered = padded_row.data() + margin;
#if defined(FASTPIPE_RESIZE_AVX2)
            if (avx2) {
                vertical_pass_int16_avx2(first, job.row_stride, rows.count[line], line_weights,
                                         values, filtered);
                horizontal_pass_int_avx2<kPairs>(padded_row.data(), offsets.data(), pairs,
                                                 weights.data(), out.width, job.flip, pixels.data());
            } else
#endif
            {
                vertical_pass_int16(first, job.row_stride, rows.count[line], line_weights, values,
                                    filtered);
                horizontal_pass_int<kPairs>(padded_row.data(), offsets.data(), pairs,
                                            weights.data(), out.width, job.flip, pixels.data());
            }
            uint8_t *red = job.out + y * out.width;
            planes_from_pixels(pixels.data(), out.width, red, red + plane, red + 2 * plane);
        }
    });
}

/* resize_rgb_to_planes with float columns, for shrinks past kMaxFixedTaps taps on either axis
 * (rows then in float too where they have that many taps). */
void resize_float(const ResizeJob &job, const Taps &rows, const Taps &cols, int col_taps) {
    const Box &in = job.source, &out = job.output;
    const bool fixed = rows.max_taps <= kMaxFixedTaps;
    const std::vector<int16_t> &fixed_weights = rows.fixed;
    // Zeros on both sides of the row: padded taps may reach past the source box.
    const long margin = 3L * col_taps + 1;
    std::vector<int> offsets(out.width);
    std::vector<float4> col_weights(static_cast<size_t>(out.width) * col_taps);
    for (long x = 0; x < out.width; ++x) {
        const long column = out.left + x;
        offsets[x] = static_cast<int>(margin + (cols.start[column] - in.left) * 3);
        for (int k = 0; k < col_taps; ++k) {
            const float w = cols.weights[static_cast<size_t>(column) * cols.max_taps + k];
            col_weights[x * col_taps + k] = float4{w, w, w, w};
        }
    }
    const long values = in.width * 3;
    std::vector<float> padded_row(margin + values + margin, 0.0f);
    std::vector<int4> pixels(out.width);
    const long plane = out.height * out.width;
    const bool avx2 = avx2_active();
    // Pixels 2p and 2p + 1 side by side per tap (zero weights for a missing last one).
    std::vector<float4> pair_weights;
    if (avx2) {
        pair_weights.assign(static_cast<size_t>(out.width + 1) * col_taps, float4{0, 0, 0, 0});
        for (long x = 0; x < out.width; ++x) {
            for (int k = 0; k < col_taps; ++k) {
                pair_weights[(x & ~1L) * col_taps + 2 * k + (x & 1)] = col_weights[x * col_taps + k];
            }
        }
    }
    with_taps(col_taps, [&](auto col_taps_constant) {
        constexpr int kTaps = decltype(col_taps_constant)::value;
        for (long y = 0; y < out.height; ++y) {
            const long line = out.top + y;
            const uint8_t *first = job.src + (rows.start[line] - in.top) * job.row_stride;
            const size_t at = static_cast<size_t>(line) * rows.max_taps;
            float *filtered = padded_row.data() + margin;
            if (fixed) {
#if defined(FASTPIPE_RESIZE_AVX2)
                if (avx2) {
                    vertical_pass_fixed_avx2(first, job.row_stride, rows.count[line],
                                             &fixed_weights[at], values, filtered);
                } else
#endif
                vertical_pass_fixed(first, job.row_stride, rows.count[line], &fixed_weights[at],
                                    values, filtered);
            } else {
                vertical_pass_float(first, job.row_stride, rows.count[line], &rows.weights[at],
                                    values, filtered);
            }
#if defined(FASTPIPE_RESIZE_AVX2)
            if (avx2) {
                horizontal_pass_avx2<kTaps>(padded_row.data(), offsets.data(), col_taps,
                                            pair_weights.data(), out.width, job.flip,
                                            pixels.data());
            } else
#endif
            horizontal_pass<kTaps>(padded_row.data(), offsets.data(), col_taps,
                                   col_weights.data(), out.width, job.flip, pixels.data());
            uint8_t *red = job.out + y * out.width;
            planes_from_pixels(pixels.data(), out.width, red, red + plane, red + 2 * plane);
        }
    });
}

/* The output box of the image resized from the source's full size, read from the source box, or
 * false when the source box lacks a pixel the output reads. The taps are those of the whole
 * resize, so the output equals the same box of the whole image resized, whatever part of the
 * image the source holds. */
bool resize_rgb_to_planes(const ResizeJob &job) {
    const Box &in = job.source, &out = job.output;
    const Taps rows = filter_taps(static_cast<int>(in.full_height),
                                  static_cast<int>(out.full_height), job.filter);
    Taps cols = filter_taps(static_cast<int>(in.full_width), static_cast<int>(out.full_width),
                            job.filter);
    if (!taps_inside(rows, cols, in, out)) {
        return false;
    }
    pad_taps(cols);
    const int col_taps = cols.count[0];
    if (rows.max_taps <= kMaxFixedTaps && col_taps <= kMaxFixedTaps) {
        resize_integer(job, rows, cols, col_taps);
    } else {
        resize_float(job, rows, cols, col_taps);
    }
    return true;
}

}  // namespace

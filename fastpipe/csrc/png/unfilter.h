/* PNG row filters undone in place (PNG specification, section 9): one function per filter type,
 * SSE2 for 3- and 4-byte pixels (8-bit RGB and RGBA, where the scalar Paeth dominates a decode),
 * a scalar form for every pixel size and for machines without SSE2. Both forms give the same
 * bytes: each output byte is a fixed function of bytes already reconstructed.
 *
 * `row` holds one row's filtered bytes (without the filter-type byte), `prev` the row above,
 * reconstructed (all zeros above the first row of an image), `n` the row's bytes, `bpp` the bytes
 * per complete pixel (1 for sub-byte depths), as the specification's "a", "b", "c" need them.
 * One byte after each of `row` and `prev` must be readable (Paeth loads 3-byte pixels as 4).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fastpipe::png {

enum Filter : uint8_t { kNone = 0, kSub = 1, kUp = 2, kAverage = 3, kPaeth = 4 };

// The predictor among a (left), b (above), c (above-left) nearest to a + b - c, ties to a then b.
inline uint8_t paeth_predictor(int a, int b, int c) {
    int p = b - c;   // p - a
    int q = a - c;   // p - b
    int pa = p < 0 ? -p : p;
    int pb = q < 0 ? -q : q;
    int pc = p + q < 0 ? -(p + q) : p + q;
    if (pb < pa) {
        pa = pb;
        a = b;
    }
    return static_cast<uint8_t>(pc < pa ? c : a);
}

inline void unfilter_sub_scalar(uint8_t *row, size_t n, size_t bpp) {
    for (size_t i = bpp; i < n; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + row[i - bpp]);
    }
}

inline void unfilter_up(uint8_t *row, const uint8_t *prev, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + prev[i]);
    }
}

inline void unfilter_average_scalar(uint8_t *row, const uint8_t *prev, size_t n, size_t bpp) {
    const size_t first = bpp < n ? bpp : n;
    for (size_t i = 0; i < first; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + (prev[i] >> 1));
    }
    for (size_t i = bpp; i < n; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + ((row[i - bpp] + prev[i]) >> 1));
    }
}

inline void unfilter_paeth_scalar(uint8_t *row, const uint8_t *prev, size_t n, size_t bpp) {
    const size_t first = bpp < n ? bpp : n;
    for (size_t i = 0; i < first; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + prev[i]);  // a = c = 0: the predictor is b
    }
    for (size_t i = bpp; i < n; ++i) {
        row[i] = static_cast<uint8_t>(row[i] + paeth_predictor(row[i - bpp], prev[i],
                                                                prev[i - bpp]));
    }
}

#if defined(__SSE2__)
namespace sse2 {

// One pixel of BPP (3 or 4) bytes in the low lanes of a register, without touching the bytes
// after it. Three bytes are assembled in a register: a 3-byte copy through memory would stall
// the 4-byte load after it (no store forwarding from two partial stores).
template <size_t BPP>
inline __m128i load(const uint8_t *p) {
    uint32_t v;
    if constexpr (BPP == 4) {
        std::memcpy(&v, p, 4);
    } else {
        v = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16);
    }
    return _mm_cvtsi32_si128(static_cast<int>(v));
}

template <size_t BPP>
inline void store(uint8_t *p, __m128i v) {
    const uint32_t bits = static_cast<uint32_t>(_mm_cvtsi128_si32(v));
    if constexpr (BPP == 4) {
        std::memcpy(p, &bits, 4);
    } else {
        p[0] = static_cast<uint8_t>(bits);
        p[1] = static_cast<uint8_t>(bits >> 8);
        p[2] = static_cast<uint8_t>(bits >> 16);
    }
}

template <size_t bpp>
inline void sub(uint8_t *row, size_t n) {
    __m128i a = _mm_setzero_si128();
    for (size_t i = 0; i + bpp <= n; i += bpp) {
        a = _mm_add_epi8(a, load<bpp>(row + i));
        store<bpp>(row + i, a);
    }
}

template <size_t bpp>
inline void average(uint8_t *row, const uint8_t *prev, size_t n) {
    const __m128i one = _mm_set1_epi8(1);
    __m128i a = _mm_setzero_si128();
    for (size_t i = 0; i + bpp <= n; i += bpp) {
        const __m128i b = load<bpp>(prev + i);
        // floor((a + b) / 2): the rounded-up byte average minus the carry of an odd sum.
        __m128i avg = _mm_avg_epu8(a, b);
        avg = _mm_sub_epi8(avg, _mm_and_si128(_mm_xor_si128(a, b), one));
        a = _mm_add_epi8(load<bpp>(row + i), avg);
        store<bpp>(row + i, a);
    }
}

inline __m128i abs16(__m128i x) { return _mm_max_epi16(x, _mm_sub_epi16(_mm_setzero_si128(), x)); }

inline __m128i select(__m128i mask, __m128i yes, __m128i no) {
    return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no));
}

// Paeth's pixel from its filtered bytes `x` and the pixels above (`b`), to the left (`a`) and
// above-left (`c`), each in 16-bit lanes; the result is in 16-bit lanes too.
inline __m128i paeth_pixel(__m128i x, __m128i a, __m128i b, __m128i c) {
    const __m128i p = _mm_sub_epi16(b, c);  // p - a
    const __m128i q = _mm_sub_epi16(a, c);  // p - b
    const __m128i pa = abs16(p), pb = abs16(q), pc = abs16(_mm_add_epi16(p, q));
    const __m128i least = _mm_min_epi16(pc, _mm_min_epi16(pa, pb));
    const __m128i nearest = select(_mm_cmpeq_epi16(pa, least), a,
                                   select(_mm_cmpeq_epi16(pb, least), b, c));
    // Byte-wise add in 16-bit lanes: the high bytes stay 0, so the lanes stay 0-255.
    return _mm_add_epi8(x, nearest);
}

// A pixel in 16-bit lanes, loaded as 4 bytes also when it has 3 (the caller leaves a readable
// byte after each row): the 4th lane then holds a byte of the next pixel, which the 3-byte
// stores never write. Nothing loaded overlaps the last pixel's store, so no load waits for it.
template <size_t bpp>
inline __m128i widen(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return _mm_unpacklo_epi8(_mm_cvtsi32_si128(static_cast<int>(v)), _mm_setzero_si128());
}

template <size_t bpp>
inline void store_pixel(uint8_t *p, __m128i lanes) {
    const uint32_t bits = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_packus_epi16(lanes, lanes)));
    if constexpr (bpp == 4) {
        std::memcpy(p, &bits, 4);
    } else {
        const uint16_t low = static_cast<uint16_t>(bits);
        std::memcpy(p, &low, 2);
        p[2] = static_cast<uint8_t>(bits >> 16);
    }
}

template <size_t bpp>
inline void paeth(uint8_t *row, const uint8_t *prev, size_t n) {
    __m128i a = _mm_setzero_si128(), c = a;
    for (size_t i = 0; i + bpp <= n; i += bpp) {
        const __m128i b = widen<bpp>(prev + i);
        a = paeth_pixel(widen<bpp>(row + i), a, b, c);
        store_pixel<bpp>(row + i, a);
        c = b;
    }
}

// Two Paeth rows, `first` below `prev` and `second` below `first`. Each pixel waits for the one
// to its left, so a row is a chain of dependent steps; `second` runs one pixel behind `first`, so
// the two chains overlap in the processor, and takes the pixels above it from `first`'s
// registers (a load of bytes just stored in two parts would wait for the stores).
template <size_t bpp>
inline void paeth2(uint8_t *first, uint8_t *second, const uint8_t *prev, size_t n) {
    const size_t pixels = n / bpp;
    if (pixels == 0) {
        return;
    }
    __m128i a0 = _mm_setzero_si128(), c0 = a0, a1 = a0, c1 = a0;
    __m128i b0 = widen<bpp>(prev);
    a0 = paeth_pixel(widen<bpp>(first), a0, b0, c0);
    store_pixel<bpp>(first, a0);
    c0 = b0;
    for (size_t k = 1; k < pixels; ++k) {
        b0 = widen<bpp>(prev + k * bpp);
        const __m128i above = a0;  // first's pixel k - 1, above second's pixel k - 1
        a0 = paeth_pixel(widen<bpp>(first + k * bpp), a0, b0, c0);
        store_pixel<bpp>(first + k * bpp, a0);
        c0 = b0;
        a1 = paeth_pixel(widen<bpp>(second + (k - 1) * bpp), a1, above, c1);
        store_pixel<bpp>(second + (k - 1) * bpp, a1);
        c1 = above;
    }
    a1 = paeth_pixel(widen<bpp>(second + (pixels - 1) * bpp), a1, a0, c1);
    store_pixel<bpp>(second + (pixels - 1) * bpp, a1);
}

}  // namespace sse2
#endif

// Whether two Paeth rows of `bpp`-byte pixels are undone together (unfilter_paeth2).
inline bool paeth_pairs(size_t bpp) {
#if defined(__SSE2__)
    return bpp == 3 || bpp == 4;
#else
    (void)bpp;
    return false;
#endif
}

// Undoes Paeth on `first` (below `prev`) and `second` (below `first`); bpp as paeth_pairs allows.
inline void unfilter_paeth2(uint8_t *first, uint8_t *second, const uint8_t *prev, size_t n,
                            size_t bpp) {
#if defined(__SSE2__)
    bpp == 3 ? sse2::paeth2<3>(first, second, prev, n) : sse2::paeth2<4>(first, second, prev, n);
#else
    unfilter_paeth_scalar(first, prev, n, bpp);
    unfilter_paeth_scalar(second, first, n, bpp);
#endif
}

// Undoes filter `type` on `row`; false for a type the specification does not define.
inline bool unfilter(uint8_t type, uint8_t *row, const uint8_t *prev, size_t n, size_t bpp) {
#if defined(__SSE2__)
    const bool simd = bpp == 3 || bpp == 4;
#else
    const bool simd = false;
#endif
    switch (type) {
    case kNone:
        return true;
    case kSub:
#if defined(__SSE2__)
        if (simd) {
            bpp == 3 ? sse2::sub<3>(row, n) : sse2::sub<4>(row, n);
            return true;
        }
#endif
        unfilter_sub_scalar(row, n, bpp);
        return true;
    case kUp:
        unfilter_up(row, prev, n);
        return true;
    case kAverage:
#if defined(__SSE2__)
        if (simd) {
            bpp == 3 ? sse2::average<3>(row, prev, n) : sse2::average<4>(row, prev, n);
            return true;
        }
#endif
        unfilter_average_scalar(row, prev, n, bpp);
        return true;
    case kPaeth:
#if defined(__SSE2__)
        if (simd) {
            bpp == 3 ? sse2::paeth<3>(row, prev, n) : sse2::paeth<4>(row, prev, n);
            return true;
        }
#endif
        unfilter_paeth_scalar(row, prev, n, bpp);
        return true;
    default:
        (void)simd;
        return false;
    }
}

}  // namespace fastpipe::png

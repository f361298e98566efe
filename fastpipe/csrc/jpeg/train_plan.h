/* The train crop of fastpipe.data.ImageDecoder, drawn in C++ for _jpeg.decode_train: the same
 * numbers as torch.rand(23, dtype=torch.float64, generator=g) after g.manual_seed(seed), and the
 * same arithmetic as fastpipe/data/_crop.py and ImageDecoder._plan/_region (double precision,
 * the same operations in the same order, libm's log, exp and sqrt, rounding half to even as
 * Python's round), so the box, the DCT scale and the flip equal the Python path's.
 * tests/jpeg/test_decode_train.py compares the two over many images and seeds. */
#pragma once

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <random>

namespace train_plan {

/* Uniform numbers one crop consumes: 10 attempts of (area, log-ratio), then row, column, flip
 * (fastpipe.data._crop.UNIFORMS_PER_CROP). */
constexpr int kUniforms = 23;

/* torch's CPU generator is MT19937 seeded with the seed's low 32 bits; a float64 uniform takes
 * two 32-bit outputs (the first the high half) and keeps the low 53 bits of the pair, scaled by
 * 2**-53 (at::uniform_real_distribution<double>). */
inline void draw_uniforms(uint64_t seed, double *uniforms) {
    std::mt19937 engine(static_cast<uint32_t>(seed & 0xffffffffu));
    for (int i = 0; i < kUniforms; ++i) {
        const uint64_t high = engine(), low = engine();
        const uint64_t bits = ((high << 32) | low) & ((uint64_t{1} << 53) - 1);
        uniforms[i] = static_cast<double>(bits) * (1.0 / static_cast<double>(uint64_t{1} << 53));
    }
}

struct Box {
    long top, left, height, width;
};

/* Python's round() of a float: half to even, as nearbyint in the default rounding mode. Values
 * no image side reaches (and NaN) come back as -1, which every caller refuses, rather than as an
 * undefined conversion; region_decode.cpp's argument checks keep real plans far from them. */
inline long round_even(double x) {
    if (!(std::fabs(x) < 4.0e18)) return -1;
    return static_cast<long>(std::nearbyint(x));
}

/* _crop.random_resized_crop_box. */
inline Box random_resized_crop_box(long height, long width, const double *u, double scale_lo,
                                   double scale_hi, double ratio_lo, double ratio_hi) {
    const long area = height * width;
    const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
    for (int attempt = 0; attempt < 10; ++attempt) {
        const double target_area = static_cast<double>(area) *
                                   (scale_lo + (scale_hi - scale_lo) * u[2 * attempt]);
        const double aspect = std::exp(log_lo + (log_hi - log_lo) * u[2 * attempt + 1]);
        const long w = round_even(std::sqrt(target_area * aspect));
        const long h = round_even(std::sqrt(target_area / aspect));
        if (0 < w && w <= width && 0 < h && h <= height) {
            const long top = static_cast<long>(u[20] * static_cast<double>(height - h + 1));
            const long left = static_cast<long>(u[21] * static_cast<double>(width - w + 1));
            return Box{top, left, h, w};
        }
    }
    const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
    const double lowest = std::fmin(ratio_lo, ratio_hi), highest = std::fmax(ratio_lo, ratio_hi);
    long w = width, h = height;
    if (in_ratio < lowest) {
        h = round_even(static_cast<double>(w) / lowest);
    } else if (in_ratio > highest) {
        w = round_even(static_cast<double>(h) * highest);
    }
    return Box{(height - h) / 2, (width - w) / 2, h, w};
}

/* _crop.dct_scale: the largest k in 8, 4, 2, 1 at which the decoded image still covers `need`. */
inline int dct_scale(long height, long width, double need_height, double need_width) {
    for (int k : {8, 4, 2, 1}) {
        if (static_cast<double>(height) / k >= need_height &&
            static_cast<double>(width) / k >= need_width) {
            return k;
        }
    }
    return 1;
}

struct Plan {
    int k;          // DCT reduction
    Box region;     // the crop in the 1/k-decoded image (_decode._decoded_box)
    bool flip;
};

struct Options {
    long out_height, out_width;
    double scale_lo, scale_hi, ratio_lo, ratio_hi, hflip, reducing_gap;
};

/* ImageDecoder._plan (train) and _region for an image of height x width and a sample's seed. */
inline Plan plan(long height, long width, uint64_t seed, const Options &o) {
    double u[kUniforms];
    draw_uniforms(seed, u);
    const Box box = random_resized_crop_box(height, width, u, o.scale_lo, o.scale_hi, o.ratio_lo,
                                            o.ratio_hi);
    const double need_height = static_cast<double>(height * o.out_height) / static_cast<double>(box.height);
    const double need_width = static_cast<double>(width * o.out_width) / static_cast<double>(box.width);
    const int k = dct_scale(height, width, need_height * o.reducing_gap, need_width * o.reducing_gap);
    const long decoded_height = (height + k - 1) / k, decoded_width = (width + k - 1) / k;
    const double sy = static_cast<double>(decoded_height) / static_cast<double>(height);
    const double sx = static_cast<double>(decoded_width) / static_cast<double>(width);
    const long top = round_even(static_cast<double>(box.top) * sy);
    const long left = round_even(static_cast<double>(box.left) * sx);
    long bottom = round_even(static_cast<double>(box.top + box.height) * sy);
    long right = round_even(static_cast<double>(box.left + box.width) * sx);
    bottom = std::max(std::min(bottom, decoded_height), top + 1);
    right = std::max(std::min(right, decoded_width), left + 1);
    return Plan{k, Box{top, left, bottom - top, right - left}, u[22] < o.hflip};
}

/* (height, width) from the first start-of-frame marker of a JPEG, or false: not a JPEG, no frame
 * before the first scan, a height of 0 (set later by a DNL marker), or bytes that end first. */
inline bool frame_size(const unsigned char *data, size_t size, long *height, long *width) {
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) return false;
    size_t at = 2;
    while (at + 4 <= size) {
        if (data[at] != 0xFF) return false;
        const unsigned char marker = data[at + 1];
        if (marker == 0xFF) {  // fill byte
            ++at;
            continue;
        }
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // no length
            at += 2;
            continue;
        }
        const size_t length = (size_t{data[at + 2]} << 8) | data[at + 3];
        if (marker == 0xDA || marker == 0xD9 || length < 2) return false;
        const bool frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                           marker != 0xCC;
        if (frame) {
            if (length < 7 || at + 9 > size) return false;
            *height = (long{data[at + 5]} << 8) | data[at + 6];
            *width = (long{data[at + 7]} << 8) | data[at + 8];
            return *height > 0 && *width > 0;
        }
        at += 2 + length;
    }
    return false;
}

}  // namespace train_plan

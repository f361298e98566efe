/* Crops that entropy-decode only what they show: JPEGs with a restart marker after every MCU.
 *
 * A region decode of an ordinary JPEG still entropy-decodes every row above the crop and every
 * column beside it: Huffman codes have no byte boundaries and DC coefficients are coded as
 * differences along the row. A restart marker resets both: the entropy data after it starts on
 * a byte and its DC predictors start at zero, so each restart segment decodes on its own.
 *
 * transcode_for_crops() rewrites a JPEG losslessly (its DCT coefficients, not its pixels, as
 * jpegtran does) as a baseline JPEG with a restart marker after every MCU and optimized Huffman
 * tables. segmented_crop() recognises such a file, finds its segments (one pass of memchr over
 * the entropy data), and assembles a small valid JPEG of the MCUs that cover the crop: the same
 * headers with the frame's size patched, the segments in raster order, the restart markers
 * renumbered. Decoding that gives the crop's pixels exactly: every block holds the same
 * coefficients. Smooth (fancy) upsampling interpolates chroma from neighbouring samples, so for it
 * one more MCU on each side gives the edges the same neighbours; replicated chroma (fast
 * upsampling) reads no neighbour, and the crop's own MCUs suffice.
 */
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <jpeglib.h>

struct segment_layout {
    size_t sof_length_at = 0;   /* offset of the frame header's length field */
    size_t scan_start = 0;      /* first byte of the entropy-coded data */
    unsigned width = 0, height = 0;
    unsigned mcu_width = 0, mcu_height = 0;  /* in full-scale pixels */
    unsigned mcus_x = 0, mcus_y = 0;
    std::vector<uint32_t> begin, end;        /* each MCU's segment, [begin, end) */
};

static inline unsigned be16(const unsigned char *p) { return (unsigned)p[0] << 8 | p[1]; }

/* True for a baseline/extended 8-bit Huffman JPEG with one interleaved scan and a restart
 * interval of one MCU, whose segments are all present; fills `layout`. */
static bool find_segments(const unsigned char *d, size_t n, segment_layout *layout) {
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) {
        return false;
    }
    size_t i = 2;
    unsigned components = 0, max_h = 0, max_v = 0, interval = 0;
    bool frame = false;
    while (true) {
        while (i < n && d[i] == 0xFF) {
            ++i;
        }
        if (i + 2 >= n) {
            return false;
        }
        const unsigned char marker = d[i++];
        if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
            continue;
        }
        const size_t length = be16(d + i);
        if (length < 2 || i + length > n) {
            return false;
        }
        const unsigned char *p = d + i + 2;
        if (marker == 0xC0 || marker == 0xC1) {
            if (length < 8 || p[0] != 8) {
                return false;
            }
            layout->sof_length_at = i;
            layout->height = be16(p + 1);
            layout->width = be16(p + 3);
            components = p[5];
            if (components == 0 || length < 8 + 3 * (size_t)components || layout->height == 0) {
                return false;
            }
            for (unsigned c = 0; c < components; ++c) {
                const unsigned h = p[7 + 3 * c] >> 4, v = p[7 + 3 * c] & 15;
                if (h < 1 || v < 1) {
                    return false;
                }
                max_h = h > max_h ? h : max_h;
                max_v = v > max_v ? v : max_v;
            }
            frame = true;
        } else if (marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                   marker != 0xCC) {
            return false; /* progressive, lossless, arithmetic or hierarchical */
        } else if (marker == 0xDD) {
            interval = length >= 4 ? be16(p) : 0;
        } else if (marker == 0xDA) {
            if (!frame || interval != 1 || length < 3 || p[0] != components) {
                return false;
            }
            layout->scan_start = i + length;
            break;
        } else if (marker == 0xD9) {
            return false;
        }
        i += length;
    }
    if (components == 1) {
        layout->mcu_width = layout->mcu_height = 8; /* a one-component scan's MCU is one block */
    } else {
        layout->mcu_width = 8 * max_h;
        layout->mcu_height = 8 * max_v;
    }
    layout->mcus_x = (layout->width + layout->mcu_width - 1) / layout->mcu_width;
    layout->mcus_y = (layout->height + layout->mcu_height - 1) / layout->mcu_height;
    const size_t mcus = (size_t)layout->mcus_x * layout->mcus_y;
    if (n > UINT32_MAX) {
        return false;
    }
    layout->begin.clear();
    layout->end.clear();
    layout->begin.reserve(mcus);
    layout->end.reserve(mcus);
    layout->begin.push_back((uint32_t)layout->scan_start);
    size_t at = layout->scan_start;
    while (true) {
        const void *found = at < n ? std::memchr(d + at, 0xFF, n - at) : nullptr;
        if (found == nullptr) {
            return false; /* no end-of-image marker */
        }
        const size_t ff = (size_t)(static_cast<const unsigned char *>(found) - d);
        if (ff + 1 >= n) {
            return false;
        }
        const unsigned char next = d[ff + 1];
        if (next == 0x00 || next == 0xFF) {
            at = ff + 1; /* a stuffed 0xFF byte, or fill before a marker */
            continue;
        }
        if (next >= 0xD0 && next <= 0xD7) {
            if (((next - 0xD0) & 7) != (layout->end.size() & 7)) {
                return false;
            }
            layout->end.push_back((uint32_t)ff);
            layout->begin.push_back((uint32_t)(ff + 2));
            at = ff + 2;
            continue;
        }
        if (next != 0xD9) {
            return false; /* DNL or another scan */
        }
        layout->end.push_back((uint32_t)ff);
        break;
    }
    return layout->begin.size() == mcus && layout->end.size() == mcus;
}

/* For a file with one restart segment per MCU: the JPEG holding the MCUs that cover the region
 * (rows [top, top + height) and columns [left, left + width) of the image decoded at
 * 1/scale_denom) and `margin` more MCUs on each side (1 for smooth upsampling, 0 for replicated
 * chroma), with *top and *left moved to its coordinates. Empty when the file has no such
 * segments, or when the crop needs (nearly) all of it. */
static std::vector<unsigned char> segmented_crop(const unsigned char *d, size_t n, int scale_denom,
                                                 unsigned *top, unsigned *left, unsigned height,
                                                 unsigned width, unsigned margin) {
    std::vector<unsigned char> out;
    segment_layout L;
    if (!find_segments(d, n, &L)) {
        return out;
    }
    const unsigned s = (unsigned)scale_denom;
    auto span = [s, margin](unsigned first, unsigned count, unsigned mcu, unsigned full,
                            unsigned mcus, unsigned *lo, unsigned *hi) {
        unsigned from = first * s, to = (first + count) * s;
        to = to < full ? to : full;
        if (from >= to) {
            return false;
        }
        *lo = from / mcu;
        *hi = (to - 1) / mcu;
        *lo = *lo > margin ? *lo - margin : 0;
        *hi = *hi + margin < mcus ? *hi + margin : mcus - 1;
        return true;
    };
    unsigned r0, r1, c0, c1;
    if (!span(*top, height, L.mcu_height, L.height, L.mcus_y, &r0, &r1) ||
        !span(*left, width, L.mcu_width, L.width, L.mcus_x, &c0, &c1)) {
        return out;
    }
    const size_t kept = (size_t)(r1 - r0 + 1) * (c1 - c0 + 1);
    if (kept == (size_t)L.mcus_x * L.mcus_y) {
        return out; /* the crop needs every MCU: decode the file as it is */
    }
    const unsigned new_height = r1 + 1 == L.mcus_y ? L.height - r0 * L.mcu_height
                                                   : (r1 - r0 + 1) * L.mcu_height;
    const unsigned new_width = c1 + 1 == L.mcus_x ? L.width - c0 * L.mcu_width
                                                  : (c1 - c0 + 1) * L.mcu_width;
    size_t bytes = L.scan_start + 2 * kept + 2;
    for (unsigned r = r0; r <= r1; ++r) {
        const size_t row = (size_t)r * L.mcus_x;
        bytes += L.end[row + c1] - L.begin[row + c0];
    }
    out.reserve(bytes);
    out.insert(out.end(), d, d + L.scan_start);
    unsigned char *frame = out.data() + L.sof_length_at + 2;
    frame[1] = (unsigned char)(new_height >> 8);
    frame[2] = (unsigned char)(new_height & 255);
    frame[3] = (unsigned char)(new_width >> 8);
    frame[4] = (unsigned char)(new_width & 255);
    unsigned written = 0;
    for (unsigned r = r0; r <= r1; ++r) {
        for (unsigned c = c0; c <= c1; ++c) {
            const size_t k = (size_t)r * L.mcus_x + c;
            if (written > 0) {
                out.push_back(0xFF);
                out.push_back((unsigned char)(0xD0 + ((written - 1) & 7)));
            }
            out.insert(out.end(), d + L.begin[k], d + L.end[k]);
            ++written;
        }
    }
    out.push_back(0xFF);
    out.push_back(0xD9);
    *top -= r0 * (L.mcu_height / s);
    *left -= c0 * (L.mcu_width / s);
    return out;
}

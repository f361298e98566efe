/* A faster Huffman decoder for sequential JPEGs, plugged into libjpeg-turbo's decoder.
 *
 * Entropy decoding is most of a crop's decode time (libjpeg-turbo's Huffman decoder was 60% of a
 * train sample's instructions under callgrind), and libjpeg-turbo 2.1 runs its fast path only for
 * files without restart markers; every MCU of a transcoded pack goes through its slow path. This
 * decoder replaces libjpeg-turbo's entropy module for one decode (cinfo->entropy; libjpeg's
 * modules are method tables meant to be swapped) and produces the same coefficients:
 *
 * - a 64-bit bit buffer refilled 8 bytes at a time while those bytes hold no 0xFF (byte-stuffing
 *   and markers take the byte-by-byte path, which follows libjpeg's jpeg_fill_bit_buffer);
 * - one lookup of 10 bits decodes most AC coefficients whole (code, run, size and value bits
 *   together); longer codes fall back to canonical decoding, as libjpeg's jpeg_huff_decode;
 * - restarts are handed to libjpeg's own read_restart_marker, so resynchronisation and its
 *   warnings stay libjpeg's; running out of data warns JWRN_HIT_MARKER as libjpeg does.
 *
 * Coefficients are stored unquantized in natural order with libjpeg's clamp of corrupt runs to
 * position 63, and DC predictions wrap as in libjpeg, so the IDCT sees the same blocks. It is
 * installed only for 8-bit single-scan sequential Huffman files, after jpeg_start_decompress
 * (which for those has read no entropy data); everything else keeps libjpeg's module.
 * region_decode.cpp's tests compare its pixels with libjpeg-turbo's own decoder
 * (fastpipe._jpeg._huffman(False)).
 */
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include <jpeglib.h>
#include <jerror.h>

namespace fast_huffman {

constexpr int kLookBits = 10;
constexpr int kLookSize = 1 << kLookBits;

/* A fast AC entry: bits 0-4 total bits taken (code + value, 0 = not in the table), 5-8 the run,
 * 9 set when a coefficient follows (otherwise end of block or a run of 16 zeros), 16-31 the
 * coefficient. */
constexpr uint32_t kHasValue = 1u << 9;

struct table {
    uint16_t look[kLookSize];  /* (code length << 8) | symbol for codes of <= kLookBits; 0 otherwise */
    uint32_t ac[kLookSize];    /* see kHasValue; built for AC tables only */
    int32_t maxcode[18];       /* largest code of each length, -1 if none; [17] a sentinel */
    int32_t valoffset[18];
    uint8_t huffval[256];
};

/* libjpeg's jpeg_natural_order with its 16 guard entries: corrupt runs past 63 land on 63. */
static const int natural_order[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
    40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
    29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
    47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63,
};

struct decoder {
    struct jpeg_entropy_decoder pub; /* first: libjpeg calls through cinfo->entropy */
    table tables[2][NUM_HUFF_TBLS];  /* [0] DC, [1] AC; only the scan's tables are built */
    const table *dc[D_MAX_BLOCKS_IN_MCU];
    const table *ac[D_MAX_BLOCKS_IN_MCU];
    int component[D_MAX_BLOCKS_IN_MCU];
    bool ac_needed[D_MAX_BLOCKS_IN_MCU];
    int last_dc[MAX_COMPS_IN_SCAN];
    unsigned restarts_to_go;
    /* Bit reader: the next `bits` bits of entropy data are the top bits of `buffer`; the last
     * `padded` of them are zeros added after a marker or the end of the data. */
    uint64_t buffer;
    int bits, padded;
    bool marker_hit;
    const JOCTET *next, *end;
};

inline std::atomic<bool> &enabled() {
    static std::atomic<bool> on{true};
    return on;
}

/* Decodes that used this decoder, so that tests can tell it ran. */
inline std::atomic<unsigned long> &installs() {
    static std::atomic<unsigned long> count{0};
    return count;
}

static inline int extend(int value, int size) {
    return value < (1 << (size - 1)) ? value + (int)((~0u << size) + 1u) : value;
}

/* Builds the canonical code of a libjpeg Huffman table (as jpeg_make_d_derived_tbl does); false
 * for a table that libjpeg would have refused. */
static bool build(const JHUFF_TBL *htbl, bool is_ac, table *t) {
    unsigned char size[257];
    unsigned int code[257];
    int p = 0;
    for (int l = 1; l <= 16; ++l) {
        const int count = htbl->bits[l];
        if (p + count > 256) {
            return false;
        }
        for (int i = 0; i < count; ++i) {
            size[p++] = (unsigned char)l;
        }
    }
    size[p] = 0;
    const int symbols = p;
    for (int i = 0; i < symbols && !is_ac; ++i) {
        if (htbl->huffval[i] > 15) {  /* a DC size past 15 bits would overrun the bit reader */
            return false;
        }
    }
    unsigned int next_code = 0;
    int length = size[0];
    p = 0;
    while (size[p]) {
        while ((int)size[p] == length) {
            code[p++] = next_code++;
        }
        if (next_code > (1u << length)) {
            return false;
        }
        next_code <<= 1;
        ++length;
    }
    p = 0;
    for (int l = 1; l <= 16; ++l) {
        if (htbl->bits[l]) {
            t->valoffset[l] = p - (int)code[p];
            p += htbl->bits[l];
            t->maxcode[l] = (int32_t)code[p - 1];
        } else {
            t->maxcode[l] = -1;
        }
    }
    t->valoffset[17] = 0;
    t->maxcode[17] = 0xFFFFF;
    std::memcpy(t->huffval, htbl->huffval, sizeof t->huffval);
    std::memset(t->look, 0, sizeof t->look);
    std::memset(t->ac, 0, sizeof t->ac);
    for (int i = 0; i < symbols; ++i) {
        const int l = size[i];
        if (l > kLookBits) {
            break;
        }
        const int symbol = htbl->huffval[i];
        const int first = (int)(code[i] << (kLookBits - l));
        for (int j = 0; j < (1 << (kLookBits - l)); ++j) {
            const int index = first + j;
            t->look[index] = (uint16_t)(l << 8 | symbol);
            if (!is_ac) {
                continue;
            }
            const int run = symbol >> 4, s = symbol & 15;
            if (s == 0) {
                t->ac[index] = (uint32_t)l | (uint32_t)run << 5;
            } else if (l + s <= kLookBits) {
                const int raw = (index >> (kLookBits - l - s)) & ((1 << s) - 1);
                const int value = extend(raw, s);
                t->ac[index] = (uint32_t)(l + s) | (uint32_t)run << 5 | kHasValue |
                               (uint32_t)(uint16_t)(int16_t)value << 16;
            }
        }
    }
    return true;
}

/* The byte-by-byte refill, as libjpeg's jpeg_fill_bit_buffer: FF 00 is a data byte 0xFF, FF
 * followed by anything else is a marker that ends the data (kept in cinfo->unread_marker), after
 * which the decoder reads zeros. */
static void refill_slow(j_decompress_ptr cinfo, decoder *d) {
    /* The fast refill may have left bits of the following bytes below the valid ones. */
    d->buffer = d->bits == 0 ? 0 : d->buffer & (~0ull << (64 - d->bits));
    while (d->bits <= 56 && !d->marker_hit) {
        if (d->next >= d->end) {
            /* What jpeg_mem_src does at the end of its buffer: warn, then act as if at EOI. */
            WARNMS(cinfo, JWRN_JPEG_EOF);
            cinfo->unread_marker = JPEG_EOI;
            d->marker_hit = true;
            break;
        }
        unsigned int c = *d->next++;
        if (c == 0xFF) {
            bool fill = false;
            do {
                if (d->next >= d->end) {
                    WARNMS(cinfo, JWRN_JPEG_EOF);
                    c = JPEG_EOI;
                    break;
                }
                c = *d->next++;
                fill = fill || c == 0xFF;
            } while (c == 0xFF);
            if (c == 0 && fill) {
                /* FF FF .. FF 00: fill bytes before a stuffed zero, which no encoder writes.
                 * libjpeg-turbo's pixels for it depend on which of its two decoders met it (its
                 * fast one takes FF FF for a marker and leaves coefficients behind for the slow
                 * one), so the region decode refuses the data and the caller decodes the image
                 * whole, with libjpeg's own decoder. */
                WARNMS(cinfo, JWRN_HIT_MARKER);
            }
            if (c == 0) {
                c = 0xFF;
            } else {
                cinfo->unread_marker = (int)c;
                d->marker_hit = true;
                break;
            }
        }
        d->buffer |= (uint64_t)c << (56 - d->bits);
        d->bits += 8;
    }
    if (d->marker_hit && d->bits < 57) {
        d->padded += 63 - d->bits;
        d->bits = 63;
    }
}

/* The bit reader's hot state, kept in registers through an MCU and stored back after it. */
struct bits_in_hand {
    uint64_t buffer;
    int bits;
};

static inline void load(const decoder *d, bits_in_hand *r) {
    r->buffer = d->buffer;
    r->bits = d->bits;
}

static inline void store(decoder *d, const bits_in_hand *r) {
    d->buffer = r->buffer;
    d->bits = r->bits;
}

static inline void refill(j_decompress_ptr cinfo, decoder *d, bits_in_hand *r) {
    if (d->end - d->next >= 8 && !d->marker_hit) {
        uint64_t v;
        std::memcpy(&v, d->next, 8);
        v = __builtin_bswap64(v);
        /* A zero byte in ~v is a 0xFF byte in v. */
        const uint64_t inv = ~v;
        if (((inv - 0x0101010101010101ull) & ~inv & 0x8080808080808080ull) == 0) {
            /* Whole bytes up to 56-63 bits; the bits below come from the next bytes, which the
             * next refill ORs in again with the same values. */
            r->buffer |= v >> r->bits;
            d->next += (63 - r->bits) >> 3;
            r->bits |= 56;
            return;
        }
    }
    store(d, r);
    refill_slow(cinfo, d);
    load(d, r);
}

static inline unsigned take(bits_in_hand *r, int n) {
    const unsigned v = (unsigned)(r->buffer >> (64 - n));
    r->buffer <<= n;
    r->bits -= n;
    return v;
}

/* A code longer than kLookBits bits at the top of `buffer`, decoded as libjpeg's
 * jpeg_huff_decode does: (its length << 8) | its symbol. Takes the buffer by value so that the
 * caller's bit reader stays in registers. */
static unsigned decode_long(j_decompress_ptr cinfo, const table *t, uint64_t buffer) {
    const unsigned peek = (unsigned)(buffer >> 48);
    int l = kLookBits + 1;
    while (l <= 16 && (int32_t)(peek >> (16 - l)) > t->maxcode[l]) {
        ++l;
    }
    if (l > 16) {
        WARNMS(cinfo, JWRN_HUFF_BAD_CODE);
        return 17u << 8;  /* libjpeg has read 17 bits when it gives up, and fakes a zero */
    }
    return (unsigned)l << 8 | t->huffval[((int)(peek >> (16 - l)) + t->valoffset[l]) & 0xFF];
}

/* The next Huffman symbol; at least 16 bits must be buffered. */
static inline int decode_symbol(j_decompress_ptr cinfo, const table *t, bits_in_hand *r) {
    unsigned look = t->look[r->buffer >> (64 - kLookBits)];
    if (look == 0) {
        look = decode_long(cinfo, t, r->buffer);
    }
    r->buffer <<= look >> 8;
    r->bits -= (int)(look >> 8);
    return (int)(look & 0xFF);
}

/* At the end of an MCU: did it read past the data into the zeros? Then warn, as libjpeg does. */
static inline void check_overrun(j_decompress_ptr cinfo, decoder *d) {
    if (d->bits < d->padded && !d->pub.insufficient_data) {
        WARNMS(cinfo, JWRN_HIT_MARKER);
        d->pub.insufficient_data = TRUE;
    }
}

/* The state at the start of the scan and after each restart marker: the data from where the
 * source stands (only zeros if a marker is already pending), DC predictions at zero, a full
 * restart interval to go. */
static void begin_segment(j_decompress_ptr cinfo, decoder *d) {
    d->next = cinfo->src->next_input_byte;
    d->end = d->next + cinfo->src->bytes_in_buffer;
    d->buffer = 0;
    d->bits = d->padded = 0;
    d->marker_hit = cinfo->unread_marker != 0;
    if (d->marker_hit) {
        d->padded = d->bits = 63;
    }
    for (int ci = 0; ci < cinfo->comps_in_scan; ++ci) {
        d->last_dc[ci] = 0;
    }
    d->restarts_to_go = cinfo->restart_interval;
}

static void process_restart(j_decompress_ptr cinfo, decoder *d) {
    /* Whole bytes of the segment left undecoded mean corrupt data. libjpeg counts them and warns
     * when it next scans for a marker, which it skips if its bit buffer had already reached the
     * marker; this reader reads further ahead, so it warns here, always. */
    const int unread = d->bits - d->padded;
    if (unread >= 8) {
        WARNMS2(cinfo, JWRN_EXTRANEOUS_DATA, unread / 8,
                d->marker_hit ? cinfo->unread_marker : JPEG_RST0 + cinfo->marker->next_restart_num);
    }
    cinfo->src->next_input_byte = d->next;
    cinfo->src->bytes_in_buffer = (size_t)(d->end - d->next);
    if (!(*cinfo->marker->read_restart_marker)(cinfo)) {
        ERREXIT(cinfo, JERR_CANT_SUSPEND);
    }
    begin_segment(cinfo, d);
    if (cinfo->unread_marker == 0) {
        d->pub.insufficient_data = FALSE;
    }
}

/* kStoreDC: the MCU is kept (libjpeg passes none for MCUs it skips); kStoreAC: also its AC
 * coefficients, which a component decoded at 1/8 scale does not need (as in libjpeg). */
template <bool kStoreDC, bool kStoreAC>
static inline void decode_block(j_decompress_ptr cinfo, decoder *d, int blkn, JCOEF *block,
                                bits_in_hand *r) {
    if (r->bits < 32) {
        refill(cinfo, d, r);
    }
    int s = decode_symbol(cinfo, d->dc[blkn], r);
    if (s) {
        s = extend((int)take(r, s), s);
    }
    const int ci = d->component[blkn];
    const int dc = (int)((unsigned)d->last_dc[ci] + (unsigned)s);
    d->last_dc[ci] = dc;
    if (kStoreDC) {
        block[0] = (JCOEF)dc;
    }
    const table *t = d->ac[blkn];
    for (int k = 1; k < 64; ++k) {
        if (r->bits < 32) {
            refill(cinfo, d, r);
        }
        const uint32_t fast = t->ac[r->buffer >> (64 - kLookBits)];
        int run, size;
        if (fast != 0) {
            const int n = (int)(fast & 31);
            r->buffer <<= n;
            r->bits -= n;
            run = (int)(fast >> 5 & 15);
            if (fast & kHasValue) {
                k += run;
                if (kStoreAC) {
                    block[natural_order[k]] = (JCOEF)(int16_t)(fast >> 16);
                }
                continue;
            }
            size = 0;
        } else {
            const int symbol = decode_symbol(cinfo, t, r);
            run = symbol >> 4;
            size = symbol & 15;
        }
        if (size) {
            k += run;
            const int value = extend((int)take(r, size), size);
            if (kStoreAC) {
                block[natural_order[k]] = (JCOEF)value;
            }
        } else {
            if (run != 15) {
                break;
            }
            k += 15;
        }
    }
}

static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    auto *d = reinterpret_cast<decoder *>(cinfo->entropy);
    if (cinfo->restart_interval && d->restarts_to_go == 0) {
        process_restart(cinfo, d);
    }
    if (!d->pub.insufficient_data) {
        bits_in_hand r;
        load(d, &r);
        const int blocks = cinfo->blocks_in_MCU;
        if (MCU_data != nullptr) {
            for (int blkn = 0; blkn < blocks; ++blkn) {
                if (d->ac_needed[blkn]) {
                    decode_block<true, true>(cinfo, d, blkn, MCU_data[blkn][0], &r);
                } else {
                    decode_block<true, false>(cinfo, d, blkn, MCU_data[blkn][0], &r);
                }
            }
        } else {
            for (int blkn = 0; blkn < blocks; ++blkn) {
                decode_block<false, false>(cinfo, d, blkn, nullptr, &r);
            }
        }
        store(d, &r);
        check_overrun(cinfo, d);
    }
    if (cinfo->restart_interval) {
        --d->restarts_to_go;
    }
    /* libjpeg's other modules see the source where the bit buffer's bytes end, as with its own. */
    cinfo->src->next_input_byte = d->next;
    cinfo->src->bytes_in_buffer = (size_t)(d->end - d->next);
    return TRUE;
}

static void start_pass(j_decompress_ptr cinfo) {
    /* Installed after the only scan's start; a second scan would need libjpeg's module. */
    ERREXIT(cinfo, JERR_NOTIMPL);
}

/* Replaces libjpeg's entropy decoder after jpeg_start_decompress, when the file is one that this
 * decoder reads (see the top of this file) and fastpipe._jpeg._huffman has not turned it off.
 * The whole file must be in the source's buffer (jpeg_mem_src, as decode_region uses): the end of
 * that buffer is taken for the end of the data. */
static void install(j_decompress_ptr cinfo) {
    if (!enabled().load(std::memory_order_relaxed) || cinfo->progressive_mode || cinfo->buffered_image ||
        cinfo->arith_code || cinfo->data_precision != 8 || cinfo->inputctl->has_multiple_scans ||
        cinfo->Ss != 0 || cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0 ||
        cinfo->comps_in_scan < 1 || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
        cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU ||
        cinfo->input_iMCU_row != 0) {
        return;
    }
    auto *d = static_cast<decoder *>(
        (*cinfo->mem->alloc_small)(reinterpret_cast<j_common_ptr>(cinfo), JPOOL_IMAGE, sizeof(decoder)));
    bool built[2][NUM_HUFF_TBLS] = {};
    for (int blkn = 0; blkn < cinfo->blocks_in_MCU; ++blkn) {
        const int ci = cinfo->MCU_membership[blkn];
        const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
        const int numbers[2] = {comp->dc_tbl_no, comp->ac_tbl_no};
        for (int kind = 0; kind < 2; ++kind) {
            const int n = numbers[kind];
            if (n < 0 || n >= NUM_HUFF_TBLS) {
                return;
            }
            const JHUFF_TBL *htbl = kind == 0 ? cinfo->dc_huff_tbl_ptrs[n] : cinfo->ac_huff_tbl_ptrs[n];
            if (htbl == nullptr) {
                return;
            }
            if (!built[kind][n]) {
                if (!build(htbl, kind == 1, &d->tables[kind][n])) {
                    return;
                }
                built[kind][n] = true;
            }
        }
        d->dc[blkn] = &d->tables[0][numbers[0]];
        d->ac[blkn] = &d->tables[1][numbers[1]];
        d->component[blkn] = ci;
#if JPEG_LIB_VERSION >= 70
        d->ac_needed[blkn] = comp->DCT_h_scaled_size > 1 || comp->DCT_v_scaled_size > 1;
#else
        d->ac_needed[blkn] = comp->DCT_scaled_size > 1;
#endif
    }
    begin_segment(cinfo, d);
    d->pub.start_pass = start_pass;
    d->pub.decode_mcu = decode_mcu;
    d->pub.insufficient_data = cinfo->entropy->insufficient_data;
    cinfo->entropy = &d->pub;
    installs().fetch_add(1, std::memory_order_relaxed);
}

}  // namespace fast_huffman

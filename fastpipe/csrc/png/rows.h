/* fastpipe's own decode of a band of PNG rows, with zlib and the filters of unfilter.h, for the
 * files most datasets hold: not interlaced, 8 or 16 bits per sample (palette files of 8 bits give
 * their indices). Everything else goes to libpng (png_decode.cpp).
 *
 * Two ways in:
 * - Any such PNG: the IDAT stream is inflated from its start, a row at a time, and inflating stops
 *   after the last row wanted (the rows above the band are inflated into scratch rows).
 * - A seekable PNG, as `fastpipe pack --transcode` writes them: a private ancillary chunk `fpIX`
 *   before the IDATs (version 1; R, the rows per segment; then the CRC-32 of each segment's
 *   inflated bytes; big-endian) says that each IDAT chunk holds R rows (the last one the rest),
 *   compressed after a zlib full flush (no back-reference into the chunks before it), and that
 *   the first row of each uses filter None or Sub (nothing from the row above). A band then
 *   inflates from the IDAT of its first segment; that segment is inflated whole and checked
 *   against its CRC, so a start that is not a real segment start is caught (after it, the
 *   stream is read in order as usual). A file that breaks the promise (a tool rewrote the pixels
 *   and kept the chunk, or damage) is read from the start instead: the chunk is checked on use,
 *   never trusted.
 *
 * Every chunk but IDAT is checked against its CRC when the layout is read (a mismatch sends the
 * file to libpng, which reports it); every IDAT chunk read is checked when the inflater takes it;
 * damage inside the stream below the band goes unnoticed, as with any band decode. Decoding the
 * last row also reads the stream to its end and checks the IDAT chunks after it.
 */
#pragma once

#include <zlib.h>
#if defined(FASTPIPE_PNG_ISAL)
#include <isa-l/igzip_lib.h>
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "unfilter.h"

namespace fastpipe::png {

constexpr uint32_t chunk_type(const char (&name)[5]) {
    return (uint32_t(uint8_t(name[0])) << 24) | (uint32_t(uint8_t(name[1])) << 16)
           | (uint32_t(uint8_t(name[2])) << 8) | uint32_t(uint8_t(name[3]));
}

constexpr uint32_t kIHDR = chunk_type("IHDR"), kPLTE = chunk_type("PLTE"),
                   kIDAT = chunk_type("IDAT"), kIEND = chunk_type("IEND"),
                   kSeekIndex = chunk_type("fpIX");
constexpr uint8_t kSeekVersion = 1;
constexpr uint32_t kMaxChunk = 0x7fffffffU;  // the specification's limit on a chunk's length

inline uint32_t be32(const uint8_t *p) {
    return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

struct Span {
    size_t offset;  // of the chunk's data
    uint32_t length;
};

struct Layout {
    uint32_t width = 0, height = 0;
    int depth = 0, color_type = 0, interlace = 0;
    std::vector<Span> idat;
    uint32_t segment_rows = 0;  // 0: not seekable
    size_t segment_crcs = 0;    // offset of the segments' CRC-32s in the file
    size_t row_bytes = 0, pixel_bytes = 0;
};

// PNG's CRC-32 (zlib's) of `length` bytes, continuing from `crc` (0 to start).
inline uint32_t crc32_of(uint32_t crc, const uint8_t *bytes, size_t length) {
    while (length > 0) {
        const uInt part = length > (1u << 30) ? (1u << 30) : static_cast<uInt>(length);
        crc = static_cast<uint32_t>(crc32(crc, bytes, part));
        bytes += part;
        length -= part;
    }
    return crc;
}

inline bool crc_matches(const uint8_t *data, size_t offset, uint32_t length) {
    // The CRC covers the chunk type (the 4 bytes before the data) and the data.
    return crc32_of(0, data + offset - 4, size_t(length) + 4) == be32(data + offset + length);
}

/* The layout of a PNG this decoder reads, or false: a file it does not take (interlaced, sub-byte
 * depth) and a file whose chunk structure is damaged both go to libpng, which decodes or reports
 * them. */
inline bool read_layout(const uint8_t *data, size_t size, Layout *out) {
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (size < 8 + 25 || std::memcmp(data, signature, 8) != 0) {
        return false;
    }
    Layout layout;
    bool seen_plte = false, idat_done = false;
    size_t seek_segments = 0;
    size_t pos = 8;
    for (int index = 0;; ++index) {
        if (size - pos < 12) {
            return false;
        }
        const uint32_t length = be32(data + pos), type = be32(data + pos + 4);
        if (length > kMaxChunk || size - pos - 12 < length) {
            return false;
        }
        const size_t body = pos + 8;
        for (int k = 4; k < 8; ++k) {
            const uint8_t c = data[pos + k];
            if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) {
                return false;
            }
        }
        // Every chunk but IDAT is checked against its CRC here, ancillary ones included, as
        // libpng checks them (png_decode.cpp sets its CRC action so): a damaged chunk anywhere
        // sends the file to libpng, which names it. IDATs are checked when the inflater takes
        // them (a band need not read those after it).
        if (type != kIDAT && !crc_matches(data, body, length)) {
            return false;
        }
        if (index == 0) {
            if (type != kIHDR || length != 13) {
                return false;
            }
            const uint8_t *h = data + body;
            layout.width = be32(h);
            layout.height = be32(h + 4);
            layout.depth = h[8];
            layout.color_type = h[9];
            layout.interlace = h[12];
            if (h[10] != 0 || h[11] != 0 || layout.interlace != 0 || layout.width == 0
                    || layout.height == 0 || layout.width > kMaxChunk || layout.height > kMaxChunk) {
                return false;
            }
            int channels;
            switch (layout.color_type) {
            case 0: channels = 1; break;
            case 2: channels = 3; break;
            case 3: channels = 1; break;
            case 4: channels = 2; break;
            case 6: channels = 4; break;
            default: return false;
            }
            if (!(layout.depth == 8 || (layout.depth == 16 && layout.color_type != 3))) {
                return false;
            }
            layout.pixel_bytes = size_t(channels) * (layout.depth / 8);
            layout.row_bytes = layout.pixel_bytes * layout.width;
        } else if (type == kIHDR) {
            return false;
        } else if (type == kPLTE) {
            // One palette before the image data, of whole entries, at most 256 (libpng refuses
            // the rest, or reads them otherwise: it decides).
            if (!layout.idat.empty() || seen_plte || length == 0 || length % 3 != 0
                    || length > 3 * 256) {
                return false;
            }
            seen_plte = true;
        } else if (type == kSeekIndex && layout.idat.empty()) {
            if (length >= 9 && (length - 5) % 4 == 0 && data[body] == kSeekVersion) {
                layout.segment_rows = be32(data + body + 1);
                layout.segment_crcs = body + 5;
                seek_segments = (length - 5) / 4;
            }
        } else if (type == kIDAT) {
            if (idat_done || length == 0) {
                return false;  // IDATs apart, or empty ones: libpng decides
            }
            layout.idat.push_back(Span{body, length});
        } else if (type == kIEND) {
            break;
        } else if ((type & 0x20000000U) == 0) {
            return false;  // a critical chunk the specification does not define
        } else if (!layout.idat.empty()) {
            idat_done = true;
        }
        pos = body + length + 4;
    }
    if (layout.idat.empty() || (layout.color_type == 3 && !seen_plte)) {
        return false;
    }
    const uint32_t rows = layout.segment_rows;
    if (rows == 0 || uint64_t(layout.idat.size()) != (uint64_t(layout.height) + rows - 1) / rows
            || seek_segments != layout.idat.size()) {
        layout.segment_rows = 0;
    }
    *out = std::move(layout);
    return true;
}

// The IDAT chunks of a file handed out in order, each checked against its CRC, and the message
// of the first error: what both inflaters below read from.
class IdatChunks {
public:
    const std::string &message() const { return message_; }

    // After the stream's end: the IDAT chunks the inflater never took are checked against their
    // CRCs too, as libpng checks every chunk up to IEND when it reads a file to its end.
    bool check_rest() {
        for (; next_chunk_ < layout_.idat.size(); ++next_chunk_) {
            const Span span = layout_.idat[next_chunk_];
            if (!crc_matches(data_, span.offset, span.length)) {
                return fail("IDAT: CRC error");
            }
        }
        return true;
    }

protected:
    static constexpr const char *kInputsEnd =
        "not enough image data: the IDAT chunks end before the last row";

    IdatChunks(const uint8_t *data, const Layout &layout) : data_(data), layout_(layout) {}

    // The next chunk's data and length, or false with message() set.
    bool next_chunk(const uint8_t **bytes, uint32_t *length) {
        if (next_chunk_ >= layout_.idat.size()) {
            return fail(kInputsEnd);
        }
        const Span span = layout_.idat[next_chunk_++];
        if (!crc_matches(data_, span.offset, span.length)) {
            return fail("IDAT: CRC error");
        }
        *bytes = data_ + span.offset;
        *length = span.length;
        return true;
    }

    bool fail(const char *message) {
        message_ = message;
        return false;
    }

    const uint8_t *data_;
    const Layout &layout_;
    size_t next_chunk_ = 0;
    std::string message_;
};

#if !defined(FASTPIPE_PNG_ISAL)
// Inflates the rows of a run of IDAT chunks, one filtered row (type byte + bytes) at a time.
class RowInflater : public IdatChunks {
public:
    RowInflater(const uint8_t *data, const Layout &layout) : IdatChunks(data, layout) {
        std::memset(&stream_, 0, sizeof(stream_));
    }
    ~RowInflater() {
        if (open_) {
            inflateEnd(&stream_);
        }
    }
    RowInflater(const RowInflater &) = delete;
    RowInflater &operator=(const RowInflater &) = delete;

    // Starts at IDAT chunk `chunk`: the zlib stream's start for chunk 0, a raw deflate stream
    // after a full flush for the others.
    bool start(size_t chunk) {
        if (open_) {
            inflateEnd(&stream_);
            open_ = false;
        }
        std::memset(&stream_, 0, sizeof(stream_));
        next_chunk_ = chunk;
        if (!next_input()) {
            return false;
        }
        if (chunk > 0) {
            if (inflateInit2(&stream_, -15) != Z_OK) {
                return fail("out of memory");
            }
        } else if (inflateInit(&stream_) != Z_OK) {
            return fail("out of memory");
        }
        open_ = true;
        return true;
    }

    // The next `n` bytes of the stream into `out`, or false with message() set. zlib is asked
    // first and given the next chunk only when it made no progress with its input used up: it may
    // hold output of input it already took (a highly compressed stream's last chunk can inflate
    // to more than one call's room).
    bool read(uint8_t *out, size_t n) {
        stream_.next_out = out;
        stream_.avail_out = static_cast<uInt>(n);
        while (stream_.avail_out > 0) {
            const uInt room = stream_.avail_out, input = stream_.avail_in;
            const int status = inflate(&stream_, Z_NO_FLUSH);
            if (status == Z_STREAM_END) {
                if (stream_.avail_out > 0) {
                    return fail("not enough image data: the compressed stream ends before the "
                                "last row");
                }
                ended_ = true;
                break;
            }
            if (status != Z_OK && status != Z_BUF_ERROR) {
                return fail(stream_.msg != nullptr ? stream_.msg : "damaged compressed data");
            }
            if (stream_.avail_out == room && stream_.avail_in == input) {  // no progress
                if (stream_.avail_in > 0) {
                    return fail("damaged compressed data");  // never loop on it
                }
                if (!next_input()) {
                    return false;
                }
            }
        }
        return true;
    }

    // After the last row: the stream must end in the IDATs. Data past the last row ends the
    // check at its first byte (libpng's benign "too much image data"), so it costs nothing.
    bool finish() {
        uint8_t sink[1];
        while (!ended_) {
            stream_.next_out = sink;
            stream_.avail_out = sizeof(sink);
            const uInt input = stream_.avail_in;
            const int status = inflate(&stream_, Z_NO_FLUSH);
            if (status == Z_STREAM_END || stream_.avail_out == 0) {
                ended_ = true;
            } else if (status != Z_OK && status != Z_BUF_ERROR) {
                return fail(stream_.msg != nullptr ? stream_.msg : "damaged compressed data");
            } else if (stream_.avail_in == input) {  // no progress
                if (stream_.avail_in > 0) {
                    return fail("damaged compressed data");
                }
                if (!next_input()) {
                    return fail("not enough image data: the compressed stream has no end");
                }
            }
        }
        return true;
    }

    void expect(uint64_t) {}  // reads are row by row already

private:
    bool next_input() {
        const uint8_t *bytes;
        uint32_t length;
        if (!next_chunk(&bytes, &length)) {
            return false;
        }
        stream_.next_in = const_cast<Bytef *>(bytes);
        stream_.avail_in = length;
        return true;
    }

    z_stream stream_;
    bool open_ = false, ended_ = false;
};
#else
// The same with ISA-L's inflate (igzip), which inflates photos' PNGs about twice as fast as zlib.
// It is fastest given large outputs, so it inflates kPiece bytes at a time into a buffer that the
// rows are copied from: a band then inflates at most kPiece bytes past its last row.
class RowInflater : public IdatChunks {
public:
    RowInflater(const uint8_t *data, const Layout &layout)
        : IdatChunks(data, layout), state_(new inflate_state), buffer_(kPiece) {}
    RowInflater(const RowInflater &) = delete;
    RowInflater &operator=(const RowInflater &) = delete;

    // Starts at IDAT chunk `chunk`: the zlib stream's start for chunk 0 (header parsed, Adler-32
    // checked at the end), a raw deflate stream after a full flush for the others.
    bool start(size_t chunk) {
        isal_inflate_init(state_.get());
        state_->crc_flag = chunk == 0 ? ISAL_ZLIB : IGZIP_DEFLATE;
        next_chunk_ = chunk;
        used_ = have_ = 0;
        expected_ = produced_ = 0;
        return next_input();
    }

    // The next `n` bytes of the stream into `out`, or false with message() set.
    bool read(uint8_t *out, size_t n) {
        while (n > 0) {
            if (used_ == have_ && !inflate_more()) {
                if (message_.empty()) {
                    message_ = "not enough image data: the compressed stream ends before the "
                               "last row";
                }
                return false;
            }
            const size_t take = n < have_ - used_ ? n : have_ - used_;
            std::memcpy(out, buffer_.data() + used_, take);
            out += take;
            n -= take;
            used_ += take;
        }
        return true;
    }

    // After the last row: the stream must end in the IDATs. Data past the last row ends the
    // check (libpng's benign "too much image data").
    bool finish() {
        if (used_ < have_ || inflate_more()) {
            return true;  // bytes past the last row
        }
        if (message_.empty()) {
            return true;  // the stream ended
        }
        if (message_ == kInputsEnd) {
            message_ = "not enough image data: the compressed stream has no end";
        }
        return false;
    }

    // The bytes the rows wanted take: no piece inflates past them (finish() may go on).
    void expect(uint64_t bytes) { expected_ = bytes; }

private:
    static constexpr uint32_t kPiece = 64 * 1024;

    // Refills the buffer. False when the stream ended (message() empty) or on an error (message()
    // set). ISA-L is asked first and given the next chunk only when it produced nothing with its
    // input used up: it may hold output of input it already took.
    bool inflate_more() {
        used_ = have_ = 0;
        for (;;) {
            if (state_->block_state == ISAL_BLOCK_FINISH) {
                return false;
            }
            const uint32_t before = state_->avail_in;
            const uint64_t left = expected_ > produced_ ? expected_ - produced_ : kPiece;
            const uint32_t room = left < kPiece ? static_cast<uint32_t>(left) : kPiece;
            state_->next_out = buffer_.data();
            state_->avail_out = room;
            const int status = isal_inflate(state_.get());
            have_ = room - state_->avail_out;
            produced_ += have_;
            if (status < 0 || status == ISAL_NEED_DICT) {
                return fail(status == ISAL_INCORRECT_CHECKSUM ? "incorrect data check"
                            : status == ISAL_INVALID_WRAPPER || status == ISAL_UNSUPPORTED_METHOD
                                ? "incorrect header check"
                            : status == ISAL_NEED_DICT ? "need dictionary"
                                                       : "damaged compressed data");
            }
            if (have_ > 0) {
                return true;
            }
            if (state_->block_state == ISAL_BLOCK_FINISH) {
                return false;
            }
            if (state_->avail_in == 0) {
                if (!next_input()) {
                    return false;
                }
            } else if (state_->avail_in == before) {
                return fail("damaged compressed data");  // no progress: never loop on it
            }
        }
    }

    bool next_input() {
        const uint8_t *bytes;
        uint32_t length;
        if (!next_chunk(&bytes, &length)) {
            return false;
        }
        state_->next_in = const_cast<uint8_t *>(bytes);
        state_->avail_in = length;
        return true;
    }

    std::unique_ptr<inflate_state> state_;
    std::vector<uint8_t> buffer_;
    uint32_t used_ = 0, have_ = 0;
    uint64_t expected_ = 0, produced_ = 0;
};
#endif

// The bytes of a reconstructed row as the caller wants them: 16-bit samples in machine order.
inline void emit_row(const uint8_t *row, uint8_t *out, size_t n, int depth) {
    if (depth != 16) {
        std::memcpy(out, row, n);
        return;
    }
    const uint16_t probe = 1;
    uint8_t first;
    std::memcpy(&first, &probe, 1);
    if (first == 0) {
        std::memcpy(out, row, n);  // big-endian machine: PNG's order already
        return;
    }
    for (size_t i = 0; i + 1 < n; i += 2) {
        out[i] = row[i + 1];
        out[i + 1] = row[i];
    }
}

enum class Outcome { kDone, kError, kNotSeekable };

/* Rows [top, bottom) into `out`, either from the segment holding `top` (seekable files) or from
 * the first row. kNotSeekable: the file's segments do not hold what its index chunk promises (the
 * caller reads it from the start). */
inline Outcome decode_band(const uint8_t *data, const Layout &layout, uint32_t top,
                           uint32_t bottom, bool from_segment, uint8_t *out,
                           std::string *message) {
    const size_t n = layout.row_bytes, bpp = layout.pixel_bytes;
    // Three raw rows (a filter byte, then the bytes), rotating as previous, current and next,
    // and the readable byte after the last that unfilter.h asks for.
    std::vector<uint8_t> rows(3 * (n + 1) + 1, 0);
    uint8_t *prev = rows.data(), *cur = prev + n + 1, *next = cur + n + 1;
    uint32_t first = 0, checked_until = 0;
    size_t chunk = 0;
    uint32_t segment_crc = 0;
    if (from_segment) {
        chunk = top / layout.segment_rows;
        first = static_cast<uint32_t>(chunk * layout.segment_rows);
        const uint64_t end = uint64_t(first) + layout.segment_rows;
        checked_until = static_cast<uint32_t>(end < layout.height ? end : layout.height);
    }
    const Outcome failed = from_segment ? Outcome::kNotSeekable : Outcome::kError;
    RowInflater inflater(data, layout);
    if (!inflater.start(chunk)) {
        *message = inflater.message();
        return failed;
    }
    // Row y's raw bytes into `row`, checked against the first segment's index entry.
    auto take = [&](uint8_t *row, uint32_t y) -> Outcome {
        if (!inflater.read(row, n + 1)) {
            *message = inflater.message();
            return failed;
        }
        if (y < checked_until) {
            segment_crc = crc32_of(segment_crc, row, n + 1);
            if (y == first && y > 0 && row[0] != kNone && row[0] != kSub) {
                return Outcome::kNotSeekable;  // the segment's first row reads the row above
            }
            if (y + 1 == checked_until
                    && segment_crc != be32(data + layout.segment_crcs + 4 * chunk)) {
                return Outcome::kNotSeekable;  // not the start of the segment the index names
            }
        }
        return Outcome::kDone;
    };
    auto emit = [&](const uint8_t *row, uint32_t y) {
        if (y >= top) {
            emit_row(row + 1, out + size_t(y - top) * n, n, layout.depth);
        }
    };
    const bool pairs = paeth_pairs(bpp);
    const uint32_t last = bottom > checked_until ? bottom : checked_until;
    inflater.expect(uint64_t(last - first) * (n + 1));
    for (uint32_t y = first; y < last; ++y) {
        Outcome outcome = take(cur, y);
        if (outcome != Outcome::kDone) {
            return outcome;
        }
        if (y >= bottom) {
            continue;  // the rest of the first segment, inflated for its check only
        }
        if (pairs && cur[0] == kPaeth && y + 1 < bottom) {
            // Photos' PNGs are mostly Paeth rows: two of them in a row are undone together.
            outcome = take(next, y + 1);
            if (outcome != Outcome::kDone) {
                return outcome;
            }
            if (next[0] == kPaeth) {
                unfilter_paeth2(cur + 1, next + 1, prev + 1, n, bpp);
            } else {
                unfilter(kPaeth, cur + 1, prev + 1, n, bpp);
                if (!unfilter(next[0], next + 1, cur + 1, n, bpp)) {
                    *message = "bad adaptive filter value";
                    return failed;
                }
            }
            emit(cur, y);
            emit(next, y + 1);
            uint8_t *free_row = prev;
            prev = next;
            next = cur;
            cur = free_row;
            ++y;
            continue;
        }
        if (!unfilter(cur[0], cur + 1, prev + 1, n, bpp)) {
            *message = "bad adaptive filter value";
            return failed;
        }
        emit(cur, y);
        uint8_t *swap = cur;
        cur = prev;
        prev = swap;
    }
    if (bottom == layout.height && (!inflater.finish() || !inflater.check_rest())) {
        *message = inflater.message();
        return failed;
    }
    return Outcome::kDone;
}

}  // namespace fastpipe::png

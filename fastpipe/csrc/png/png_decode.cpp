/* fastpipe._png: decode a PNG's stored pixels, or only a band of its rows.
 *
 * Files of 8 or 16 bits per sample that are not interlaced (most datasets' PNGs) decode through
 * rows.h: zlib and fastpipe's own filters (SIMD for 3- and 4-byte pixels, where libpng's plain-C
 * Paeth filter took half of a decode), and seekable files (`fastpipe pack --transcode`) inflate
 * only the segments of their band. Every other file, and every file whose chunk structure rows.h
 * does not take, decodes with the system's libpng, which also decides what is damage there.
 *
 * PNG rows are filtered against the row above and deflated as one stream, so rows can only be
 * read in order; but a non-interlaced file need not be inflated past the last row wanted, and the
 * rows above the band are read into one scratch row. The pixels are what the file stores (no
 * palette expansion, no tRNS to alpha, no gamma), 1/2/4-bit grey scaled to 0..255 as PIL does,
 * sub-byte palette indices one per byte, 16-bit samples in the machine's byte order. The caller
 * (fastpipe/data/_png.py) allocates the output from the header it parsed itself; this module
 * checks libpng's reading of the header against it, so a mismatch is an error, never an overrun.
 *
 * What it refuses, it refuses as one of three errors, so that the caller knows whether to ask
 * another decoder: DamagedError (a ValueError) for a file that breaks the PNG format (a CRC
 * error in any chunk, ancillary ones included, image data that ends early, an invalid stream or
 * filter): the verdict is final; MemoryError when the machine has no memory for it; a plain
 * ValueError for arguments that do not describe the file and for libpng's own limits, which a
 * valid file can pass (the caller may ask another decoder then).
 *
 * C++ only because setuptools compiles the package's other sources as C++; no torch headers.
 * libpng reports errors by longjmp: only trivially destructible objects live between setjmp and
 * longjmp, and whatever is malloc'd is reachable from `state` to be freed on the error path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <png.h>

#include <string>

#include "rows.h"

#include <cctype>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct Source {
    const unsigned char *data;
    size_t size;
    size_t pos;
};

// What a refusal is (see the top of the file): damage unless said otherwise.
enum class Refusal { kDamage, kMemory, kNotDamage };

struct State {
    Source source;
    unsigned char *scratch;  // one row, for the rows above the band
    char message[256];
    Refusal refusal;
};

// png_error for what is not the file's damage: arguments that do not describe it, a limit.
[[noreturn]] void refuse(png_structp png, Refusal refusal, const char *message) {
    static_cast<State *>(png_get_error_ptr(png))->refusal = refusal;
    png_error(png, message);
}

void read_bytes(png_structp png, png_bytep out, size_t length) {
    auto *source = static_cast<Source *>(png_get_io_ptr(png));
    if (length > source->size - source->pos) {
        png_error(png, "truncated file: the data ends inside a chunk");
    }
    std::memcpy(out, source->data + source->pos, length);
    source->pos += length;
}

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
    auto *state = static_cast<State *>(png_get_error_ptr(png));
    std::snprintf(state->message, sizeof(state->message), "%s", message);
    if (state->refusal == Refusal::kDamage) {
        // libpng's own words for its allocations ("Out of memory", "Insufficient memory ...")
        // and its limits ("... exceeds user limit"), which a valid file can meet.
        std::string lower(message);
        for (char &c : lower) {
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        }
        if (lower.find("memory") != std::string::npos) {
            state->refusal = Refusal::kMemory;
        } else if (lower.find("user limit") != std::string::npos
                   || lower.find("for this architecture") != std::string::npos) {
            state->refusal = Refusal::kNotDamage;
        }
    }
    png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

struct Expected {
    uint32_t height, width;
    int channels, bytes_per_sample;
    uint32_t top, bottom;
    unsigned long long max_pixels;
    bool seekable;  // the caller trusts a seekable file's index (fastpipe wrote the file)
};

/* Decodes rows [top, bottom) into `out` (bottom - top rows of width * channels * bytes_per_sample
 * bytes). Returns 0, or -1 with state->message set. */
int decode(State *state, const Expected &want, unsigned char *out) {
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, on_error, on_warning);
    if (png == nullptr) {
        std::snprintf(state->message, sizeof(state->message), "out of memory");
        state->refusal = Refusal::kMemory;
        return -1;
    }
    png_infop info = png_create_info_struct(png);
    if (info == nullptr) {
        png_destroy_read_struct(&png, nullptr, nullptr);
        std::snprintf(state->message, sizeof(state->message), "out of memory");
        state->refusal = Refusal::kMemory;
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_read_struct(&png, &info, nullptr);
        std::free(state->scratch);
        state->scratch = nullptr;
        return -1;
    }
    png_set_read_fn(png, &state->source, read_bytes);
    // The caller checked the pixel budget from the same IHDR; libpng's own limits are wider.
    png_set_user_limits(png, 0x7fffffffU, 0x7fffffffU);
    // A CRC error in an ancillary chunk is an error too (libpng's default drops the chunk with a
    // warning): the file is damaged, and rows.h refuses it the same way.
    png_set_crc_action(png, PNG_CRC_DEFAULT, PNG_CRC_ERROR_QUIT);
    png_read_info(png, info);

    png_uint_32 width = 0, height = 0;
    int depth = 0, color_type = 0, interlace = 0;
    png_get_IHDR(png, info, &width, &height, &depth, &color_type, &interlace, nullptr, nullptr);
    if ((unsigned long long)width * height > want.max_pixels) {
        refuse(png, Refusal::kNotDamage, "the image declares more pixels than the pixel budget");
    }
    if (color_type == PNG_COLOR_TYPE_GRAY && depth < 8) {
        png_set_expand_gray_1_2_4_to_8(png);  // scaled to 0..255: 1-bit 0/255, 2-bit *85, 4-bit *17
    } else if (depth < 8) {
        png_set_packing(png);  // palette indices, one per byte, not scaled
    }
    if (depth == 16) {
        const uint16_t probe = 1;
        unsigned char first;
        std::memcpy(&first, &probe, 1);
        if (first == 1) {
            png_set_swap(png);  // PNG stores big-endian samples
        }
    }
    const int passes = interlace == PNG_INTERLACE_NONE ? 1 : png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const size_t row_bytes = (size_t)want.width * want.channels * want.bytes_per_sample;
    if (width != want.width || height != want.height
            || png_get_channels(png, info) != want.channels
            || png_get_bit_depth(png, info) != 8 * want.bytes_per_sample
            || png_get_rowbytes(png, info) != row_bytes) {
        refuse(png, Refusal::kNotDamage,
               "the header libpng read differs from the one parsed before the decode");
    }
    if (passes > 1) {
        // Every pass fills pixels of every row: the whole image is decoded (top is 0 and bottom
        // the height here; the caller slices).
        if (want.top != 0 || want.bottom != height) {
            refuse(png, Refusal::kNotDamage, "an interlaced image is decoded whole");
        }
        for (int pass = 0; pass < passes; ++pass) {
            for (png_uint_32 y = 0; y < height; ++y) {
                png_read_row(png, out + y * row_bytes, nullptr);
            }
        }
    } else {
        if (want.top > 0) {
            state->scratch = static_cast<unsigned char *>(std::malloc(row_bytes));
            if (state->scratch == nullptr) {
                refuse(png, Refusal::kMemory, "out of memory");
            }
            for (png_uint_32 y = 0; y < want.top; ++y) {
                png_read_row(png, state->scratch, nullptr);
            }
        }
        for (png_uint_32 y = want.top; y < want.bottom; ++y) {
            png_read_row(png, out + (y - want.top) * row_bytes, nullptr);
        }
    }
    if (want.bottom == height) {
        png_read_end(png, nullptr);  // the rest of the stream and the chunks after it are checked
    }
    png_destroy_read_struct(&png, &info, nullptr);
    std::free(state->scratch);
    state->scratch = nullptr;
    return 0;
}

constexpr int kNotMine = 1;

int decode_layout(const uint8_t *data, const fastpipe::png::Layout &layout, const Expected &want,
                  uint8_t *out, std::string *message);

PyObject *damaged_error = nullptr;  // fastpipe._png.DamagedError

/* Rows [top, bottom) through rows.h: 0, -1 with `message` and `refusal` set, or kNotMine for a
 * file libpng decodes. */
int decode_own(const uint8_t *data, size_t size, const Expected &want, uint8_t *out,
               std::string *message, Refusal *refusal) noexcept {
    try {
        fastpipe::png::Layout layout;
        if (!fastpipe::png::read_layout(data, size, &layout) || layout.width != want.width
                || layout.height != want.height
                || layout.pixel_bytes != size_t(want.channels) * want.bytes_per_sample
                || layout.depth != 8 * want.bytes_per_sample
                || layout.row_bytes + 1 > 0xffffffffULL) {
            // libpng decodes it (rows past 4 GiB too, which zlib's 32-bit counts do not
            // take in one call), or says how it differs from the caller's reading.
            return kNotMine;
        }
        if ((unsigned long long)layout.width * layout.height > want.max_pixels) {
            *message = "the image declares more pixels than the pixel budget";
            *refusal = Refusal::kNotDamage;
            return -1;
        }
        const int status = decode_layout(data, layout, want, out, message);
        if (status != 0 && *message == "out of memory") {  // zlib's or ISA-L's state
            *refusal = Refusal::kMemory;
        }
        return status;
    } catch (const std::bad_alloc &) {
        *message = "out of memory";
        *refusal = Refusal::kMemory;
        return -1;
    }
}

int decode_layout(const uint8_t *data, const fastpipe::png::Layout &layout, const Expected &want,
                  uint8_t *out, std::string *message) {
    using fastpipe::png::Outcome;
    // The index of a seekable file is only followed where the caller says fastpipe wrote the
    // file: its CRCs prove that a segment inflates on its own to the bytes recorded beside it,
    // not that those are the bytes a decode from the first row gives, so a crafted file could
    // show fastpipe other pixels than every other decoder.
    if (want.seekable && layout.segment_rows > 0 && want.top >= layout.segment_rows) {
        const Outcome seek = fastpipe::png::decode_band(data, layout, want.top, want.bottom, true,
                                                        out, message);
        if (seek == Outcome::kDone) {
            return 0;
        }
    }
    const Outcome outcome = fastpipe::png::decode_band(data, layout, want.top, want.bottom, false,
                                                       out, message);
    return outcome == Outcome::kDone ? 0 : -1;
}

}  // namespace

PyDoc_STRVAR(decode_doc,
"decode(data, out, height, width, channels, bytes_per_sample, top, bottom, max_pixels,\n"
"       seekable=False) -> None\n"
"\n"
"Writes rows [top, bottom) of the PNG ``data``'s stored pixels into the writable buffer ``out``\n"
"((bottom - top) * width * channels * bytes_per_sample bytes), with the GIL released. The\n"
"arguments are the caller's reading of the IHDR; the file's must agree. A non-interlaced file\n"
"is not inflated past row ``bottom`` (and the rest is checked when ``bottom`` is the height);\n"
"an interlaced one must be asked whole. ``seekable``: follow the index of a seekable PNG (pass\n"
"it only for files fastpipe wrote: a transcoded pack). Raises DamagedError (a ValueError)\n"
"for a damaged file, MemoryError when memory runs out, ValueError for arguments that do not\n"
"describe the file.");

static PyObject *py_decode(PyObject *, PyObject *args) {
    Py_buffer data, out;
    unsigned int height, width, top, bottom;
    int channels, bytes_per_sample;
    unsigned long long max_pixels;
    int seekable = 0;
    if (!PyArg_ParseTuple(args, "y*w*IIiiIIK|p:decode", &data, &out, &height, &width, &channels,
                          &bytes_per_sample, &top, &bottom, &max_pixels, &seekable)) {
        return nullptr;
    }
    const Expected want{height, width, channels, bytes_per_sample, top, bottom, max_pixels,
                        seekable != 0};
    unsigned long long need = 0;
    const bool sized = top < bottom && channels >= 1 && channels <= 4
                       && (bytes_per_sample == 1 || bytes_per_sample == 2)
                       && !__builtin_mul_overflow((unsigned long long)(bottom - top), width, &need)
                       && !__builtin_mul_overflow(need, (unsigned long long)channels, &need)
                       && !__builtin_mul_overflow(need, (unsigned long long)bytes_per_sample,
                                                  &need);
    if (!sized || bottom > height || (unsigned long long)out.len != need || out.readonly) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError,
                            "decode: the output buffer does not hold rows [%u, %u) of a %ux%ux%d "
                            "image of %d-byte samples", top, bottom, height, width, channels,
                            bytes_per_sample);
    }
    State state{};
    state.source = Source{static_cast<const unsigned char *>(data.buf), (size_t)data.len, 0};
    int status;
    bool own;
    std::string own_error;
    Py_BEGIN_ALLOW_THREADS
    status = decode_own(static_cast<const uint8_t *>(data.buf), (size_t)data.len, want,
                        static_cast<uint8_t *>(out.buf), &own_error, &state.refusal);
    own = status != kNotMine;
    if (!own) {
        status = decode(&state, want, static_cast<unsigned char *>(out.buf));
    } else if (status != 0) {
        std::snprintf(state.message, sizeof(state.message), "%s", own_error.c_str());
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (status != 0) {
        PyObject *type = state.refusal == Refusal::kMemory      ? PyExc_MemoryError
                         : state.refusal == Refusal::kNotDamage ? PyExc_ValueError
                                                                : damaged_error;
        return PyErr_Format(type, "%s: %s", own ? "PNG" : "libpng", state.message);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode", py_decode, METH_VARARGS, decode_doc},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastpipe._png",
    "PNG decoding of stored pixels, or of a band of rows, with the system's libpng "
    "(see png_decode.cpp).", -1, methods, nullptr, nullptr, nullptr, nullptr,
};

extern "C" PyMODINIT_FUNC PyInit__png(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr) {
        return nullptr;
    }
    damaged_error = PyErr_NewExceptionWithDoc(
        "fastpipe._png.DamagedError",
        "The PNG breaks the format (a CRC error, image data that ends early, an invalid stream): "
        "the verdict is final, no other decoder is asked.", PyExc_ValueError, nullptr);
    if (damaged_error == nullptr || PyModule_AddObjectRef(m, "DamagedError", damaged_error) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
#if defined(FASTPIPE_PNG_ISAL)
    const char *inflater = "isa-l";
#else
    const char *inflater = "zlib";
#endif
    // INFLATE: what inflates fastpipe's own rows (libpng's always use zlib).
    if (PyModule_AddStringConstant(m, "LIBPNG_VERSION", PNG_LIBPNG_VER_STRING) < 0
            || PyModule_AddStringConstant(m, "INFLATE", inflater) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}

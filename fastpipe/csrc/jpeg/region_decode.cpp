/* fastpipe._jpeg: decode only a rectangle of a JPEG, at a reduced DCT scale, with libjpeg-turbo.
 *
 * libjpeg-turbo can skip whole output rows (jpeg_skip_scanlines) and limit the inverse
 * DCT, upsampling and colour conversion to a column range (jpeg_crop_scanline). Decoding stops
 * after the rectangle's last row, so the entropy decoding of the rows below it is skipped too.
 * No wheel-shipped binding exposes this (simplejpeg and imagecodecs decode whole images), so
 * fastpipe builds this small module against the system's libjpeg-turbo when its headers are
 * present, version 2.1 or newer (Debian/Ubuntu: libjpeg62-turbo-dev / libjpeg-turbo8-dev); see
 * setup.py.
 *
 * Strictness matches simplejpeg's strict=True (TurboJPEG's TJFLAG_STOPONWARNING): a libjpeg
 * warning, such as a truncated file or corrupt entropy data, is an error, and the caller falls
 * back to its whole-image path, which reports or recovers as before.
 *
 * This file holds the module's bindings; the decode core is decode_core.h, the lossless rewrite
 * transcode.h, the train crop's plan train_plan.h.
 *
 * C++ only because torch's BuildExtension compiles every non-CUDA source as C++; no torch headers,
 * so it builds in about a second. Only trivially destructible objects live between setjmp and
 * longjmp.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "../image/resize_kernel.h"
#include "decode_core.h"  // the decode core: error handling, the pixel budget, region decode
#include "train_plan.h"
#include "transcode.h"  // the lossless rewrite for crops

PyDoc_STRVAR(transcode_doc,
"transcode(data, max_pixels=178956970) -> bytes\n"
"\n"
"``data`` rewritten losslessly (DCT coefficients copied, as jpegtran does) as a baseline JPEG with\n"
"a restart marker after every MCU, optimized Huffman tables, and its EXIF and ICC markers. Every\n"
"decoder reads it as the same image; decode_region then entropy-decodes only the MCUs around the\n"
"crop. Progressive files become baseline. Raises ValueError for what libjpeg-turbo rejects or\n"
"warns about, and for a frame declaring more than max_pixels pixels (the pixel budget,\n"
"checked from the frame header before anything is allocated).");

static PyObject *py_transcode(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    unsigned long long max_pixels = kDefaultMaxPixels;
    if (!PyArg_ParseTuple(args, "y*|K:transcode", &view, &max_pixels)) {
        return nullptr;
    }
    strict_error_mgr err;
    unsigned char *out = nullptr;
    size_t out_size = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = transcode_for_crops(static_cast<const unsigned char *>(view.buf),
                                 (unsigned long)view.len, &out, &out_size, max_pixels, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status != 0) {
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", err.message);
    }
    PyObject *result = PyBytes_FromStringAndSize(reinterpret_cast<const char *>(out),
                                                 (Py_ssize_t)out_size);
    std::free(out);
    return result;
}

PyDoc_STRVAR(decode_region_doc,
"decode_region(data, scale_denom, top, left, height, width, fast_upsample,\n"
"              max_pixels=178956970)\n"
"    -> (pixels: bytearray, row_stride: int, column: int)\n"
"\n"
"The RGB pixels of the rectangle at (top, left) of the JPEG ``data`` decoded at 1/scale_denom\n"
"of its size (1, 2, 4 or 8; the decoded image is ceil(H / scale_denom) x ceil(W / scale_denom)).\n"
"Row r of the rectangle starts at byte r * row_stride + 3 * column of ``pixels``: libjpeg-turbo\n"
"decodes whole iMCU columns, and the rows are returned as it wrote them, not copied; with\n"
"numpy, ``np.frombuffer(pixels, np.uint8, height * row_stride).reshape(height, -1, 3)\n"
"[:, column:column + width]``. Bytes after the last row are zero.\n"
"Accurate integer DCT; fast_upsample replicates chroma samples instead of interpolating them.\n"
"A file from transcode() (a restart marker after every MCU) is entropy-decoded only around the\n"
"rectangle; its pixels are the same.\n"
"Raises ValueError for anything libjpeg-turbo warns about or rejects (strict, like simplejpeg's\n"
"strict=True), for colour spaces other than YCbCr, RGB and greyscale, and for a rectangle\n"
"outside the decoded image, and for a frame declaring more than max_pixels pixels (the pixel\n"
"budget, checked from the frame header before anything is allocated). Crops narrower than two\n"
"iMCU columns are decoded two iMCU columns wide (libjpeg-turbo 2.1.5 mishandles narrower ones).");

/* ValueError for a scale or a rectangle decode_region cannot take, else true with `req` set. */
static bool make_request(region_request *req, const Py_buffer &view, int scale_denom, long top,
                         long left, long height, long width, int fast_upsample,
                         unsigned long long max_pixels) {
    if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
        PyErr_Format(PyExc_ValueError, "scale_denom must be 1, 2, 4 or 8, got %d", scale_denom);
        return false;
    }
    if (top < 0 || left < 0 || height < 1 || width < 1 || height > 65535 || width > 65535 ||
        top > 65535 || left > 65535) {
        PyErr_Format(PyExc_ValueError,
                     "region %ldx%ld at (%ld, %ld): need top, left >= 0 and a size of 1 to 65535 "
                     "pixels a side", height, width, top, left);
        return false;
    }
    req->data = static_cast<const unsigned char *>(view.buf);
    req->size = (unsigned long)view.len;
    req->max_pixels = max_pixels;
    req->scale_denom = scale_denom;
    req->top = (unsigned int)top;
    req->left = (unsigned int)left;
    req->height = (unsigned int)height;
    req->width = (unsigned int)width;
    req->fast_upsample = fast_upsample;
    req->capacity = 0;
    req->out = nullptr;
    req->row_pixels = req->column = 0;
    return true;
}

static PyObject *py_decode_region(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int scale_denom, fast_upsample;
    long top, left, height, width;
    unsigned long long max_pixels = kDefaultMaxPixels;
    if (!PyArg_ParseTuple(args, "y*illllp|K:decode_region", &view, &scale_denom, &top, &left,
                          &height, &width, &fast_upsample, &max_pixels)) {
        return nullptr;
    }
    region_request req;
    if (!make_request(&req, view, scale_denom, top, left, height, width, fast_upsample,
                      max_pixels)) {
        PyBuffer_Release(&view);
        return nullptr;
    }
    std::vector<unsigned char> segments;
    strict_error_mgr err;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = prepare(&req, segments, &err);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", err.message);
    }
    PyObject *out = PyByteArray_FromStringAndSize(nullptr, (Py_ssize_t)req.capacity);
    if (out == nullptr) {
        PyBuffer_Release(&view);
        return nullptr;
    }
    req.out = reinterpret_cast<unsigned char *>(PyByteArray_AS_STRING(out));
    Py_BEGIN_ALLOW_THREADS
    status = decode_region(&req, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status != 0) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", err.message);
    }
    /* The rows libjpeg wrote past the region, and the rest of the upper-bound capacity, are zeroed
     * rather than handed to Python as whatever the heap held. */
    const size_t used = (size_t)req.height * req.row_pixels * 3;
    std::memset(req.out + used, 0, req.capacity - used);
    return Py_BuildValue("(Nnn)", out, (Py_ssize_t)req.row_pixels * 3, (Py_ssize_t)req.column);
}

PyDoc_STRVAR(decode_resize_doc,
"decode_resize(data, scale_denom, region, fast_upsample, at, image_size, out, out_at,\n"
"              out_image_size, flip, filter, max_pixels=178956970) -> None\n"
"\n"
"decode_region(data, scale_denom, *region, fast_upsample) followed by fastpipe._resize.resize\n"
"of its pixels, in one call that releases the GIL once: loader threads contend for the GIL at\n"
"every release. region = (top, left, height, width) in the 1/scale_denom-decoded image; the\n"
"decoded rectangle is the box at `at` = (top, left) of an image of `image_size` = (height,\n"
"width) for the resize (a train crop is an image of its own: at (0, 0), of its own size).\n"
"Writes into `out`, a C-contiguous (3, oh, ow) uint8 buffer, the oh x ow box at `out_at` of\n"
"that image resized to `out_image_size`, mirrored left-right when `flip`; filter 0 bilinear,\n"
"1 bicubic. The pixels are those of the two calls. Raises ValueError where decode_region does\n"
"(the caller then decodes the whole image) and for boxes that do not fit; RuntimeError when the\n"
"rectangle lacks a pixel the output reads (a caller's error, see _resize.input_box).");

/* Box (resize_kernel.h) from Python numbers, or ValueError. */
static bool resize_box(Box *box, long top, long left, long height, long width, long full_height,
                       long full_width, const char *which) {
    const auto within = [](long value, long lowest) { return value >= lowest && value <= kMaxSide; };
    if (!within(full_height, 1) || !within(full_width, 1) || !within(top, 0) || !within(left, 0) ||
        !within(height, 1) || !within(width, 1) || top + height > full_height ||
        left + width > full_width) {
        PyErr_Format(PyExc_ValueError,
                     "%s: a %ldx%ld box at (%ld, %ld) does not fit an image of %ldx%ld (sides up "
                     "to 2**24)", which, height, width, top, left, full_height, full_width);
        return false;
    }
    *box = Box{top, left, height, width, full_height, full_width};
    return true;
}

/* Regions up to this size keep their buffer in the thread for the next call. */
constexpr size_t kKeptRegionBytes = size_t{16} << 20;

/* out: a writable C-contiguous (3, height, width) uint8 buffer, held in `out` on success; else
 * ValueError. */
static bool get_planes(PyObject *object, Py_buffer *out, long *height, long *width) {
    if (PyObject_GetBuffer(object, out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        if (out->ndim == 3 && out->shape[0] == 3 && out->itemsize == 1 &&
            (out->format == nullptr || std::strcmp(out->format, "B") == 0)) {
            *height = (long)out->shape[1];
            *width = (long)out->shape[2];
            return true;
        }
        PyBuffer_Release(out);
    }
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "out must be a writable C-contiguous (3, height, width) "
                    "uint8 array");
    return false;
}

enum DecodeResizeResult { kDone = 0, kRefused = -1, kOutOfMemory = -2, kOutside = -3 };

/* Without the GIL: the region of `req` decoded (prepare, then decode_region) and resized into
 * `out`. kRefused leaves libjpeg-turbo's reason in err->message; kOutside means the region lacks
 * a pixel the output reads. */
static DecodeResizeResult decode_and_resize(region_request *req, const Box &source, uint8_t *out,
                                            const Box &output, bool flip, int filter,
                                            strict_error_mgr *err) {
    static thread_local std::vector<unsigned char> kept;
    std::vector<unsigned char> segments, large;
    try {
        if (prepare(req, segments, err) != 0) {
            return kRefused;
        }
        std::vector<unsigned char> &pixels = req->capacity <= kKeptRegionBytes ? kept : large;
        if (pixels.size() < req->capacity) {
            pixels.resize(req->capacity);
        }
        req->out = pixels.data();
        if (decode_region(req, err) != 0) {
            return kRefused;
        }
        const long row_stride = (long)req->row_pixels * 3;
        const ResizeJob job{req->out + (size_t)req->column * 3, row_stride, source, out, output,
                            flip, filter};
        return resize_rgb_to_planes(job) ? kDone : kOutside;
    } catch (const std::bad_alloc &) {
        return kOutOfMemory;
    }
}

static PyObject *outside_error() {
    PyErr_SetString(PyExc_RuntimeError,
                    "the region does not hold every input pixel out needs (see "
                    "fastpipe._resize.input_box)");
    return nullptr;
}

static bool check_filter(int filter) {
    if (filter == kBilinear || filter == kBicubic) {
        return true;
    }
    PyErr_Format(PyExc_ValueError, "filter must be 0 (bilinear) or 1 (bicubic), got %d", filter);
    return false;
}

static PyObject *py_decode_resize(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, out;
    PyObject *out_object;
    int scale_denom, fast_upsample, flip, filter;
    long top, left, height, width;
    Box source{}, output{};
    unsigned long long max_pixels = kDefaultMaxPixels;
    if (!PyArg_ParseTuple(args, "y*i(llll)p(ll)(ll)O(ll)(ll)pi|K:decode_resize", &view,
                          &scale_denom, &top, &left, &height, &width, &fast_upsample, &source.top,
                          &source.left, &source.full_height, &source.full_width, &out_object,
                          &output.top,
                          &output.left, &output.full_height, &output.full_width, &flip, &filter,
                          &max_pixels)) {
        return nullptr;
    }
    region_request req;
    bool ok = make_request(&req, view, scale_denom, top, left, height, width, fast_upsample,
                           max_pixels) &&
              resize_box(&source, source.top, source.left, height, width, source.full_height,
                         source.full_width, "at/image_size") &&
              check_filter(filter);
    long out_height = 0, out_width = 0;
    const bool have_out = ok && get_planes(out_object, &out, &out_height, &out_width);
    ok = have_out && resize_box(&output, output.top, output.left, out_height, out_width,
                                output.full_height, output.full_width, "out");
    if (!ok) {
        PyBuffer_Release(&view);
        if (have_out) PyBuffer_Release(&out);
        return nullptr;
    }
    strict_error_mgr err;
    DecodeResizeResult result;
    Py_BEGIN_ALLOW_THREADS
    result = decode_and_resize(&req, source, static_cast<uint8_t *>(out.buf), output, flip != 0,
                               filter, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    switch (result) {
        case kDone: Py_RETURN_NONE;
        case kOutOfMemory: return PyErr_NoMemory();
        case kOutside: return outside_error();
        default: return PyErr_Format(PyExc_ValueError, "libjpeg-turbo: %s", err.message);
    }
}

PyDoc_STRVAR(decode_train_doc,
"decode_train(data, seed, out, scale, ratio, hflip, reducing_gap, fast_upsample, filter,\n"
"             max_pixels=178956970) -> bool\n"
"\n"
"fastpipe.data.ImageDecoder(train=True) on the JPEG ``data`` with the generator of a sample's\n"
"``seed`` (fastpipe.data._random.reseeded(seed)), in one call that releases the GIL once: the\n"
"crop drawn from the same numbers as torch.rand(23, dtype=torch.float64) after manual_seed(seed)\n"
"(RandomResizedCrop's scale=(lo, hi) and ratio=(lo, hi)), the same DCT scale for reducing_gap,\n"
"the flip with probability hflip, then decode_resize into ``out``, a C-contiguous (3, oh, ow)\n"
"uint8 buffer. True when written; False, with ``out`` unspecified, for data that ImageDecoder\n"
"would not decode this way (not a JPEG, no end-of-image marker, over max_pixels, or refused\n"
"by the region decode): the caller then takes ImageDecoder's own path, which draws the same\n"
"crop (and refuses an image over the pixel budget).");

static bool train_options(train_plan::Options *o, double scale_lo, double scale_hi,
                          double ratio_lo, double ratio_hi, double hflip, double reducing_gap) {
    /* fastpipe.Recipe's ranges (recipe.py): within them no size the plan computes overflows. */
    if (!(scale_lo > 0.0 && scale_lo <= scale_hi && scale_hi <= 1.0) ||
        !(ratio_lo >= 1e-3 && ratio_lo <= ratio_hi && ratio_hi <= 1e3) ||
        !(reducing_gap >= 1.0) || !(hflip >= 0.0 && hflip <= 1.0)) {
        PyErr_Format(PyExc_ValueError, "need 0 < scale[0] <= scale[1] <= 1, 0 < ratio[0] <= ratio[1] "
                     "within [0.001, 1000], reducing_gap >= 1 and 0 <= hflip <= 1, got scale "
                     "(%g, %g), "
                     "ratio (%g, %g), reducing_gap %g, hflip %g",
                     scale_lo, scale_hi, ratio_lo, ratio_hi, reducing_gap, hflip);
        return false;
    }
    o->scale_lo = scale_lo;
    o->scale_hi = scale_hi;
    o->ratio_lo = ratio_lo;
    o->ratio_hi = ratio_hi;
    o->hflip = hflip;
    o->reducing_gap = reducing_gap;
    return true;
}

static PyObject *py_decode_train(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view, out;
    PyObject *out_object;
    unsigned long long seed;
    double scale_lo, scale_hi, ratio_lo, ratio_hi, hflip, reducing_gap;
    int fast_upsample, filter;
    unsigned long long max_pixels = kDefaultMaxPixels;
    if (!PyArg_ParseTuple(args, "y*KO(dd)(dd)ddpi|K:decode_train", &view, &seed, &out_object,
                          &scale_lo, &scale_hi, &ratio_lo, &ratio_hi, &hflip, &reducing_gap,
                          &fast_upsample, &filter, &max_pixels)) {
        return nullptr;
    }
    train_plan::Options options{};
    Box output{};
    bool ok = train_options(&options, scale_lo, scale_hi, ratio_lo, ratio_hi, hflip,
                            reducing_gap) && check_filter(filter);
    const bool have_out = ok && get_planes(out_object, &out, &options.out_height,
                                           &options.out_width);
    ok = have_out && resize_box(&output, 0, 0, options.out_height, options.out_width,
                                options.out_height, options.out_width, "out");
    const auto *bytes = static_cast<const unsigned char *>(view.buf);
    const size_t size = (size_t)view.len;
    long height = 0, width = 0;
    /* An image over the pixel budget is ImageDecoder's to refuse (it names the file). */
    bool jpeg = ok && train_plan::frame_size(bytes, size, &height, &width) &&
                bytes[size - 2] == 0xFF && bytes[size - 1] == 0xD9 &&
                (unsigned long long)height * (unsigned long long)width <= max_pixels;
    region_request req;
    Box source{};
    bool flip = false;
    if (jpeg) {
        const train_plan::Plan plan = train_plan::plan(height, width, seed, options);
        const train_plan::Box &r = plan.region;
        jpeg = make_request(&req, view, plan.k, r.top, r.left, r.height, r.width, fast_upsample,
                            max_pixels);
        if (!jpeg) {
            PyErr_Clear();  // a region decode_resize refuses too: ImageDecoder's own path
        }
        source = Box{0, 0, r.height, r.width, r.height, r.width};
        flip = plan.flip;
    }
    if (!ok || !jpeg) {
        PyBuffer_Release(&view);
        if (have_out) PyBuffer_Release(&out);
        if (!ok) return nullptr;
        Py_RETURN_FALSE;
    }
    strict_error_mgr err;
    DecodeResizeResult result;
    Py_BEGIN_ALLOW_THREADS
    result = decode_and_resize(&req, source, static_cast<uint8_t *>(out.buf), output, flip, filter,
                               &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    PyBuffer_Release(&out);
    switch (result) {
        case kDone: Py_RETURN_TRUE;
        case kOutOfMemory: return PyErr_NoMemory();
        case kOutside: return outside_error();
        default: Py_RETURN_FALSE;
    }
}

PyDoc_STRVAR(train_plan_doc,
"_train_plan(height, width, seed, out_size, scale, ratio, hflip, reducing_gap)\n"
"    -> (scale_denom, (top, left, height, width), flip)\n"
"\n"
"What decode_train plans for an image of height x width: the DCT reduction, the crop in the\n"
"1/scale_denom-decoded image and the flip (for tests against ImageDecoder._plan and _region).");

static PyObject *py_train_plan(PyObject *self, PyObject *args) {
    (void)self;
    long height, width;
    unsigned long long seed;
    train_plan::Options o{};
    double scale_lo, scale_hi, ratio_lo, ratio_hi, hflip, reducing_gap;
    if (!PyArg_ParseTuple(args, "llK(ll)(dd)(dd)dd:_train_plan", &height, &width, &seed,
                          &o.out_height, &o.out_width, &scale_lo, &scale_hi, &ratio_lo, &ratio_hi,
                          &hflip, &reducing_gap) ||
        !train_options(&o, scale_lo, scale_hi, ratio_lo, ratio_hi, hflip, reducing_gap)) {
        return nullptr;
    }
    if (height < 1 || width < 1 || height > 65535 || width > 65535 || o.out_height < 1 ||
        o.out_width < 1 || o.out_height > kMaxSide || o.out_width > kMaxSide) {
        return PyErr_Format(PyExc_ValueError, "need sizes of at least 1 (images up to 65535, "
                            "outputs up to 2**24)");
    }
    const train_plan::Plan p = train_plan::plan(height, width, seed, o);
    return Py_BuildValue("(i(llll)O)", p.k, p.region.top, p.region.left, p.region.height,
                         p.region.width, p.flip ? Py_True : Py_False);
}

PyDoc_STRVAR(huffman_doc,
"_huffman(enabled=None) -> (enabled: bool, decodes: int)\n"
"\n"
"Private, for tests and benchmarks. With a bool, sets whether decode_region entropy-decodes\n"
"sequential JPEGs with fastpipe's Huffman decoder (huffman_decoder.h) or libjpeg-turbo's own, for\n"
"every thread of the process. Returns the setting before the call and how many decodes have used\n"
"fastpipe's decoder so far.");

static PyObject *py_huffman(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *on = Py_None;
    if (!PyArg_ParseTuple(args, "|O:_huffman", &on)) {
        return nullptr;
    }
    bool before = fast_huffman::enabled().load();
    if (on != Py_None) {
        if (!PyBool_Check(on)) {
            return PyErr_Format(PyExc_TypeError, "_huffman takes True, False or None");
        }
        before = fast_huffman::enabled().exchange(on == Py_True);
    }
    return Py_BuildValue("(Nk)", PyBool_FromLong(before), fast_huffman::installs().load());
}

static PyMethodDef methods[] = {
    {"decode_region", py_decode_region, METH_VARARGS, decode_region_doc},
    {"decode_resize", py_decode_resize, METH_VARARGS, decode_resize_doc},
    {"decode_train", py_decode_train, METH_VARARGS, decode_train_doc},
    {"_train_plan", py_train_plan, METH_VARARGS, train_plan_doc},
    {"_huffman", py_huffman, METH_VARARGS, huffman_doc},
    {"transcode", py_transcode, METH_VARARGS, transcode_doc},
    {nullptr, nullptr, 0, nullptr},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastpipe._jpeg",
    "Region decoding of JPEGs with the system's libjpeg-turbo (see region_decode.cpp).", -1, methods,
    nullptr, nullptr, nullptr, nullptr,
};

extern "C" PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr) {
        return nullptr;
    }
    if (PyModule_AddIntConstant(m, "LIBJPEG_TURBO_VERSION_NUMBER", LIBJPEG_TURBO_VERSION_NUMBER) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}

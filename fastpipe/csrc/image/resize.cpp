/* fastpipe._resize: antialiased bilinear or bicubic resize of an RGB crop, straight to planar
 * (C, H, W).
 *
 * The filters are PIL's and torch's antialiased bilinear and bicubic (F.interpolate(mode=...,
 * antialias=True), torchvision.transforms.v2.Resize): a triangle or Keys' cubic (a = -0.5)
 * stretched by the scale when shrinking, with the same taps and weights. It differs in how the
 * sum is rounded: the rows are summed exactly with 14-bit fixed-point weights and kept with 6
 * fraction bits, the columns summed with 14-bit weights in integers, and each value rounded (and,
 * for bicubic, clamped to 0-255) once at the end, where PIL rounds and clips a fixed-point result
 * after each pass and torch's uint8 kernel does too. Past an 8x shrink on either axis that axis
 * is summed in float instead (14 bits would lose precision over that many taps). Outputs are
 * within 0.05 of the exact filter before that rounding (bicubic within 0.1), and within a grey
 * level of both where nothing overshoots.
 *
 * Why not torch's kernel: for the CPU image path this resize is a fifth of a train sample's CPU
 * time, and torch's uint8 kernel first repacks 3-channel pixels into 4-channel ones, resizes
 * horizontally over every input row, and returns channels-last pixels that need another copy
 * to become (3, H, W). Here each output row is one vertical pass over the rows it needs (16-bit
 * multiply-adds over contiguous bytes, into an int16 row that stays in L1 cache) and one
 * horizontal pass over that row (a pair of taps of an RGB pixel as one 16-bit multiply-add),
 * written straight into the three planes, mirrored when flipping.
 *
 * No torch headers: the caller passes buffers (bytes, bytearray, numpy arrays, a tensor's numpy
 * view), and the GIL is released while resizing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "resize_kernel.h"

namespace {

/* Pixels of a buffer-protocol object: (height, width, 3) uint8 with 3-byte pixels and rows
 * `row_stride` bytes apart (a numpy view of a crop qualifies), or a (3, height, width) contiguous
 * writable uint8 output. Releases the buffer when it goes. */
struct Buffer {
    Py_buffer view{};
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
};

bool get_pixels(PyObject *object, Buffer &buffer, long *height, long *width, long *row_stride) {
    if (PyObject_GetBuffer(object, &buffer.view, PyBUF_RECORDS_RO) != 0) {
        return false;
    }
    buffer.held = true;
    const Py_buffer &v = buffer.view;
    if (v.itemsize != 1 || (v.format != nullptr && std::strcmp(v.format, "B") != 0) || v.ndim != 3 ||
        v.shape[2] != 3 || v.strides[2] != 1 || v.strides[1] != 3 || v.strides[0] < 3 * v.shape[1] ||
        v.shape[0] < 1 || v.shape[1] < 1) {
        PyErr_SetString(PyExc_ValueError,
                        "pixels must be (height, width, 3) uint8 with 3-byte pixels, rows apart by "
                        "at least 3 * width bytes, and not empty");
        return false;
    }
    *height = v.shape[0];
    *width = v.shape[1];
    *row_stride = v.strides[0];
    return true;
}

bool get_planes(PyObject *object, Buffer &buffer, long *height, long *width) {
    if (PyObject_GetBuffer(object, &buffer.view, PyBUF_RECORDS) != 0) {
        return false;
    }
    buffer.held = true;
    const Py_buffer &v = buffer.view;
    if (v.itemsize != 1 || (v.format != nullptr && std::strcmp(v.format, "B") != 0) || v.ndim != 3 ||
        v.shape[0] != 3 || v.shape[1] < 1 || v.shape[2] < 1 || !PyBuffer_IsContiguous(&v, 'C')) {
        PyErr_SetString(PyExc_ValueError, "out must be a contiguous, writable (3, height, width) uint8 array");
        return false;
    }
    *height = v.shape[1];
    *width = v.shape[2];
    return true;
}

/* A problem with a box, or nullptr. */
const char *box_problem(const Box &box, const char *which) {
    static thread_local char message[160];
    // Every number within 0..2**24 first, so that the sums below cannot overflow.
    const auto within = [](long value, long lowest) { return value >= lowest && value <= kMaxSide; };
    if (!within(box.full_height, 1) || !within(box.full_width, 1) || !within(box.top, 0) ||
        !within(box.left, 0) || !within(box.height, 0) || !within(box.width, 0) ||
        box.top + box.height > box.full_height || box.left + box.width > box.full_width) {
        std::snprintf(message, sizeof message,
                      "%s: a %ldx%ld box at (%ld, %ld) does not fit an image of %ldx%ld (sides up "
                      "to 2**24)", which, box.height, box.width, box.top, box.left,
                      box.full_height, box.full_width);
        return message;
    }
    return nullptr;
}

bool valid_filter(int filter) {
    if (filter == kBilinear || filter == kBicubic) return true;
    PyErr_Format(PyExc_ValueError, "filter must be 0 (bilinear) or 1 (bicubic), got %d", filter);
    return false;
}

PyObject *resize(PyObject *, PyObject *args) {
    PyObject *pixels_object, *out_object;
    Box in{}, box{};
    int flip, filter = kBilinear;
    if (!PyArg_ParseTuple(args, "O(ll)(ll)O(ll)(ll)p|i:resize", &pixels_object, &in.top, &in.left,
                          &in.full_height, &in.full_width, &out_object, &box.top, &box.left,
                          &box.full_height, &box.full_width, &flip, &filter)) {
        return nullptr;
    }
    if (!valid_filter(filter)) {
        return nullptr;
    }
    Buffer pixels, out;
    long row_stride;
    if (!get_pixels(pixels_object, pixels, &in.height, &in.width, &row_stride) ||
        !get_planes(out_object, out, &box.height, &box.width)) {
        return nullptr;
    }
    const char *problem = box_problem(in, "pixels");
    if (problem == nullptr) {
        problem = box_problem(box, "out");
    }
    if (problem != nullptr) {
        PyErr_SetString(PyExc_ValueError, problem);
        return nullptr;
    }
    const ResizeJob job{static_cast<const uint8_t *>(pixels.view.buf), row_stride, in,
                        static_cast<uint8_t *>(out.view.buf), box, flip != 0, filter};
    bool out_of_memory = false, outside = false;
    Py_BEGIN_ALLOW_THREADS
    try {
        outside = !resize_rgb_to_planes(job);
    } catch (const std::bad_alloc &) {
        out_of_memory = true;
    }
    Py_END_ALLOW_THREADS
    if (out_of_memory) {
        return PyErr_NoMemory();
    }
    if (outside) {
        PyErr_SetString(PyExc_ValueError,
                        "pixels do not hold every input pixel out needs (see input_box)");
        return nullptr;
    }
    Py_RETURN_NONE;
}

PyObject *input_box(PyObject *, PyObject *args) {
    Box in{0, 0, 1, 1, 0, 0}, box{};
    int filter = kBilinear;
    if (!PyArg_ParseTuple(args, "(ll)(ll)(ll)(ll)|i:input_box", &in.full_height, &in.full_width,
                          &box.full_height, &box.full_width, &box.top, &box.left, &box.height,
                          &box.width, &filter)) {
        return nullptr;
    }
    if (!valid_filter(filter)) {
        return nullptr;
    }
    const char *problem = box_problem(in, "image_size");
    if (problem == nullptr) {
        problem = box.height < 1 || box.width < 1 ? "out: the box is empty" : box_problem(box, "out");
    }
    if (problem != nullptr) {
        PyErr_SetString(PyExc_ValueError, problem);
        return nullptr;
    }
    long bounds[4];
    try {
        const Taps rows = filter_taps(static_cast<int>(in.full_height),
                                      static_cast<int>(box.full_height), filter);
        const Taps cols = filter_taps(static_cast<int>(in.full_width),
                                      static_cast<int>(box.full_width), filter);
        const auto span = [](const Taps &taps, long first, long count, long *lo, long *size) {
            long begin = taps.start[first], end = taps.start[first] + taps.count[first];
            for (long i = first; i < first + count; ++i) {
                begin = std::min<long>(begin, taps.start[i]);
                end = std::max<long>(end, taps.start[i] + taps.count[i]);
            }
            *lo = begin;
            *size = end - begin;
        };
        span(rows, box.top, box.height, &bounds[0], &bounds[2]);
        span(cols, box.left, box.width, &bounds[1], &bounds[3]);
    } catch (const std::bad_alloc &) {
        return PyErr_NoMemory();
    }
    return Py_BuildValue("(llll)", bounds[0], bounds[1], bounds[2], bounds[3]);
}

/* For tests: the form of the passes this machine runs, and a way to force SSE2. */
PyObject *simd(PyObject *, PyObject *args) {
    const char *level = nullptr;
    if (!PyArg_ParseTuple(args, "|z:_simd", &level)) {
        return nullptr;
    }
    if (level != nullptr) {
        if (std::strcmp(level, "avx2") != 0 && std::strcmp(level, "sse2") != 0) {
            PyErr_Format(PyExc_ValueError, "level must be 'avx2' or 'sse2', got '%s'", level);
            return nullptr;
        }
        use_avx2 = std::strcmp(level, "avx2") == 0;
    }
    return PyUnicode_FromString(avx2_active() ? "avx2" : "sse2");
}

PyMethodDef methods[] = {
    {"_simd", simd, METH_VARARGS,
     "_simd(level=None) -> str\n\nThe instruction set the passes use ('avx2' or 'sse2');\n"
     "with `level`, prefer that one first (for tests)."},
    {"resize", resize, METH_VARARGS,
     "resize(pixels, at, image_size, out, out_at, out_image_size, flip, filter=0) -> None\n\n"
     "`pixels`, (h, w, 3) uint8 RGB (rows may be strided, as in a numpy crop view), are the\n"
     "h x w box at `at` = (top, left) of an image of `image_size` = (height, width). Writes into\n"
     "`out`, a contiguous (3, oh, ow) uint8 array, the oh x ow box at `out_at` of that image\n"
     "resized to `out_image_size` (antialiased; filter 0 bilinear, 1 bicubic), mirrored\n"
     "left-right when `flip`.\n"
     "`pixels` must hold every input pixel that box reads (input_box). Releases the GIL."},
    {"input_box", input_box, METH_VARARGS,
     "input_box(image_size, out_image_size, out_at, out_shape, filter=0)\n"
     "    -> (top, left, height, width)\n\n"
     "The box of input pixels that the out_shape = (height, width) box at out_at of the image\n"
     "resized from image_size to out_image_size reads."},
    {nullptr, nullptr, 0, nullptr},
};

struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "fastpipe._resize",
    "Antialiased bilinear or bicubic resize of RGB crops to planar uint8 (the CPU image path).",
    -1, methods,
};

}  // namespace

extern "C" PyMODINIT_FUNC PyInit__resize(void) { return PyModule_Create(&module); }

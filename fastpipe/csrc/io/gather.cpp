/* fastpipe._io: a batch's pieces copied from files into one buffer, in one call, without the GIL.
 *
 * The readers of fastpipe's sources (fastpipe.data.sources) work out where each field of each
 * sample of a batch lies: a list of pieces, each a file, an offset in that file, a length, and
 * where it goes in the output. This module copies them all while other threads run: loader
 * threads read batches side by side, and no Python runs per piece. Two ways:
 *
 * map_file(path) -> (address, size); unmap(address, size)
 *     The file mapped read-only and shared: the page cache's own pages, so a copy from them is
 *     one memcpy (no system call per piece) and no process holds a private copy.
 * copy_pieces(addresses, limits, offsets, sizes, out, out_offsets) -> None
 *     Piece i is sizes[i] bytes at offsets[i] of the mapping at addresses[i] (limits[i] bytes
 *     long). Raises ValueError, before anything is copied, for a piece outside its mapping or
 *     `out` (the caller checks against the file's size first and names the file).
 * copy_buffers(buffers, size, out, out_offsets) -> None or index
 *     Values another library holds in memory it mapped (an LMDB transaction's values): buffers[i]
 *     (any object with the buffer protocol) to out[out_offsets[i]:], every one `size` bytes.
 *     Returns the index of the first that is None or not `size` bytes, before anything is
 *     copied, so that the caller names that value; else copies all without the GIL, the
 *     buffers held until the copy ends.
 * read_pieces(fds, offsets, sizes, out, out_offsets) -> None or (piece, errno)
 *     For files that cannot be mapped: pread/preadv, pieces that follow each other in the same
 *     file read with one preadv. fds, offsets, sizes, out_offsets: int64 buffers of one length n
 *     (numpy arrays); out: a writable contiguous buffer. Piece i is sizes[i] bytes of fds[i] at
 *     offsets[i], to out[out_offsets[i]:out_offsets[i] + sizes[i]]. Returns None when every
 *     piece was read whole, else the first piece that was not and the errno of the failure (0:
 *     the file ended first), so that the caller names the file. Raises ValueError for pieces
 *     outside `out` or negative sizes and offsets, checked before anything is read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

namespace {

struct Buffer {
    Py_buffer view{};
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
};

bool get_int64s(PyObject *object, const char *name, Buffer &buffer, Py_ssize_t *count) {
    if (PyObject_GetBuffer(object, &buffer.view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        return false;
    }
    buffer.held = true;
    const Py_buffer &v = buffer.view;
    const char *format = v.format == nullptr ? "B" : v.format;
    if (*format == '<' || *format == '=' || *format == '@') ++format;
    if (v.itemsize != 8 || (std::strcmp(format, "q") != 0 && std::strcmp(format, "l") != 0)) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous int64 array", name);
        return false;
    }
    *count = v.len / 8;
    return true;
}

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

/* Reads pieces [first, last) that lie back to back in one file, into their places in `out`.
 * Returns the index of the first piece not read whole (last when all were) and sets *error. */
Py_ssize_t read_run(int fd, const int64_t *offsets, const int64_t *sizes, const int64_t *dest,
                    char *out, Py_ssize_t first, Py_ssize_t last, int *error) {
    Py_ssize_t next = first;
    int64_t done_in_next = 0;  // bytes of piece `next` already read
    while (next < last) {
        struct iovec iov[64];
        int count = 0;
        int64_t want = 0;
        for (Py_ssize_t k = next; k < last && count < 64 && count < IOV_MAX; ++k) {
            int64_t skip = (k == next) ? done_in_next : 0;
            int64_t size = sizes[k] - skip;
            if (size <= 0) continue;
            if (want + size > (int64_t)(SSIZE_MAX / 2)) break;
            iov[count].iov_base = out + dest[k] + skip;
            iov[count].iov_len = (size_t)size;
            ++count;
            want += size;
        }
        if (count == 0) {  // only empty pieces left
            return last;
        }
        ssize_t got = preadv(fd, iov, count, (off_t)(offsets[next] + done_in_next));
        if (got < 0) {
            if (errno == EINTR) continue;
            *error = errno;
            return next;
        }
        if (got == 0) {
            *error = 0;  // the file ended before the piece
            return next;
        }
        // Advance over what was read, piece by piece.
        int64_t left = got;
        while (next < last && left > 0) {
            int64_t rest = sizes[next] - done_in_next;
            if (left >= rest) {
                left -= rest;
                ++next;
                done_in_next = 0;
            } else {
                done_in_next += left;
                left = 0;
            }
        }
        while (next < last && sizes[next] == 0) ++next;
    }
    return last;
}

PyObject *read_pieces(PyObject *, PyObject *args) {
    PyObject *fds_obj, *offsets_obj, *sizes_obj, *out_obj, *dest_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:read_pieces", &fds_obj, &offsets_obj, &sizes_obj, &out_obj,
                          &dest_obj)) {
        return nullptr;
    }
    Buffer fds, offsets, sizes, dest, out;
    Py_ssize_t n = 0, n_offsets = 0, n_sizes = 0, n_dest = 0;
    if (!get_int64s(fds_obj, "fds", fds, &n) ||
        !get_int64s(offsets_obj, "offsets", offsets, &n_offsets) ||
        !get_int64s(sizes_obj, "sizes", sizes, &n_sizes) ||
        !get_int64s(dest_obj, "out_offsets", dest, &n_dest)) {
        return nullptr;
    }
    if (n_offsets != n || n_sizes != n || n_dest != n) {
        PyErr_SetString(PyExc_ValueError,
                        "fds, offsets, sizes and out_offsets must have the same length");
        return nullptr;
    }
    if (PyObject_GetBuffer(out_obj, &out.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
        return nullptr;
    }
    out.held = true;
    const auto *fd = static_cast<const int64_t *>(fds.view.buf);
    const auto *offset = static_cast<const int64_t *>(offsets.view.buf);
    const auto *size = static_cast<const int64_t *>(sizes.view.buf);
    const auto *to = static_cast<const int64_t *>(dest.view.buf);
    const int64_t capacity = out.view.len;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (size[i] < 0 || offset[i] < 0 || to[i] < 0 || fd[i] < 0 || fd[i] > INT_MAX ||
            size[i] > capacity || to[i] > capacity - size[i]) {
            PyErr_Format(PyExc_ValueError,
                         "piece %zd (fd %lld, offset %lld, %lld bytes to %lld) does not fit an "
                         "output of %lld bytes",
                         i, (long long)fd[i], (long long)offset[i], (long long)size[i],
                         (long long)to[i], (long long)capacity);
            return nullptr;
        }
    }
    char *buffer = static_cast<char *>(out.view.buf);
    Py_ssize_t failed = -1;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    while (i < n) {
        // A run: pieces back to back in the same file.
        Py_ssize_t j = i + 1;
        while (j < n && fd[j] == fd[i] && offset[j] == offset[j - 1] + size[j - 1]) ++j;
        Py_ssize_t stop = read_run((int)fd[i], offset, size, to, buffer, i, j, &error);
        if (stop != j) {
            failed = stop;
            break;
        }
        i = j;
    }
    Py_END_ALLOW_THREADS
    if (failed < 0) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(ni)", failed, error);
}

/* map_file(path) -> (address, size): the whole file mapped read-only and shared (the page cache's
 * pages, no copy), its descriptor closed at once (a mapping holds none). unmap(address, size)
 * releases it. An empty file maps to (0, 0). */
PyObject *map_file(PyObject *, PyObject *args) {
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "O&:map_file", PyUnicode_FSConverter, &path_obj)) {
        return nullptr;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    int error = 0;
    void *address = nullptr;
    int64_t size = 0;
    Py_BEGIN_ALLOW_THREADS
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error = errno;
    } else {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            error = errno;
        } else if (st.st_size > 0) {
            size = st.st_size;
            address = mmap(nullptr, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
            if (address == MAP_FAILED) {
                error = errno;
                address = nullptr;
                size = 0;
            }
        }
        close(fd);
    }
    Py_END_ALLOW_THREADS
    if (error != 0) {
        errno = error;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path_obj);
        Py_DECREF(path_obj);
        return nullptr;
    }
    Py_DECREF(path_obj);
    return Py_BuildValue("(KL)", (unsigned long long)(uintptr_t)address, (long long)size);
}

PyObject *unmap(PyObject *, PyObject *args) {
    unsigned long long address;
    long long size;
    if (!PyArg_ParseTuple(args, "KL:unmap", &address, &size)) {
        return nullptr;
    }
    if (address != 0 && size > 0 && munmap((void *)(uintptr_t)address, (size_t)size) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* copy_pieces(addresses, limits, offsets, sizes, out, out_offsets) -> None: piece i is sizes[i]
 * bytes at offsets[i] of the mapping at addresses[i] (limits[i] bytes long), copied to
 * out[out_offsets[i]:]; every piece is checked against its mapping and `out` first, then all are
 * copied without the GIL. */
PyObject *copy_pieces(PyObject *, PyObject *args) {
    PyObject *addr_obj, *limit_obj, *offsets_obj, *sizes_obj, *out_obj, *dest_obj;
    if (!PyArg_ParseTuple(args, "OOOOOO:copy_pieces", &addr_obj, &limit_obj, &offsets_obj,
                          &sizes_obj, &out_obj, &dest_obj)) {
        return nullptr;
    }
    Buffer addresses, limits, offsets, sizes, dest, out;
    Py_ssize_t n = 0, n1 = 0, n2 = 0, n3 = 0, n4 = 0;
    if (!get_int64s(addr_obj, "addresses", addresses, &n) ||
        !get_int64s(limit_obj, "limits", limits, &n1) ||
        !get_int64s(offsets_obj, "offsets", offsets, &n2) ||
        !get_int64s(sizes_obj, "sizes", sizes, &n3) ||
        !get_int64s(dest_obj, "out_offsets", dest, &n4)) {
        return nullptr;
    }
    if (n1 != n || n2 != n || n3 != n || n4 != n) {
        PyErr_SetString(PyExc_ValueError, "every array of copy_pieces must have the same length");
        return nullptr;
    }
    if (PyObject_GetBuffer(out_obj, &out.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
        return nullptr;
    }
    out.held = true;
    const auto *base = static_cast<const int64_t *>(addresses.view.buf);
    const auto *limit = static_cast<const int64_t *>(limits.view.buf);
    const auto *offset = static_cast<const int64_t *>(offsets.view.buf);
    const auto *size = static_cast<const int64_t *>(sizes.view.buf);
    const auto *to = static_cast<const int64_t *>(dest.view.buf);
    const int64_t capacity = out.view.len;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (size[i] < 0 || offset[i] < 0 || to[i] < 0 || size[i] > capacity ||
            to[i] > capacity - size[i] || offset[i] > limit[i] || size[i] > limit[i] - offset[i] ||
            (size[i] > 0 && base[i] == 0)) {
            PyErr_Format(PyExc_ValueError,
                         "piece %zd (%lld bytes at %lld of a %lld-byte mapping, to %lld) does not "
                         "fit its mapping or an output of %lld bytes",
                         i, (long long)size[i], (long long)offset[i], (long long)limit[i],
                         (long long)to[i], (long long)capacity);
            return nullptr;
        }
    }
    char *buffer = static_cast<char *>(out.view.buf);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; ++i) {
        std::memcpy(buffer + to[i], reinterpret_cast<const char *>(base[i]) + offset[i],
                    (size_t)size[i]);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* copy_buffers(buffers, size, out, out_offsets) -> None or index: see the module's comment. */
PyObject *copy_buffers(PyObject *, PyObject *args) {
    PyObject *buffers_obj, *out_obj, *dest_obj;
    long long size;
    if (!PyArg_ParseTuple(args, "OLOO:copy_buffers", &buffers_obj, &size, &out_obj, &dest_obj)) {
        return nullptr;
    }
    PyObject *items = PySequence_Fast(buffers_obj, "copy_buffers: buffers must be a sequence");
    if (items == nullptr) return nullptr;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    Buffer dest, out;
    Py_ssize_t n_dest = 0;
    if (!get_int64s(dest_obj, "out_offsets", dest, &n_dest)) {
        Py_DECREF(items);
        return nullptr;
    }
    if (n_dest != n || size < 0) {
        Py_DECREF(items);
        PyErr_SetString(PyExc_ValueError,
                        "copy_buffers: one out_offset a buffer, and a size of at least 0");
        return nullptr;
    }
    if (PyObject_GetBuffer(out_obj, &out.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
        Py_DECREF(items);
        return nullptr;
    }
    out.held = true;
    const auto *to = static_cast<const int64_t *>(dest.view.buf);
    const int64_t capacity = out.view.len;
    for (Py_ssize_t i = 0; i < n; ++i) {
        if (to[i] < 0 || size > capacity || to[i] > capacity - size) {
            Py_DECREF(items);
            PyErr_Format(PyExc_ValueError,
                         "buffer %zd (%lld bytes to %lld) does not fit an output of %lld bytes", i,
                         size, (long long)to[i], (long long)capacity);
            return nullptr;
        }
    }
    Py_buffer *views = static_cast<Py_buffer *>(PyMem_Calloc(n > 0 ? n : 1, sizeof(Py_buffer)));
    if (views == nullptr) {
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    Py_ssize_t held = 0, wrong = -1;
    for (; held < n; ++held) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, held);
        if (item == Py_None || !PyObject_CheckBuffer(item)) {
            wrong = held;
            break;
        }
        if (PyObject_GetBuffer(item, &views[held], PyBUF_C_CONTIGUOUS) != 0) {
            break;
        }
        if (views[held].len != size) {
            wrong = held;
            ++held;  // this view is held: released below
            break;
        }
    }
    const bool failed = held < n || wrong >= 0;
    if (!failed) {
        char *buffer = static_cast<char *>(out.view.buf);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; ++i) {
            std::memcpy(buffer + to[i], views[i].buf, (size_t)size);
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < held; ++i) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(items);
    if (wrong >= 0) {
        PyErr_Clear();
        return PyLong_FromSsize_t(wrong);
    }
    if (failed) return nullptr;  // PyObject_GetBuffer's error
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"map_file", map_file, METH_VARARGS,
     "map_file(path) -> (address, size): the file mapped read-only and shared, no descriptor "
     "kept."},
    {"unmap", unmap, METH_VARARGS, "unmap(address, size): releases a mapping of map_file."},
    {"copy_pieces", copy_pieces, METH_VARARGS,
     "copy_pieces(addresses, limits, offsets, sizes, out, out_offsets): copies every piece from "
     "its mapping into out, checked first, without the GIL."},
    {"copy_buffers", copy_buffers, METH_VARARGS,
     "copy_buffers(buffers, size, out, out_offsets) -> None or index: copies every buffer (each "
     "size bytes) into out at out_offsets[i] without the GIL; the index of the first that is "
     "None or another size, before anything is copied."},
    {"read_pieces", read_pieces, METH_VARARGS,
     "read_pieces(fds, offsets, sizes, out, out_offsets) -> None or (piece, errno): reads every "
     "piece (sizes[i] bytes of fds[i] at offsets[i]) into out at out_offsets[i], without the "
     "GIL; the first piece not read whole and its errno (0: end of file) on failure."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastpipe._io",
                      "A batch's pieces read from files into one buffer, without the GIL.", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__io(void) { return PyModule_Create(&module); }

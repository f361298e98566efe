/* The transcode encoder of fastpipe._jpeg: a JPEG rewritten losslessly (its DCT coefficients
 * copied, nothing re-quantized) as a baseline JPEG with a restart marker after every MCU, so that
 * a crop decodes only the segments around it (fastpipe.pack's transcode=True). Included by
 * region_decode.cpp after decode_core.h (its error manager and pixel budget).
 */
#pragma once

#include "decode_core.h"

/* A destination that grows a malloc'ed buffer, so that the caller frees it on every path. */
struct growing_destination {
    struct jpeg_destination_mgr pub;
    unsigned char *buffer;
    size_t capacity;
};

static void grow_init(j_compress_ptr cinfo) {
    auto *dest = reinterpret_cast<growing_destination *>(cinfo->dest);
    dest->pub.next_output_byte = dest->buffer;
    dest->pub.free_in_buffer = dest->capacity;
}

static boolean grow_empty(j_compress_ptr cinfo) {
    auto *dest = reinterpret_cast<growing_destination *>(cinfo->dest);
    const size_t used = dest->capacity;
    auto *bigger = static_cast<unsigned char *>(std::realloc(dest->buffer, 2 * used));
    if (bigger == nullptr) {
        ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 0);
    }
    dest->buffer = bigger;
    dest->capacity = 2 * used;
    dest->pub.next_output_byte = bigger + used;
    dest->pub.free_in_buffer = used;
    return TRUE;
}

static void grow_term(j_compress_ptr cinfo) { (void)cinfo; }

/* Rewrites `data` losslessly (coefficients copied, nothing re-quantized) as a baseline JPEG with a
 * restart marker after every MCU and optimized Huffman tables, keeping its EXIF and ICC markers.
 * 0 on success with *out (malloc'ed, the caller frees it) and *out_size. */
static int transcode_for_crops(const unsigned char *data, unsigned long size, unsigned char **out,
                               size_t *out_size, unsigned long long max_pixels,
                               strict_error_mgr *err) {
    jpeg_decompress_struct src;
    jpeg_compress_struct dst;
    /* On the heap: libjpeg changes it between setjmp and longjmp, and the handler frees its buffer. */
    auto *dest = static_cast<growing_destination *>(std::malloc(sizeof(growing_destination)));
    if (dest != nullptr) {
        dest->capacity = size + size / 4 + 4096;
        dest->buffer = static_cast<unsigned char *>(std::malloc(dest->capacity));
    }
    if (dest == nullptr || dest->buffer == nullptr) {
        std::free(dest);
        snprintf(err->message, sizeof err->message, "out of memory");
        return -1;
    }
    begin_error_handling(&src, err);
    dst.err = &err->pub;
    if (setjmp(err->jump)) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        std::free(dest->buffer);
        std::free(dest);
        return -1;
    }
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
    jpeg_mem_src(&src, data, size);
    jpeg_save_markers(&src, JPEG_APP0 + 1, 0xFFFF);
    jpeg_save_markers(&src, JPEG_APP0 + 2, 0xFFFF);
    jpeg_read_header(&src, TRUE);
    if (over_budget(src.image_height, src.image_width, max_pixels, err->message,
                    sizeof err->message)) {
        longjmp(err->jump, 1);
    }
    if (src.data_precision != 8) {
        snprintf(err->message, sizeof err->message, "%d-bit samples: only 8-bit JPEGs are rewritten",
                 src.data_precision);
        longjmp(err->jump, 1);
    }
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
    dest->pub.init_destination = grow_init;
    dest->pub.empty_output_buffer = grow_empty;
    dest->pub.term_destination = grow_term;
    dst.dest = &dest->pub;
    jpeg_copy_critical_parameters(&src, &dst);
    dst.optimize_coding = TRUE;
    dst.restart_interval = 1;
    jpeg_write_coefficients(&dst, coefficients);
    for (jpeg_saved_marker_ptr m = src.marker_list; m != nullptr; m = m->next) {
        jpeg_write_marker(&dst, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&dst);
    *out_size = dest->capacity - dest->pub.free_in_buffer;
    jpeg_finish_decompress(&src);
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    *out = dest->buffer;
    std::free(dest);
    return 0;
}

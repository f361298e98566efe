/* The decode core of fastpipe._jpeg: libjpeg-turbo set up to fail on any warning, the pixel
 * budget, and the decode of a rectangle at a reduced DCT scale (configure, then decode_region),
 * with the file first cut down to the restart segments the rectangle needs where it has them
 * (prepare). Runs without the GIL; the bindings (region_decode.cpp) hold it only to read their
 * arguments and build their results. Included by region_decode.cpp alone: one translation unit,
 * as the other headers of this folder.
 */
#pragma once

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

/* cinfo->entropy, ->inputctl and ->marker are libjpeg's module tables (jpegint.h), which
 * huffman_decoder.h swaps and calls. */
#define JPEG_INTERNALS
#include <jpeglib.h>  // libjpeg-turbo's own header wraps itself in extern "C"
#include <jerror.h>

#include "huffman_decoder.h"
#include "restart_segments.h"
#include "train_plan.h"  // frame_size: the pixel budget checked from the frame header

/* Rows one jpeg_read_scanlines call is asked for (libjpeg's preferred batch, at most 16). */
static JDIMENSION max_batch_rows(const jpeg_decompress_struct *cinfo) {
    const JDIMENSION batch = cinfo->rec_outbuf_height > 0 ? (JDIMENSION)cinfo->rec_outbuf_height : 1;
    return batch < 16 ? batch : 16;
}

struct strict_error_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

[[noreturn]] static void fail(j_common_ptr cinfo) {
    auto *err = reinterpret_cast<strict_error_mgr *>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void fail_on_warning(j_common_ptr cinfo, int msg_level) {
    if (msg_level < 0) {
        fail(cinfo);
    }
}

/* The pixel budget's default: Pillow's limit (2 * Image.MAX_IMAGE_PIXELS, where it raises
 * DecompressionBombError), which fits real photos; fastpipe.data.max_image_pixels() passes
 * its own value to every call. */
constexpr unsigned long long kDefaultMaxPixels = 178956970ULL;

/* The message for an image whose frame declares more pixels than `max_pixels`, checked from the
 * frame header before anything the size decides is allocated. */
static bool over_budget(unsigned long long height, unsigned long long width,
                        unsigned long long max_pixels, char *message, size_t size) {
    if (height * width <= max_pixels) {
        return false;
    }
    snprintf(message, size,
             "the frame declares %llux%llu pixels, more than the pixel budget of %llu "
             "(fastpipe.data.set_max_image_pixels): a decompression bomb, or raise the budget",
             height, width, max_pixels);
    return true;
}

struct region_request {
    const unsigned char *data;
    unsigned long size;
    unsigned long long max_pixels;
    int scale_denom;
    unsigned int top, left, height, width;
    int fast_upsample;
    /* Set by the header checks: the bytes `out` needs (rows of the region widened to whole
     * iMCUs, plus the rows libjpeg may write past the last one in its last call). */
    size_t capacity;
    unsigned char *out; /* capacity bytes; RGB rows of row_pixels pixels, row-major */
    /* Set by the decode: the region's rows in `out` are row_pixels wide, its columns start at
     * `column` of each. */
    unsigned int row_pixels, column;
};

static void begin_error_handling(jpeg_decompress_struct *cinfo, strict_error_mgr *err) {
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = fail;
    err->pub.emit_message = fail_on_warning;
    err->message[0] = '\0';
}

/* Reads the header and sets the decode parameters; -1 with a message for images whose crop could
 * differ from the crop of the whole decode, so the caller decodes them whole. libjpeg errors
 * longjmp to the caller's setjmp. */
static int configure(jpeg_decompress_struct *cinfo, const region_request *req, strict_error_mgr *err) {
    jpeg_mem_src(cinfo, req->data, req->size);
    jpeg_read_header(cinfo, TRUE);
    if (over_budget(cinfo->image_height, cinfo->image_width, req->max_pixels, err->message,
                    sizeof err->message)) {
        return -1;
    }
    if (cinfo->jpeg_color_space != JCS_YCbCr && cinfo->jpeg_color_space != JCS_GRAYSCALE &&
        cinfo->jpeg_color_space != JCS_RGB) {
        snprintf(err->message, sizeof err->message,
                 "colour space %d is not YCbCr, RGB or greyscale", (int)cinfo->jpeg_color_space);
        return -1;
    }
    if (!req->fast_upsample) {
        /* Smooth upsampling of chroma subsampled more than 2x along an axis gives wrong pixels
         * inside a cropped column range (found with 4x2 and 2x4 luma sampling at 1/2 and 1/4
         * scale, libjpeg-turbo 2.1.5); replicated chroma (fast_upsample) matches. */
        for (int ci = 0; ci < cinfo->num_components; ++ci) {
            const jpeg_component_info &comp = cinfo->comp_info[ci];
            if (comp.h_samp_factor < 1 || comp.v_samp_factor < 1 ||
                cinfo->max_h_samp_factor > 2 * comp.h_samp_factor ||
                cinfo->max_v_samp_factor > 2 * comp.v_samp_factor) {
                snprintf(err->message, sizeof err->message,
                         "sampling factors %dx%d against %dx%d: smooth upsampling needs the whole "
                         "image", comp.h_samp_factor, comp.v_samp_factor, cinfo->max_h_samp_factor,
                         cinfo->max_v_samp_factor);
                return -1;
            }
        }
    }
    cinfo->out_color_space = JCS_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)req->scale_denom;
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = req->fast_upsample ? FALSE : TRUE;
    jpeg_calc_output_dimensions(cinfo);
    if (req->top + req->height > cinfo->output_height || req->left + req->width > cinfo->output_width) {
        snprintf(err->message, sizeof err->message,
                 "region %ux%u at (%u, %u) exceeds the decoded image, %ux%u at 1/%d scale",
                 req->height, req->width, req->top, req->left, cinfo->output_height,
                 cinfo->output_width, req->scale_denom);
        return -1;
    }
    return 0;
}

/* The columns [*xoffset, +*width) handed to jpeg_crop_scanline for the region's columns: at least
 * two iMCU columns wide, or the whole width. libjpeg-turbo 2.1.5's jpeg_crop_scanline re-runs
 * jinit_upsampler when a crop leaves a component fewer than 2 samples wide; with the merged
 * upsampler (replicated 4:2:0 or 4:2:2 chroma) that writes past libjpeg's merged-upsampler
 * object (jdsample.c:462, and wild reads in h2v2_merged_upsample_internal on corrupt data).
 * Two iMCU columns give every component at least 2 samples; the caller's columns lie inside. */
static void crop_columns(const jpeg_decompress_struct *cinfo, const region_request *req,
                         JDIMENSION *xoffset, JDIMENSION *width) {
    const JDIMENSION align = cinfo->num_components == 1 && cinfo->comps_in_scan == 1
                                 ? (JDIMENSION)cinfo->min_DCT_scaled_size
                                 : (JDIMENSION)(cinfo->min_DCT_scaled_size * cinfo->max_h_samp_factor);
    const JDIMENSION narrowest = 2 * align;
    *xoffset = req->left;
    *width = req->width;
    if (*width >= narrowest) {
        return;
    }
    if (narrowest >= cinfo->output_width) {
        *xoffset = 0;
        *width = cinfo->output_width;
        return;
    }
    *width = narrowest;
    if (*xoffset + narrowest > cinfo->output_width) {
        *xoffset = cinfo->output_width - narrowest;
    }
}

/* An upper bound of the region's width once widened (crop_columns) and once jpeg_crop_scanline
 * has widened it to whole iMCUs (at most max_h_samp_factor * 8 pixels, at any scale, each side),
 * and of the rows written. */
static size_t region_capacity(const jpeg_decompress_struct *cinfo, const region_request *req) {
    JDIMENSION xoffset, columns;
    crop_columns(cinfo, req, &xoffset, &columns);
    const size_t wide = (size_t)columns + 16 * (size_t)cinfo->max_h_samp_factor;
    const size_t row_pixels = wide < cinfo->output_width ? wide : cinfo->output_width;
    return (req->height + max_batch_rows(cinfo)) * row_pixels * 3;
}

/* 0 on success; otherwise -1 with a message in err->message. Runs without the GIL. With
 * req->out null it stops after the header checks and sets req->capacity, so the caller can refuse
 * a region before allocating its buffer (reading the header again costs a few microseconds). */
static int decode_region(region_request *req, strict_error_mgr *err) {
    jpeg_decompress_struct cinfo;
    begin_error_handling(&cinfo, err);
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    const int status = configure(&cinfo, req, err);
    if (status != 0 || req->out == nullptr) {
        req->capacity = status == 0 ? region_capacity(&cinfo, req) : 0;
        jpeg_destroy_decompress(&cinfo);
        return status;
    }
    jpeg_start_decompress(&cinfo);
    fast_huffman::install(&cinfo);
    if (cinfo.progressive_mode && cinfo.coef_bits != nullptr) {
        /* A progressive file may end before its last scans (valid, no warning). libjpeg then
         * smooths the missing detail from neighbouring blocks, which a crop does not have. The
         * whole file was read by jpeg_start_decompress, so coef_bits is final: 0 is complete. */
        for (int ci = 0; ci < cinfo.num_components; ++ci) {
            for (int k = 0; k < DCTSIZE2; ++k) {
                if (cinfo.coef_bits[ci][k] != 0) {
                    snprintf(err->message, sizeof err->message,
                             "progressive JPEG without all its scans: decode it whole");
                    jpeg_destroy_decompress(&cinfo);
                    return -1;
                }
            }
        }
    }
    /* Widens the column range to whole iMCUs; the rows then hold columns [xoffset, +width). */
    JDIMENSION xoffset, width;
    crop_columns(&cinfo, req, &xoffset, &width);
    jpeg_crop_scanline(&cinfo, &xoffset, &width);
    if (req->top > 0) {
        jpeg_skip_scanlines(&cinfo, req->top);
    }
    /* libjpeg writes the rows straight into the caller's buffer, widened to whole iMCUs: the
     * caller reads the region as a strided view, so nothing is copied. */
    const JDIMENSION batch = max_batch_rows(&cinfo);
    const size_t stride = (size_t)width * 3;
    if ((req->height + batch) * stride > req->capacity) {
        snprintf(err->message, sizeof err->message,
                 "internal error: the widened region (%u columns) exceeds its buffer", width);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    req->row_pixels = width;
    req->column = req->left - xoffset;
    JSAMPROW rows[16];
    const JDIMENSION bottom = req->top + req->height;
    while (cinfo.output_scanline < bottom) {
        const JDIMENSION first = cinfo.output_scanline;
        for (JDIMENSION i = 0; i < batch; ++i) {
            rows[i] = req->out + (size_t)(first - req->top + i) * stride;
        }
        jpeg_read_scanlines(&cinfo, rows, batch);
    }
    /* A baseline JPEG's rows below the region are never entropy-decoded (a progressive one was
     * entropy-decoded whole by jpeg_start_decompress). */
    jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* Without the GIL: for a file with a restart segment per MCU, points `req` at a JPEG of only the
 * segments around the rectangle (kept in `segments`); then reads the header, so that a rectangle
 * that does not fit is refused before its buffer is allocated, and sets req->capacity. */
static int prepare(region_request *req, std::vector<unsigned char> &segments, strict_error_mgr *err) {
    long height = 0, width = 0;
    if (train_plan::frame_size(req->data, req->size, &height, &width) &&
        over_budget((unsigned long long)height, (unsigned long long)width, req->max_pixels,
                    err->message, sizeof err->message)) {
        return -1;
    }
    try {
        segments = segmented_crop(req->data, req->size, req->scale_denom, &req->top, &req->left,
                                  req->height, req->width, req->fast_upsample ? 0u : 1u);
    } catch (const std::bad_alloc &) {
        segments.clear();
    }
    if (!segments.empty()) {
        req->data = segments.data();
        req->size = (unsigned long)segments.size();
    }
    return decode_region(req, err);  /* req->out is null: the header checks only */
}

/* Test helper: encodes raw RGB from stdin as a baseline JPEG with the luma sampling factors given
 * on the command line (chroma 1x1), which PIL cannot write. Built and run by tests/jpeg/test_region.py.
 * usage: jpeg_sampling_encoder WIDTH HEIGHT H_SAMP V_SAMP [arith] < rgb > jpeg
 * ("arith": arithmetic coding instead of Huffman, which PIL cannot write either) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "arith") == 0)) {
        fprintf(stderr, "usage: %s WIDTH HEIGHT H_SAMP V_SAMP [arith] < rgb > jpeg\n", argv[0]);
        return 2;
    }
    const int width = atoi(argv[1]), height = atoi(argv[2]);
    unsigned char *rgb = malloc((size_t)width * height * 3);
    if (rgb == NULL || fread(rgb, 3, (size_t)width * height, stdin) != (size_t)width * height) {
        fprintf(stderr, "expected %d x %d x 3 bytes on stdin\n", width, height);
        return 2;
    }
    struct jpeg_compress_struct cinfo;
    struct jpeg_error_mgr err;
    cinfo.err = jpeg_std_error(&err);
    jpeg_create_compress(&cinfo);
    jpeg_stdio_dest(&cinfo, stdout);
    cinfo.image_width = width;
    cinfo.image_height = height;
    cinfo.input_components = 3;
    cinfo.in_color_space = JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, 90, TRUE);
    cinfo.comp_info[0].h_samp_factor = atoi(argv[3]);
    cinfo.comp_info[0].v_samp_factor = atoi(argv[4]);
    for (int c = 1; c < 3; ++c) {
        cinfo.comp_info[c].h_samp_factor = 1;
        cinfo.comp_info[c].v_samp_factor = 1;
    }
    cinfo.arith_code = argc == 6 ? TRUE : FALSE;
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = rgb + (size_t)cinfo.next_scanline * width * 3;
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    free(rgb);
    return 0;
}

// jpeg_reference.h: a JPEG decoded at a DCT scale by libjpeg-turbo and by the DC path
// (data/jpeg_eighth.c), for test_jpeg_eighth.c and the image fuzz target, which hold the
// DC path to libjpeg-turbo's bytes. Include after <setjmp.h>, <stdio.h> and <jpeglib.h>.
#ifndef TESTS_JPEG_REFERENCE_H
#define TESTS_JPEG_REFERENCE_H

#include <stdbool.h>
#include <string.h>

#include "../data/jpeg_eighth.h"

typedef struct JpegFail {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
} JpegFail;

static void jpeg_reference_exit(j_common_ptr c) { longjmp(((JpegFail *)c->err)->jump, 1); }
static void jpeg_reference_warning(j_common_ptr c, int level) {
    if (level < 0) jpeg_reference_exit(c);  // a warning is a damaged file, as image.c has it
}

// The JPEG in data decoded at scale/8 to C channels (1: gray, 3: RGB) into out (room for
// out_max bytes) by libjpeg-turbo (eighth = false) or by the DC path: 0, JPEG_EIGHTH_DECLINED,
// -1 (out of memory, or the output larger than out_max), or -2 for an error or a warning of
// libjpeg-turbo (the header's alone for the DC path). *w, *h: the output size.
static int jpeg_reference_decode(const uint8_t *data, size_t size, int C, int scale, bool eighth, uint8_t *out,
                                 size_t out_max, int *w, int *h) {
    struct jpeg_decompress_struct d;
    JpegFail f;
    d.err = jpeg_std_error(&f.mgr);
    f.mgr.error_exit = jpeg_reference_exit, f.mgr.emit_message = jpeg_reference_warning;
    if (setjmp(f.jump)) {
        jpeg_destroy_decompress(&d);
        return -2;
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, data, (unsigned long)size);
    jpeg_read_header(&d, TRUE);
    d.out_color_space = C == 1 ? JCS_GRAYSCALE : JCS_RGB;
    d.scale_num = (unsigned)scale, d.scale_denom = 8;
    jpeg_calc_output_dimensions(&d);
    *w = (int)d.output_width, *h = (int)d.output_height;
    int rc;
    if ((size_t)d.output_width * d.output_height * (size_t)C > out_max) {
        rc = -1;
    } else if (eighth) {
        rc = jpeg_eighth_decode(&d, out);
    } else {
        jpeg_start_decompress(&d);
        while (d.output_scanline < d.output_height) {
            JSAMPROW r = out + (size_t)d.output_scanline * d.output_width * (size_t)C;
            jpeg_read_scanlines(&d, &r, 1);
        }
        jpeg_finish_decompress(&d);
        rc = 0;
    }
    jpeg_destroy_decompress(&d);
    return rc;
}

// Both decodes at 1/8 scale into a and b (out_max bytes each): whether the DC path holds to
// libjpeg-turbo: it accepts only files libjpeg-turbo decodes without a warning, and gives
// their bytes. *rc: the DC path's return code; *clean: libjpeg-turbo decoded it cleanly.
static bool jpeg_reference_agree(const uint8_t *data, size_t size, int C, uint8_t *a, uint8_t *b, size_t out_max,
                                 int *rc, bool *clean) {
    int w, h, w8, h8;
    const int ref = jpeg_reference_decode(data, size, C, 1, false, a, out_max, &w, &h);
    *clean = ref == 0;
    *rc = jpeg_reference_decode(data, size, C, 1, true, b, out_max, &w8, &h8);
    return *rc != 0 || (ref == 0 && w8 == w && h8 == h && !memcmp(a, b, (size_t)w * h * (size_t)C));
}

#endif
